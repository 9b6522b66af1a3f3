"""The package's layers (docs/architecture.md §3, DESIGN's table): a module imports only modules
of its own layer or of layers below, and no modules import each other in a circle. Imports
inside functions count, and so does a string that names a module to import (a fork server's
preload list, a ``"module:function"`` target)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gmi_drl"

LAYERS = [
    ("base", {"gmi_drl", "files", "errors", "blocks", "checkpoint", "interrupts"}),
    ("telemetry", {"telemetry"}),
    ("engines, models, communication", {"envs", "models", "comm"}),
    ("optimisation, rollouts", {"optim", "rollout"}),
    ("algorithms", {"algos"}),
    ("config", {"config"}),
    ("GMIs", {"gmi"}),
    ("Ray", {"cluster"}),
    ("runner", {"runner"}),
    ("training, evaluation", {"train", "evaluate", "sweep", "serving"}),
    ("tune (Algorithm 2)", {"tune"}),
    ("command line", {"cli"}),
]
RANK = {part: rank for rank, (_, parts) in enumerate(LAYERS) for part in parts}
NAMED = re.compile(r"^(gmi_drl(?:\.\w+)+)(?::\w+)?$")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The gmi_drl modules ``name`` imports: ``from a.b import c`` is ``a.b.c`` where that is a
    module (a sibling submodule, not the package's ``__init__``), else ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in MODULES:
                    found.add(sub)
                elif not _extension(sub):  # (a compiled module has no imports to follow)
                    found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if (m := NAMED.match(node.value)) and m.group(1) in MODULES:
                found.add(m.group(1))
    return {m for m in found if m in MODULES and m != name}


def _extension(module: str) -> bool:
    """Whether ``module`` is a compiled extension module of the package (built in place)."""
    *package, name = module.split(".")
    return any(PACKAGE.parent.joinpath(*package).glob(f"{name}.*.so"))


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return RANK["gmi_drl" if len(parts) == 1 else parts[1]]


def test_every_module_belongs_to_a_layer():
    assert not [m for m in MODULES if (m.split(".") + ["gmi_drl"])[1] not in RANK
                and len(m.split(".")) > 1]


def test_no_module_imports_from_a_layer_above_its_own():
    upward = sorted(f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
                    for a, targets in GRAPH.items() for b in targets if _layer(b) > _layer(a))
    assert not upward, "\n".join(upward)


def _circles() -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                on.discard(w)
                comp.append(w)
            on.discard(v)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_no_modules_import_each_other_in_a_circle():
    assert not _circles()


@pytest.mark.parametrize("edge", [("gmi_drl.comm.reduction", "gmi_drl.runner.placement"),
                                  ("gmi_drl.runner.placement", "gmi_drl.runner.loop")])
def test_the_checks_see_an_upward_import_and_a_circle(edge):
    """The checks can fail: an arrow added from a low module to a high one is caught by one,
    closing a circle by the other."""
    a, b = edge
    GRAPH[a].add(b)
    try:
        upward = _layer(b) > _layer(a)
        with pytest.raises(AssertionError):
            if upward:
                test_no_module_imports_from_a_layer_above_its_own()
            else:
                GRAPH[b].add(a)
                test_no_modules_import_each_other_in_a_circle()
    finally:
        GRAPH[a].discard(b)
        GRAPH[b].discard(a)


def test_the_runner_reaches_algorithms_only_through_their_protocol():
    """`gmi_drl.algos` (its registry and builders) and `gmi_drl.algos.base` (the protocols):
    what runs algorithms (the GMIs, the runner, training, tune) imports no algorithm's module
    (`gmi_drl.config`, the schema, holds their configs)."""
    allowed = {"gmi_drl.algos", "gmi_drl.algos.base"}
    runs = {"gmi", "cluster", "runner", "train", "tune"}
    direct = sorted(f"{a} imports {b}" for a, targets in GRAPH.items() for b in targets
                    if b.startswith("gmi_drl.algos.") and b not in allowed
                    and (a.split(".") + [""])[1] in runs)
    assert not direct, "\n".join(direct)
