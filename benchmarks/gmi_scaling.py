"""Multi-GMI synchronous PPO on this machine: throughput with 1, 2, 4 GMIs, and learning parity.

Part ``throughput``: PPO on ``--task`` with ``--envs-per-gmi`` envs in each GMI, ``--updates``
updates, for each GMI count; prints global env steps/s and the speed-up over 1 GMI.
Part ``parity``: 2 GMIs x N envs against serial PPO with 2N envs at equal global steps over 3
seeds (GMI-DRL keeps the algorithm unchanged: the curves must agree within seed noise).

    python benchmarks/gmi_scaling.py --parts throughput --task Hopper-v5
    python benchmarks/gmi_scaling.py --parts parity --task CartPole-v1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import numpy as np

from gmi_drl.config import preset
from gmi_drl.gmi.devices import discover
from gmi_drl.gmi.layout import plan
from gmi_drl.train import train


def run(task: str, num_gmis: int, envs: int, total: int, seed: int, run_dir: str,
        num_steps: int | None = None):
    cfg = preset("auto", task)
    cfg.env.num_envs, cfg.gmi.num_gmis, cfg.seed = envs, num_gmis, seed
    if num_steps:
        cfg.algo.num_steps = num_steps
    cfg.total_timesteps, cfg.run_dir = total, run_dir
    cfg.log.tensorboard, cfg.checkpoint.every = False, 0
    return train(cfg)


def throughput(args, tmp):
    print(f"\n{args.task}: {args.envs_per_gmi} envs per GMI, {args.updates} updates, "
          f"median of {args.repeats}; steps/s after each run's first update (start-up and the "
          "first update's torch.compile excluded)\n")
    rows = []  # printed after the runs, whose own lines would split the table
    for g in args.gmis:
        cfg = preset("auto", args.task)
        total = args.updates * args.envs_per_gmi * cfg.algo.num_steps * g
        rates = [run(args.task, g, args.envs_per_gmi, total, 1, f"{tmp}/t{g}-{r}")
                 for r in range(args.repeats)]
        rows.append((g, statistics.median(r.steady_sps for r in rates)))
    (g0, base) = rows[0]
    print(f"\n| GMIs | reduction | global steps/s | speed-up vs {g0} GMI{'s' if g0 > 1 else ''} |")
    print("|---|---|---|---|")
    for g, sps in rows:
        reduction = "none" if g == 1 else plan(g, discover()).reduction.value
        print(f"| {g} | {reduction} | {sps:,.0f} | {sps / base:.2f}x |", flush=True)


def parity(args, tmp):
    n = args.envs_per_gmi
    rows = []  # printed after the runs, whose own lines would split the table
    finals = {"serial": [], "gmi": []}
    for seed in args.seeds:
        a = run(args.task, 1, 2 * n, args.total, seed, f"{tmp}/s{seed}")
        b = run(args.task, 2, n, args.total, seed, f"{tmp}/g{seed}")
        fa, fb = _final(a), _final(b)
        finals["serial"].append(fa)
        finals["gmi"].append(fb)
        rows.append(f"| {seed} | {fa:.1f} | {fb:.1f} | {_half(a):,} | {_half(b):,} |")
    print(f"\n{args.task}: 2 GMIs x {n} envs vs serial {2 * n} envs, {args.total:,} steps\n")
    print("| seed | serial final return | 2 GMIs final return | serial 50%-step | 2 GMIs 50%-step |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nmean final return: serial {statistics.mean(finals['serial']):.1f} "
          f"(sd {statistics.pstdev(finals['serial']):.1f}), 2 GMIs "
          f"{statistics.mean(finals['gmi']):.1f} (sd {statistics.pstdev(finals['gmi']):.1f})")


def _final(r) -> float:
    return float(np.mean(r.episode_returns[-20:]))


def _half(r) -> int:
    """First global_step at which the 20-episode mean reaches half of the run's final value."""
    ret = r.episode_returns
    target = 0.5 * _final(r)
    for k in range(20, len(ret) + 1):
        if ret[k - 20:k].mean() >= target:
            return int(r.episode_steps[k - 1])
    return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["throughput", "parity"],
                    choices=["throughput", "parity"], help="which measurements to run")
    ap.add_argument("--task", default="CartPole-v1", help="env_id of both parts")
    ap.add_argument("--gmis", type=int, nargs="+", default=[1, 2, 4],
                    help="GMI counts of the throughput part; speed-ups are against the first")
    ap.add_argument("--envs-per-gmi", type=int, default=4,
                    help="env.num_envs of each GMI (parity: the serial run has twice as many)")
    ap.add_argument("--updates", type=int, default=10,
                    help="PPO updates per throughput run (the first is not measured)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="throughput runs per GMI count (median reported)")
    ap.add_argument("--total", type=int, default=100_000,
                    help="global env steps of each parity run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                    help="seeds of the parity part (one serial and one 2-GMI run each)")
    args = ap.parse_args()
    for flag, values in (("--gmis", args.gmis), ("--envs-per-gmi", [args.envs_per_gmi]),
                         ("--repeats", [args.repeats]), ("--total", [args.total])):
        if min(values) < 1:
            ap.error(f"{flag} {' '.join(map(str, values))}: each must be >= 1")
    if args.updates < 2:
        ap.error(f"--updates {args.updates}: at least 2 (the first update, which compiles, is "
                 "not measured)")
    with tempfile.TemporaryDirectory() as tmp:
        if "throughput" in args.parts:
            throughput(args, tmp)
        if "parity" in args.parts:
            parity(args, tmp)


if __name__ == "__main__":
    main()
