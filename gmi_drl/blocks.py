"""Shared-memory blocks handed to a process that outlives their creator.

A GMI unlinks the blocks it made (env pool, channels, weight store) in its ``close`` and
``finally`` blocks. A Ray actor that is killed runs none of them, and the blocks stayed in
``/dev/shm`` of its node. So every block is made through `create`, which tells the hooks set
with `on_create` its name: a GMI actor hands each name to its node's agent
(`gmi_drl.cluster.node_agent`), which outlives the actors and unlinks (`unlink`) whatever is left
once they are gone. It sits below every layer (as `gmi_drl.errors` does), since the env pool
(`gmi_drl.envs.workers`) and the reducers and channels (`gmi_drl.comm`) make blocks alike.

A local run killed with SIGKILL as a whole (``kill -9`` of its process group, multiprocessing's
resource tracker included) runs no clean-up either. On Linux a block's name says who made it
(``gmidrl_<pid namespace>_<pid>_<start time>_<random>``), so `reclaim_orphans`, which the local
launcher runs as a run starts, unlinks those whose creator is gone.
"""

from __future__ import annotations

import os
import re
import secrets
from multiprocessing import shared_memory
from typing import Callable, Iterable

_SHM_DIR = "/dev/shm"
_NAME = re.compile(r"gmidrl_(\d+)_(\d+)_(\d+)_[0-9a-f]+")

_HOOKS: list[Callable[[str], None]] = []


def on_create(hook: Callable[[str], None]) -> None:
    """Call ``hook(name)`` with the name of every block this process makes from now on, before
    `create` returns it (a hook that raises fails the creation, which leaves no block)."""
    _HOOKS.append(hook)


def create(size: int) -> shared_memory.SharedMemory:
    """A new zero-filled block of ``size`` bytes (`on_create`'s hooks told of it).

    Raises:
        whatever a hook raises (the block is then unlinked).
    """
    owner = _owner(os.getpid())
    name = None if owner is None else f"gmidrl_{owner}_{secrets.token_hex(4)}"
    shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    try:
        for hook in _HOOKS:
            hook(shm.name)
    except BaseException:
        shm.close()
        shm.unlink()
        raise
    return shm


def unlink(names: Iterable[str]) -> list[str]:
    """Unlink the blocks ``names`` that still exist; returns those it unlinked."""
    gone = []
    for name in names:
        try:
            shm = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            continue
        shm.close()
        shm.unlink()
        gone.append(name)
    return gone


def _owner(pid: int) -> str | None:
    """``<pid namespace>_<pid>_<start time in clock ticks>`` of a live process ``pid`` (the
    start time tells it from a later process given the same pid), or ``None`` (no such process,
    or no /proc to ask)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{namespace}_{pid}_{start}"


def reclaim_orphans() -> list[str]:
    """Unlink the blocks of this pid namespace whose creator is gone (see the module docstring);
    returns their names. Blocks of other names, and of live creators, are left alone."""
    try:
        entries = os.listdir(_SHM_DIR)
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return []
    orphans = []
    for entry in entries:
        m = _NAME.fullmatch(entry)
        if m is not None and m[1] == namespace and _owner(int(m[2])) != f"{m[1]}_{m[2]}_{m[3]}":
            orphans.append(entry)
    return unlink(orphans)
