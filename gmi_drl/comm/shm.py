"""Multi-process reduction (MPR, GMI-DRL §4.1 / Fig. 4a) through host shared memory.

The ``world_size`` members of a group share one block: a ``(world_size, capacity)`` float32 row
per member and a ``(capacity,)`` result. An allreduce is a reduce-scatter and an all-gather over
that block: each member copies its gradients into its row; after a barrier, member ``r`` sums
column chunk ``r`` over all rows (in row order 0..world_size-1) and divides by ``world_size``;
after a second barrier, every member copies the whole result back into its tensors.

The barrier is a spin-then-sleep barrier on per-member epoch counters in the same block (each
member writes only its own cache line; x86's store order makes the rows visible before the
counter): waking costs microseconds, a fraction of a semaphore-based ``multiprocessing.Barrier``
round, and the handle is a plain name, picklable anywhere.

Cost per call: 2 barriers; each member moves ``numel`` floats in, ``numel`` out and sums
``numel * world_size / world_size`` floats, so the work per member stays flat as the group grows
while the memory traffic of the block grows with ``world_size``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Sequence

import numpy as np
import torch

from gmi_drl import blocks
from gmi_drl.comm.reducer import GradReducer, flatten_into, unflatten_from

_HEADER_BYTES = 64  # one cache line per member's barrier epoch


@dataclass(frozen=True)
class ShmGroup:
    """A picklable handle of one MPR group; pass it to every member process at start.

    Made by `ShmGroup.create` in the parent process, which keeps ``owner`` and must call
    `ShmGroup.destroy` after the members are done.

    ``untracked_members``: members attach without registering the block with their own
    multiprocessing resource tracker. Set it when members are not children of the creator (Ray
    actors): a tracker of their own would unlink the block as soon as one member exits.
    """

    name: str
    world_size: int
    capacity: int
    untracked_members: bool = False

    @classmethod
    def create(cls, world_size: int, capacity: int,
               untracked_members: bool = False) -> tuple["ShmGroup", shared_memory.SharedMemory]:
        """Allocate a group for ``world_size`` members and at most ``capacity`` float32 per call.

        Raises:
            ValueError: ``world_size < 1`` or ``capacity < 1``.
        """
        if world_size < 1 or capacity < 1:
            raise ValueError(f"{world_size=} and {capacity=} must both be >= 1")
        nbytes = _HEADER_BYTES * world_size + (world_size + 1) * capacity * 4
        shm = blocks.create(nbytes)
        shm.buf[:_HEADER_BYTES * world_size] = bytes(_HEADER_BYTES * world_size)
        return cls(shm.name, world_size, capacity, untracked_members), shm

    @staticmethod
    def destroy(owner: shared_memory.SharedMemory) -> None:
        """Unlink the block (the parent's duty once every member has closed)."""
        owner.unlink()
        owner.close()


class SharedMemoryReducer(GradReducer):
    """One member of an MPR group.

    Args:
        group: the handle from `ShmGroup.create`.
        rank: this member's index in ``[0, group.world_size)``.
        timeout_s: how long a barrier waits for the slowest member before the group is broken.

    Raises:
        ValueError: ``rank`` out of range.
    """

    def __init__(self, group: ShmGroup, rank: int, timeout_s: float = 60.0) -> None:
        if not 0 <= rank < group.world_size:
            raise ValueError(f"rank={rank} out of range [0, {group.world_size})")
        self.rank, self.world_size, self.timeout_s = rank, group.world_size, timeout_s
        self._group = group
        self._shm = shared_memory.SharedMemory(name=group.name)
        if group.untracked_members:  # the creator's tracker alone may unlink the block
            from multiprocessing import resource_tracker

            resource_tracker.unregister(self._shm._name, "shared_memory")  # noqa: SLF001
        head = _HEADER_BYTES * group.world_size
        # one int64 epoch per member, each on its own cache line
        self._epochs = np.frombuffer(self._shm.buf, np.int64, count=head // 8)[::_HEADER_BYTES // 8]
        self._epoch = int(self._epochs[rank])
        block = np.frombuffer(self._shm.buf, np.float32, offset=head,
                              count=(group.world_size + 1) * group.capacity).reshape(
            group.world_size + 1, group.capacity)
        self._rows, self._result = block[:-1], block[-1]
        self._my_row = torch.from_numpy(self._rows[rank])
        self._result_t = torch.from_numpy(self._result)

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        self.reduce_scatter_(tensors, mean=True)
        self.copy_result_(tensors)

    def reduce_scatter_(self, tensors: Sequence[torch.Tensor], mean: bool) -> int:
        """The first half of `allreduce_`: put ``tensors`` in this member's row, and once every
        member did, sum column chunk ``rank`` over all rows (in row order) into `result`, divided
        by ``world_size`` when ``mean``. Returns ``n``, the floats written; on return every
        member's chunk is in `result[:n]`. Blocking, collective.

        Raises:
            ValueError: more floats than the group's capacity. RuntimeError: the group broke.
        """
        n = sum(t.numel() for t in tensors)
        if n > self._group.capacity:
            raise ValueError(f"allreduce_ of {n} floats exceeds the group capacity "
                             f"{self._group.capacity}; create the group with a larger capacity")
        flatten_into(tensors, self._my_row)
        self.barrier()
        chunk = math.ceil(n / self.world_size)
        lo, hi = min(self.rank * chunk, n), min((self.rank + 1) * chunk, n)
        if hi > lo:
            out = self._result[lo:hi]
            np.sum(self._rows[:, lo:hi], axis=0, out=out)
            if mean:
                np.divide(out, self.world_size, out=out)
        self.barrier()
        return n

    @property
    def result(self) -> torch.Tensor:
        """``(capacity,) float32``: the group's shared result row (a view; every member's)."""
        return self._result_t

    def copy_result_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copy `result` back into ``tensors`` (the second half of `allreduce_`)."""
        unflatten_from(self._result_t, tensors)

    def barrier(self) -> None:
        """Publish this member's next epoch, wait until every member reached it (collective).

        Raises:
            RuntimeError: a member did not arrive within ``timeout_s``.
        """
        self._epoch += 1
        epochs, target = self._epochs, self._epoch
        epochs[self.rank] = target
        spins, deadline = 0, None
        while epochs.min() < target:
            spins += 1
            if spins < 200:
                os.sched_yield()  # another member may need this core to arrive
                continue
            if deadline is None:
                deadline = time.monotonic() + self.timeout_s
            elif time.monotonic() > deadline:
                raise RuntimeError(
                    f"MPR group broken at rank {self.rank}: a member did not reach the barrier "
                    f"within {self.timeout_s} s (it died, or runs a different sequence of "
                    "allreduce_ calls)")
            time.sleep(min(1e-3, 1e-5 * (spins - 199)))

    def __del__(self) -> None:
        # a GMI that raised drops its reducer unclosed; release the views before the mapping
        self.close()

    def close(self) -> None:
        if getattr(self, "_shm", None) is not None:
            self._my_row = self._result_t = self._rows = self._result = self._epochs = None
            try:
                self._shm.close()
            except BufferError:  # a caller still holds a view; the mapping goes with it
                self._shm.close = lambda: None
            self._shm = None
