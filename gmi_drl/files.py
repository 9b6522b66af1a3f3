"""Files written whole or not at all: what a run, a tune search and a probe leave on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def replace_atomically(path: str | Path, write: Callable[[Path], object],
                       fsync: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path`` (same directory, so the rename
    cannot cross file systems; named after this process, so two writers do not share it), then
    rename it over ``path``: a reader or a crash sees the old file or the new one, never half
    of one. ``fsync``: flush the file to disk before the rename (checkpoints). Returns ``path``.

    Raises:
        OSError: the file cannot be written (a full disk, a removed directory); the temporary
            file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # (gone after the rename; left by a write that failed)
    return path


def write_text_atomically(path: str | Path, text: str) -> Path:
    """`replace_atomically` for a text file (UTF-8)."""
    return replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
