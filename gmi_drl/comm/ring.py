"""Ring allreduce through torch.distributed (gloo on CPU, NCCL on GPUs), plain or multi-ring.

Multi-ring reduction (MRR, GMI-DRL §4.1 / Fig. 4b): with ``mpl`` GMIs on each of D devices, ring
``k`` joins the k-th GMI of every device (no two members share a device, as NCCL requires); then
the representatives ``mpl[k][k]`` (one per ring, each on its own device) allreduce the ring sums;
finally each representative broadcasts the total back into its ring. Valid when every device holds
the same number of GMIs and that number is at most D (`select_reduction` returns MRR exactly then).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from gmi_drl.comm.reducer import GradReducer, flatten_into, unflatten_from
from gmi_drl.comm.reduction import Reduction, why_not


class RingReducer(GradReducer):
    """A member of a torch.distributed group; ``rank`` is the GMI id.

    Args:
        rank, world_size: this member and the group size.
        init_method: torch.distributed rendezvous, e.g. ``"tcp://127.0.0.1:29500"`` or
            ``"file:///tmp/rdzv"``.
        backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors).
        mpl: GMI-to-device map for multi-ring reduction; ``None`` means one flat ring.
        timeout_s: collective timeout (seconds) after which the group is broken.
        store: a ``torch.distributed.Store`` to rendezvous through instead of ``init_method``
            (the async template's trainers on Ray share the run's `BridgeDirectory` store).

    Raises:
        ValueError: ``mpl`` is given but is not a layout MRR supports (`reduction.why_not`).
    """

    def __init__(self, rank: int, world_size: int, init_method: str, backend: str = "gloo",
                 mpl: Sequence[Sequence[int]] | None = None, timeout_s: float = 60.0,
                 store=None) -> None:
        import datetime

        self.rank, self.world_size = rank, world_size
        problem = None if mpl is None else why_not(Reduction.MRR, mpl)
        if problem is not None:
            raise ValueError(problem)
        where = {"store": store} if store is not None else {"init_method": init_method}
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **where)
        self._flat = torch.empty(0)
        self._rings = None
        if mpl is not None:
            self._rings = _build_rings(mpl, rank)

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        n = sum(t.numel() for t in tensors)
        if self._flat.numel() < n or self._flat.device != tensors[0].device:
            self._flat = torch.empty(n, dtype=torch.float32, device=tensors[0].device)
        flat = self._flat[:n]
        flatten_into(tensors, flat)
        if self._rings is None:
            dist.all_reduce(flat)
        else:
            ring, reps, rep = self._rings
            dist.all_reduce(flat, group=ring)
            if reps is not None:
                dist.all_reduce(flat, group=reps)
            dist.broadcast(flat, src=rep, group=ring)
        flat.div_(self.world_size)
        unflatten_from(flat, tensors)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _build_rings(mpl, rank):
    """Create every ring and the representatives' group (collective: all ranks, same order)."""
    slots = len(mpl[0])
    my_ring = my_reps = my_rep = None
    for k in range(slots):
        members = [mpl[d][k] for d in range(len(mpl))]
        group = dist.new_group(members)
        if rank in members:
            my_ring, my_rep = group, mpl[k][k]
    reps = [mpl[k][k] for k in range(slots)]
    reps_group = dist.new_group(reps)
    if rank in reps:
        my_reps = reps_group
    return my_ring, my_reps, my_rep
