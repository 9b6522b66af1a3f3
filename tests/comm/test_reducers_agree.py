"""Every reduction over real processes: result == sum / world_size, and reductions agree.

"Devices" are emulated as groups of processes (``mpl``), as GMI-DRL's layouts would place them.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

from gmi_drl.comm.hierarchical import HierarchicalReducer
from gmi_drl.comm.ring import RingReducer
from gmi_drl.comm.shm import SharedMemoryReducer, ShmGroup

SHAPES = [(64, 11), (64,), (3, 64), (3,)]
STEPS = 2


def _grads(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * step + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _member(kind, rank, world, mpl, groups, init, q):
    torch.set_num_threads(1)
    if kind == "mpr":
        red = SharedMemoryReducer(groups[0], rank)
    elif kind == "ring":
        red = RingReducer(rank, world, init)
    elif kind == "mrr":
        red = RingReducer(rank, world, init, mpl=mpl)
    else:
        dev = next(d for d, g in enumerate(mpl) if rank in g)
        red = HierarchicalReducer(rank, mpl, groups[dev], init)
    out = []
    for step in range(STEPS):
        ts = _grads(rank, step)
        red.allreduce_(ts)
        out.append([t.numpy().copy() for t in ts])
    red.close()
    q.put((rank, out))


def _run(kind, mpl, tmp_path):
    world = sum(len(g) for g in mpl)
    ctx = mp.get_context("spawn")
    owners, groups = [], []
    for gmis in (mpl if kind == "har" else [list(range(world))]):
        g, o = ShmGroup.create(len(gmis), 4096)
        groups.append(g)
        owners.append(o)
    init = f"file://{tmp_path}/rdzv-{kind}"
    q = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(kind, r, world, mpl, groups, init, q))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict(q.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        for o in owners:
            ShmGroup.destroy(o)
    assert all(p.exitcode == 0 for p in procs)
    return got


def _reference(world):
    refs = []
    for step in range(STEPS):
        per = [_grads(r, step) for r in range(world)]
        refs.append([(sum(p[i].double() for p in per) / world).numpy() for i in range(len(SHAPES))])
    return refs


LAYOUTS = {
    "mpr": [[0, 1, 2, 3]],
    "ring": [[0], [1], [2], [3]],
    "mrr": [[0, 1], [2, 3]],
    "har": [[0, 1, 2], [3, 4]],
}


@pytest.mark.distributed
@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_reduction_gives_sum_over_world_size_on_every_member(kind, tmp_path):
    mpl = LAYOUTS[kind]
    world = sum(len(g) for g in mpl)
    got = _run(kind, mpl, tmp_path)
    ref = _reference(world)
    for step in range(STEPS):
        for i in range(len(SHAPES)):
            for r in range(world):
                # float32 sums in different orders (ring chunks, device partial sums) differ from
                # the float64 reference by a few ulps of the operands: |x| ~ 3, so 1e-5 is ample
                np.testing.assert_allclose(got[r][step][i], ref[step][i], rtol=0, atol=1e-5)
            for r in range(1, world):  # and every member holds bit-identical results
                np.testing.assert_array_equal(got[r][step][i], got[0][step][i])


@pytest.mark.distributed
def test_reductions_agree_with_each_other(tmp_path):
    mpr = _run("mpr", [[0, 1, 2, 3]], tmp_path)
    mrr = _run("mrr", [[0, 1], [2, 3]], tmp_path)
    for step in range(STEPS):
        for i in range(len(SHAPES)):
            np.testing.assert_allclose(mpr[0][step][i], mrr[0][step][i], rtol=0, atol=1e-5)


def test_mrr_rejects_a_layout_algorithm_1_would_not_pick(tmp_path):
    with pytest.raises(ValueError, match="mrr needs the same number of GMIs on every device"):
        RingReducer(0, 6, f"file://{tmp_path}/x", mpl=[[0, 1, 2], [3, 4, 5]])
