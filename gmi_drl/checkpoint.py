"""Checkpoint files: atomic writes, the last few kept, safe loads (``weights_only=True``), clear
errors.

A checkpoint is a dict of tensors and plain data: ``format``, ``version``, ``config`` (the
resolved `TrainConfig` as a dict), ``global_step``, ``iteration``, and one entry per stateful
component: ``algo`` (the algorithm's `state_dict`, its weights under ``modules``),
``obs_norm``, ``reward_norm``, ``action_rng``, ``rng`` and the episode history.

A run keeps its checkpoints as ``RUN_DIR/checkpoints/iteration-<k>.pt`` (``k``: iterations
done), the newest ``checkpoint.keep`` of them. Loading a run directory takes the newest one that
loads: a corrupt newest file (a full disk, a copy cut short) costs the iterations since the one
before it, not the run.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from gmi_drl.files import replace_atomically

FORMAT = "gmi-drl-checkpoint"
VERSION = 2
_NAME = re.compile(r"iteration-(\d+)\.pt")

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, of another format, or does not fit the model."""


def checkpoint_name(iteration: int) -> str:
    """The file name of the checkpoint taken after ``iteration`` iterations."""
    return f"iteration-{iteration:07d}.pt"


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a temporary file in the same directory, flushed to
    disk, then renamed over ``path`` (a crash leaves either the old or the new file, never half)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, lambda tmp: torch.save({"format": FORMAT, "version": VERSION,
                                                     **state}, tmp), fsync=True)


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory of a run directory (``RUN_DIR/checkpoints``), or ``path`` itself
    when it holds no ``checkpoints`` folder."""
    path = Path(path)
    return path / "checkpoints" if (path / "checkpoints").is_dir() else path


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory that holds checkpoint file ``checkpoint`` (``RUN/checkpoints/*.pt``),
    or ``None`` for a file outside one (a checkpoint copied elsewhere)."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def checkpoint_iteration(path: Path) -> int:
    """The iterations behind checkpoint file ``path``, from its name (``iteration-*.pt``).

    Raises:
        ValueError: a name `list_checkpoints` would not list.
    """
    m = _NAME.fullmatch(path.name)
    if m is None:
        raise ValueError(f"{path.name} is not named as a checkpoint (iteration-NNNNNNN.pt)")
    return int(m[1])


def list_checkpoints(path: str | Path) -> list[Path]:
    """The checkpoints of a run (or checkpoint) directory, newest (most iterations) first."""
    directory = checkpoint_dir(path)
    if not directory.is_dir():
        return []
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def prune_checkpoints(path: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of a run directory, and the temporary
    files of writes that a killed process left (``.iteration-*.pt.<pid>.tmp`` of other
    processes); returns the deleted checkpoints."""
    old = list_checkpoints(path)[keep:]
    for p in old:
        p.unlink(missing_ok=True)
    directory = checkpoint_dir(path)
    if directory.is_dir():
        for tmp in directory.glob(".iteration-*.pt.*.tmp"):
            if not tmp.name.endswith(f".{os.getpid()}.tmp"):
                tmp.unlink(missing_ok=True)
    return old


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory.

    Raises:
        CheckpointError: neither exists.
    """
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        found = list_checkpoints(path)
        if found:
            return found[0]
        raise CheckpointError(f"no checkpoint in {checkpoint_dir(path)} (no iteration-*.pt): "
                              f"{path} is no run directory that wrote one")
    raise CheckpointError(f"no checkpoint at {path} (give a run directory or a .pt file)")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file, or the newest loadable checkpoint of a run directory (see
    `find_loadable`). ``torch.load(weights_only=True)``: no code in a file is executed.

    Raises:
        CheckpointError: no checkpoint, or every one is truncated/corrupt, not a gmi-drl
            checkpoint, or of an unsupported version.
    """
    return find_loadable(path)[1]


def find_loadable(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(file, state)``: ``path`` itself when it is a file, else the newest checkpoint of the
    run directory ``path`` that loads (an older one, with a warning, when newer ones are
    corrupt).

    Raises:
        CheckpointError: as `load_checkpoint`.
    """
    path = Path(path)
    if not path.is_dir():
        file = resolve_checkpoint(path)
        try:
            return file, _load_file(file)
        except FileNotFoundError:
            raise CheckpointError(f"{file} is gone (a run pruned it: --checkpoint.keep); give "
                                  "the run directory, which names its newest") from None
    for _ in range(10):  # a run still training prunes files while they are listed or read
        try:
            return _newest_loadable(path)
        except FileNotFoundError:
            continue
    raise CheckpointError(f"{checkpoint_dir(path)}: its checkpoints kept vanishing while they "
                          "were read (a run pruning them faster); try again")


def _newest_loadable(path: Path) -> tuple[Path, dict[str, Any]]:
    """`find_loadable` for a run directory, once.

    Raises:
        FileNotFoundError: a listed file vanished before it was read. CheckpointError: as
            `load_checkpoint`.
    """
    errors = []
    for candidate in list_checkpoints(path) or [resolve_checkpoint(path)]:
        try:
            state = _load_file(candidate)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        if errors:
            log.warning("%s; continuing from %s instead", "; ".join(errors), candidate.name)
        return candidate, state
    if len(errors) == 1:
        raise CheckpointError(f"{errors[0]}; it is the run's only checkpoint, so the run cannot "
                              "be continued or evaluated (start a new one in another directory)")
    raise CheckpointError(f"none of the {len(errors)} checkpoints in {checkpoint_dir(path)} "
                          f"loads, so this run cannot be continued (start a new one in another "
                          f"directory); the newest: {errors[0]}")


def _load_file(path: Path) -> dict[str, Any]:
    hint = ("" if path.suffix == ".pt" else "; a checkpoint is a .pt file: give the run "
            "directory, or one of its checkpoints/iteration-*.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:  # pruned by the run that is training while this reads it
        raise
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e):  # a pickled class: refused by weights_only
            raise CheckpointError(f"{path} is not a gmi-drl checkpoint: it holds more than "
                                  "tensors and plain data, and is not loaded, as that could run "
                                  "code") from None
        raise CheckpointError(f"{path} is corrupt or not a torch checkpoint{hint}") from None
    except EOFError:
        raise CheckpointError(f"{path} is empty or cut short{hint}") from None
    except Exception:  # noqa: BLE001 - arbitrary bytes fail the unpickler in arbitrary ways
        raise CheckpointError(f"{path} is corrupt, cut short or not a torch checkpoint"
                              f"{hint}") from None
    return _checked(path, state)


def _checked(path: Path, state: Any) -> dict[str, Any]:
    """``state`` when it is a gmi-drl checkpoint of this `VERSION`.

    Raises:
        CheckpointError: it is not, saying what it is.
    """
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a gmi-drl checkpoint (no format={FORMAT!r} entry)")
    version = state.get("version")
    if version != VERSION:
        who = ("an older gmi-drl (from before 2026-11-25)" if isinstance(version, int)
               and version < VERSION else "a newer gmi-drl")
        raise CheckpointError(f"{path} has checkpoint version {version}, written by {who}; this "
                              f"gmi-drl reads version {VERSION}: evaluate or continue it with "
                              "the gmi-drl that wrote it, or start a new run")
    return state
