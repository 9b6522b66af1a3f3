"""Allreduce latency of the reduction strategies vs gloo ring and a naive parameter server.

All members are real processes on this host, one per GMI (CPU emulation: "devices" for HAR are
groups of processes). Each strategy averages the same float32 buffer; we time ``--iters`` calls
after a warm-up and report the median and p95 of the slowest member's per-call latency.

    python benchmarks/reduce.py                         # 2 and 4 GMIs, the four paper sizes
    python benchmarks/reduce.py --gmis 4 --iters 50
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

from gmi_drl.comm.hierarchical import HierarchicalReducer
from gmi_drl.comm.ring import RingReducer
from gmi_drl.comm.shm import SharedMemoryReducer, ShmGroup

# the paper's model sizes (iSwitch Table 1: PPO 40 KB, DDPG 157.5 KB, A2C 3.3 MB, DQN 6.4 MB)
SIZES_BYTES = {"40 KB": 40_000, "157.5 KB": 157_500, "3.3 MB": 3_300_000, "6.4 MB": 6_400_000}


class ParameterServer:
    """Naive parameter server over torch.distributed point-to-point: the server is rank
    ``world_size``; every worker sends its gradients, the server sums, divides and sends back."""

    def __init__(self, rank, world_size, init):
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size + 1)
        self.rank, self.world_size = rank, world_size

    def allreduce_(self, tensors):
        (t,) = tensors
        dist.send(t, dst=self.world_size)
        dist.recv(t, src=self.world_size)

    @staticmethod
    def serve(world_size, n, iters, init):
        dist.init_process_group("gloo", init_method=init, rank=world_size,
                                world_size=world_size + 1)
        acc, buf = torch.empty(n), torch.empty(n)
        for _ in range(iters):
            acc.zero_()
            for r in range(world_size):
                dist.recv(buf, src=r)
                acc += buf
            acc /= world_size
            for r in range(world_size):
                dist.send(acc, dst=r)
        dist.destroy_process_group()

    def close(self):
        dist.destroy_process_group()


def _member(kind, rank, world, mpl, groups, init, n, iters, q):
    torch.set_num_threads(1)
    if kind == "MPR":
        red = SharedMemoryReducer(groups[0], rank)
    elif kind == "gloo ring":
        red = RingReducer(rank, world, init)
    elif kind == "HAR":
        dev = next(d for d, g in enumerate(mpl) if rank in g)
        red = HierarchicalReducer(rank, mpl, groups[dev], init)
    else:
        red = ParameterServer(rank, world, init)
    t = torch.randn(n)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        red.allreduce_([t])
        times.append(time.perf_counter() - t0)
    red.close()
    q.put((rank, times))


def measure(kind, world, n, iters):
    ctx = mp.get_context("spawn")
    mpl = [list(range(world))] if kind != "HAR" else [list(range(world // 2)),
                                                     list(range(world // 2, world))]
    groups, owners = [], []
    for gmis in mpl:
        g, o = ShmGroup.create(len(gmis), n)
        groups.append(g)
        owners.append(o)
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{d}/rdzv"
        q = ctx.Queue()
        procs = [ctx.Process(target=_member, args=(kind, r, world, mpl, groups, init, n, iters, q))
                 for r in range(world)]
        if kind == "param server":
            procs.append(ctx.Process(target=ParameterServer.serve, args=(world, n, iters, init)))
        for p in procs:
            p.start()
        per_rank = dict(q.get(timeout=600) for _ in range(world))
        for p in procs:
            p.join(timeout=60)
    for o in owners:
        ShmGroup.destroy(o)
    warm = max(2, iters // 10)
    slowest = np.max(np.array([per_rank[r] for r in range(world)]), axis=0)[warm:] * 1e3
    return statistics.median(slowest), float(np.percentile(slowest, 95))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--gmis", type=int, nargs="+", default=[2, 4],
                    help="GMI counts to measure, one member process per GMI (each >= 2; HAR "
                         "splits them over 2 emulated devices)")
    ap.add_argument("--iters", type=int, default=40,
                    help="allreduce calls per measurement, the first max(2, iters // 10) an "
                         "untimed warm-up (>= 3: at least one timed call)")
    ap.add_argument("--sizes", nargs="+", default=list(SIZES_BYTES), choices=list(SIZES_BYTES),
                    help="the paper's model sizes, quoted: --sizes '40 KB' '6.4 MB'")
    args = ap.parse_args()
    if min(args.gmis) < 2:
        ap.error(f"--gmis {min(args.gmis)}: at least 2 GMIs each (a reduction needs two)")
    if args.iters < 3:
        ap.error(f"--iters {args.iters}: at least 3 (the first 2 calls are an untimed warm-up; "
                 "at least one must be timed)")
    kinds = ["MPR", "HAR", "gloo ring", "param server"]
    rows = []
    for world in args.gmis:
        for size in args.sizes:
            n = SIZES_BYTES[size] // 4
            res = {k: measure(k, world, n, args.iters) for k in kinds}
            rows.append((world, size, res))
            print(f"{world} GMIs {size}: " + ", ".join(f"{k} {v[0]:.2f} ms" for k, v in res.items()),
                  flush=True)
    print(f"\nallreduce latency, ms (median / p95 of the slowest member), {args.iters} iters, "
          f"{os.cpu_count()} CPU cores; HAR emulates 2 devices\n")
    print("| GMIs | size | " + " | ".join(kinds) + " | MPR / gloo |")
    print("|---|---|" + "---|" * len(kinds) + "---|")
    for world, size, res in rows:
        cells = " | ".join(f"{res[k][0]:.2f} / {res[k][1]:.2f}" for k in kinds)
        print(f"| {world} | {size} | {cells} | {res['MPR'][0] / res['gloo ring'][0]:.2f}x |")


if __name__ == "__main__":
    main()
