"""The one check of single fields: each field's type, and the bounds declared beside it.

A config dataclass declares a field's bounds in its annotation with `annotated_types`
(``learning_rate: Annotated[float, Gt(0)]``, ``gamma: Annotated[float, Interval(ge=0,
le=1)]``, ``num_workers: Annotated[int, Ge(1)] | None``); `field_errors` walks a config and
its sections and names every field whose value is not of its type (`typeguard.check_type`),
is NaN or infinite, or lies outside its bounds. Rules between fields are
`gmi_drl.config.rules`'.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import types
import typing
from typing import Annotated, Literal, NamedTuple, Union

from annotated_types import BaseMetadata, Ge, GroupedMetadata, Gt, Le, Lt
from typeguard import CollectionCheckStrategy, TypeCheckError, check_type

_INF_MEANS_OFF = {"max_grad_norm"}
"""float fields that take ``inf`` for "no bound", whatever their default (so do those whose
default is ``inf``)"""


_BOUNDS = {Gt: ">", Ge: ">=", Lt: "<", Le: "<="}
"""the bounds of `annotated_types` that fields declare (an `Interval` is two of them)"""

_TESTS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


class FieldError(NamedTuple):
    """One field that does not hold on its own."""

    field: str
    """its dotted name, e.g. ``algo.learning_rate``"""
    kind: Literal["type", "finite", "bound"]
    """type: not of its annotated type (the rules cannot compare it); finite: a NaN or an
    infinite float; bound: outside the bounds declared on it"""
    message: str
    """e.g. ``algo.learning_rate=0.0 must be > 0``"""


def field_errors(obj, prefix: str = "") -> list[FieldError]:
    """Every field of the config dataclass ``obj``, and of its sections (fields that hold a
    dataclass, of whatever class: `gmi_drl.algos.ALGORITHMS` may grow at run time; named
    ``section.field``, a trailing ``_`` dropped: ``async_`` is ``async``), that does not hold
    on its own, in declaration order: a value not of its annotation (``seed=True must be an
    int``; a bool is no number here), a NaN or infinite float (``+inf`` only where it means
    "off": `_INF_MEANS_OFF`, and fields whose default is ``inf``), a value outside its
    declared bounds (``algo.gamma=1.5 must be in [0, 1]``); what a config file or the Python
    API can get wrong and the command line mostly cannot.

    Raises:
        TypeError: a field declares an `annotated_types` constraint other than a bound
            (`Gt`, `Ge`, `Lt`, `Le`, `Interval`).
    """
    errors = []
    hints = typing.get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        value, hint, name = getattr(obj, f.name), hints[f.name], prefix + f.name.rstrip("_")
        if dataclasses.is_dataclass(value):
            errors += field_errors(value, f"{name}.")
        elif not _fits(value, hint):
            errors.append(FieldError(name, "type", f"{name}={value!r} must be {_describe(hint)}"))
        elif isinstance(value, float) and not math.isfinite(value) and not (
                value > 0 and (f.name in _INF_MEANS_OFF or (
                    isinstance(f.default, float) and math.isinf(f.default)))):
            errors.append(FieldError(name, "finite", f"{name}={value!r} must be a finite number"))
        elif value is not None and not _within(value, bounds := _bounds(hint)):
            optional = type(None) in typing.get_args(hint)
            errors.append(FieldError(name, "bound", f"{name}={value!r} must be "
                                     f"{_bounds_text(bounds)}{' or None' if optional else ''}"))
    return errors


def _fits(value, hint) -> bool:
    """Whether ``value`` is of type ``hint`` (each item of a list), a bool only where ``hint``
    takes one (Python's bool is an int, and typeguard takes it for one)."""
    try:
        check_type(value, hint, collection_check_strategy=CollectionCheckStrategy.ALL_ITEMS)
    except TypeCheckError:
        return False
    return not isinstance(value, bool) or bool in _members(hint)


def _members(hint) -> set:
    """The types a value of ``hint`` may have: the members of a union, without `Annotated`."""
    if typing.get_origin(hint) is Annotated:
        return _members(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (Union, types.UnionType):
        return set().union(*map(_members, typing.get_args(hint)))
    return {hint}


def _bounds(hint) -> list[tuple[str, object]]:
    """The `annotated_types` bounds of ``hint`` (``Annotated[X, ...]``, or a union with such a
    member) as ``(symbol, bound)``: ``Interval(gt=0, le=1)`` is ``[(">", 0), ("<=", 1)]``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return [b for arg in typing.get_args(hint) for b in _bounds(arg)]
    found = []
    for meta in getattr(hint, "__metadata__", ()):  # (tyro's markers are no bounds)
        parts = list(meta) if isinstance(meta, GroupedMetadata) else [meta]
        found += [b for b in parts if isinstance(b, BaseMetadata)]
    unknown = [b for b in found if type(b) not in _BOUNDS]
    if unknown:
        raise TypeError(f"{unknown} declared on {hint}: gmi_drl.config.bounds checks the bounds "
                        "Gt, Ge, Lt, Le and Interval only")
    return [(_BOUNDS[type(b)], getattr(b, type(b).__name__.lower())) for b in found]


def _within(value, bounds: list[tuple[str, object]]) -> bool:
    return all(_TESTS[symbol](value, bound) for symbol, bound in bounds)


def _bounds_text(bounds: list[tuple[str, object]]) -> str:
    """``> 0``, ``>= 1``, ``in [0, 1]``, ``in (0, 1]``."""
    lower = [(s, b) for s, b in bounds if s.startswith(">")]
    upper = [(s, b) for s, b in bounds if s.startswith("<")]
    if len(lower) == len(upper) == 1:
        (lo_symbol, lo), (hi_symbol, hi) = lower[0], upper[0]
        return (f"in {'(' if lo_symbol == '>' else '['}{lo}, "
                f"{hi}{')' if hi_symbol == '<' else ']'}")
    return " and ".join(f"{symbol} {bound}" for symbol, bound in bounds)


def _describe(hint) -> str:
    """What a value of ``hint`` is, in words: ``an int or null``, ``one of ['a', 'b']``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return _describe(args[0])
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin in (tuple, list) and args:
        plain = {bool: "booleans", int: "ints", float: "numbers", str: "strings"}
        return (f"a list of {plain[args[0]]}" if args[0] in plain
                else f"a list, each {_describe(args[0])}")
    return {bool: "true or false", int: "an int", float: "a number", str: "a string",
            type(None): "null"}.get(hint, getattr(hint, "__name__", str(hint)))
