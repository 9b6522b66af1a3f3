"""Hierarchical reduction (HAR, GMI-DRL §4.1 / Fig. 4c): inside a device, then across leaders.

The GMIs of one device sum their gradients through that device's shared-memory block (as MPR,
without the division); the device's leader (its first GMI in ``mpl``) allreduces the device sum
with the other devices' leaders over torch.distributed; the leader writes the global mean back
into the block and every GMI of the device copies it out. Works for any layout, which is why
Algorithm 1 falls back to it when MRR's ring rules do not hold.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from gmi_drl.comm.reducer import GradReducer
from gmi_drl.comm.shm import SharedMemoryReducer, ShmGroup


class HierarchicalReducer(GradReducer):
    """A member of a HAR group; ``rank`` is the GMI id.

    Args:
        rank: this GMI's id (its torch.distributed rank).
        mpl: GMI-to-device map, e.g. ``[[0, 1, 2], [3, 4]]``; GMI ids ``0..world_size-1``.
        device_group: the `ShmGroup` of this GMI's device (``world_size == len(mpl[d])``).
        init_method: torch.distributed rendezvous for all GMIs (only leaders exchange data).
        backend: ``"gloo"`` or ``"nccl"``.
        timeout_s: barrier and collective timeout, seconds.

    Raises:
        ValueError: ``rank`` not in ``mpl``, or ``device_group`` sized for another device.
    """

    def __init__(self, rank: int, mpl: Sequence[Sequence[int]], device_group: ShmGroup,
                 init_method: str, backend: str = "gloo", timeout_s: float = 60.0) -> None:
        import datetime

        device = next((d for d, gmis in enumerate(mpl) if rank in gmis), None)
        if device is None:
            raise ValueError(f"rank={rank} is in no device of mpl={mpl!r}")
        local = list(mpl[device]).index(rank)
        if device_group.world_size != len(mpl[device]):
            raise ValueError(f"device_group has {device_group.world_size} members, device "
                             f"{device} has {len(mpl[device])} GMIs")
        self.rank = rank
        self.world_size = sum(len(g) for g in mpl)
        self._leader = local == 0
        self._local = SharedMemoryReducer(device_group, local, timeout_s)
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self._leaders = dist.new_group([gmis[0] for gmis in mpl])

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        local = self._local
        n = local.reduce_scatter_(tensors, mean=False)  # the device's sum, in its block
        if self._leader:
            total = local.result[:n]
            dist.all_reduce(total, group=self._leaders)
            total.div_(self.world_size)
        local.barrier()
        local.copy_result_(tensors)

    def close(self) -> None:
        self._local.close()
        if dist.is_initialized():
            dist.destroy_process_group()
