"""MPR through shared memory: results equal sum / world_size, across real processes."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

from gmi_drl.comm.shm import SharedMemoryReducer, ShmGroup

SHAPES = [(3, 5), (7,), (2, 2, 2), (1,)]


def _grads(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _member(group, rank, steps, out_q):
    red = SharedMemoryReducer(group, rank)
    results = []
    for step in range(steps):
        ts = _grads(rank, step)
        red.allreduce_(ts)
        results.append([t.numpy().copy() for t in ts])
    red.close()
    out_q.put((rank, results))


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_mpr_equals_sum_over_world_size(world_size):
    ctx = mp.get_context("fork")
    group, owner = ShmGroup.create(world_size, 1024)
    q = ctx.Queue()
    steps = 3
    procs = [ctx.Process(target=_member, args=(group, r, steps, q)) for r in range(world_size)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    ShmGroup.destroy(owner)
    for step in range(steps):
        per_rank = [_grads(r, step) for r in range(world_size)]
        for i in range(len(SHAPES)):
            # rows are summed in rank order, so the float32 sum is reproduced exactly
            ref = per_rank[0][i].numpy().copy()
            for r in range(1, world_size):
                ref = ref + per_rank[r][i].numpy()
            ref = ref / np.float32(world_size)
            for r in range(world_size):
                np.testing.assert_array_equal(got[r][step][i], ref)


def test_capacity_and_rank_errors():
    group, owner = ShmGroup.create(1, 4)
    with pytest.raises(ValueError, match="rank=1"):
        SharedMemoryReducer(group, 1)
    red = SharedMemoryReducer(group, 0)
    with pytest.raises(ValueError, match="capacity"):
        red.allreduce_([torch.zeros(5)])
    t = torch.arange(4.0)
    red.allreduce_([t])
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]  # a group of one averages to itself
    red.close()
    ShmGroup.destroy(owner)


def test_dead_member_breaks_the_group_with_a_clear_error():
    group, owner = ShmGroup.create(2, 8)
    red = SharedMemoryReducer(group, 0, timeout_s=0.5)  # member 1 never arrives
    with pytest.raises(RuntimeError, match="MPR group broken at rank 0"):
        red.allreduce_([torch.ones(3)])
    red.close()
    ShmGroup.destroy(owner)


ATTACH_AND_EXIT = """
import pickle, sys
from gmi_drl.comm.shm import SharedMemoryReducer
for group in pickle.loads(bytes.fromhex(sys.argv[1])):
    SharedMemoryReducer(group, 0).close()
"""


@pytest.mark.distributed
def test_untracked_members_leave_the_block_to_its_creator():
    """A member that is no child of the creator (as a Ray actor) has its own resource tracker,
    which unlinks every block the member attached when it exits, unless the group says the
    members are untracked."""
    import os
    import pickle
    import subprocess
    import sys

    tracked, tracked_owner = ShmGroup.create(1, 8)
    untracked, untracked_owner = ShmGroup.create(1, 8, untracked_members=True)
    try:
        subprocess.run([sys.executable, "-c", ATTACH_AND_EXIT,
                        pickle.dumps([tracked, untracked]).hex()],
                       check=True, capture_output=True, timeout=60)
        assert not os.path.exists(f"/dev/shm/{tracked.name}")  # the member's tracker took it
        assert os.path.exists(f"/dev/shm/{untracked.name}")
    finally:
        tracked_owner.close()
        from multiprocessing import resource_tracker

        resource_tracker.unregister(tracked_owner._name, "shared_memory")  # already unlinked
        ShmGroup.destroy(untracked_owner)
