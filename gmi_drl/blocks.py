"""Shared-memory blocks handed to a process that outlives their creator.

A GMI unlinks the blocks it made (env pool, channels, weight store) in its ``close`` and
``finally`` blocks. A Ray actor that is killed runs none of them, and the blocks stayed in
``/dev/shm`` of its node. So every block is made through `create`, which tells the hooks set
with `on_create` its name: a GMI actor hands each name to its node's agent
(`gmi_drl.cluster.node_agent`), which outlives the actors and unlinks (`unlink`) whatever is left
once they are gone. It sits below every layer (as `gmi_drl.errors` does), since the env pool
(`gmi_drl.envs.workers`) and the reducers and channels (`gmi_drl.comm`) make blocks alike.
"""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import Callable, Iterable

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
    shm = shared_memory.SharedMemory(create=True, size=size)
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
