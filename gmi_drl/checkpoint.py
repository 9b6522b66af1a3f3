"""Checkpoint files: atomic writes, safe loads (``weights_only=True``), clear errors.

A checkpoint is a dict of tensors and plain data: ``format``, ``version``, ``config`` (the
resolved `TrainConfig` as a dict), ``global_step``, ``iteration``, and one entry per stateful
component: ``algo`` (the algorithm's `state_dict`, its weights under ``modules``),
``obs_norm``, ``reward_norm``, ``action_rng``, ``rng`` and the episode history.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

FORMAT = "gmi-drl-checkpoint"
VERSION = 2


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, of another format, or does not fit the model."""


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a temporary file in the same directory, flushed to
    disk, then renamed over ``path`` (a crash leaves either the old or the new file, never half)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, "version": VERSION, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its ``checkpoints/latest.pt``).

    Raises:
        CheckpointError: neither exists.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "latest.pt"
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path} (give a run directory or a .pt file)")
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` (``torch.load(weights_only=True)``: no code
    in the file is executed).

    Raises:
        CheckpointError: the file is missing, truncated/corrupt, not a gmi-drl checkpoint, or of
            an unsupported version.
    """
    path = resolve_checkpoint(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, OSError) as e:
        raise CheckpointError(f"{path} is corrupt or not a torch checkpoint: {e}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a gmi-drl checkpoint (no format={FORMAT!r} entry)")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {state.get('version')}; this "
                              f"gmi-drl reads version {VERSION}")
    return state
