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
(``gmidrl_<pid namespace>_<pid>_<start time>_<random>``), so `reclaim_orphans`, which every
run of `gmi_drl.train.train` calls as it starts, unlinks those whose creator is gone.
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
    """Unlink this user's blocks of this pid namespace whose creator is gone (see the module
    docstring); returns their names. Blocks of other names, of other users and of live creators
    are left alone, and so is everything where /proc is not this pid namespace's (``unshare
    --pid`` without its own /proc: a pid there names another process). Never raises: a block
    another launch unlinked first, or one that cannot be unlinked, is passed by."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return []
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
        entries = os.listdir(_SHM_DIR)
    except OSError:
        return []
    gone = []
    for entry in entries:
        m = _NAME.fullmatch(entry)
        if m is None or m[1] != namespace or _owner(int(m[2])) == f"{m[1]}_{m[2]}_{m[3]}":
            continue
        path = os.path.join(_SHM_DIR, entry)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.unlink(path)
        except OSError:
            continue
        gone.append(entry)
    return gone
