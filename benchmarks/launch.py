"""How long a multi-GMI run takes to start: GMIs forked from the fork server against spawned.

Each repeat is a fresh Python process that runs the same short PPO training twice with the
local placement: the first run is what a ``gmi-drl train`` user waits for (the fork server
starts and imports its modules inside it), the second what a process that launches runs one
after another sees (a sweep, ``tune`` in-process, the test suite), the server already up. The
training is 2 iterations of CartPole-v1 with 4 envs per GMI, so its wall time is mostly
start-up: the GMI processes, their imports, the envs and, with ``--compile``, torch.compile.
Printed: the median wall time of each (start method, GMIs, first / later run) and the ratio
spawn / forkserver, with the methods alternating between repeats.

``--steady NUM_ENVS`` instead compares the training rate once started: pairs of fresh runs of 2
GMIs x NUM_ENVS (8 iterations, logged each), one per method, the method that goes first
alternating; per run the median env steps/s of iterations 3-8; printed per pair and as medians.

    python benchmarks/launch.py                     # 2 and 4 GMIs, 3 repeats, no compile
    python benchmarks/launch.py --gmis 2 --compile  # with the compiled gradient step
    python benchmarks/launch.py --steady 256 --compile --repeats 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

METHODS = ("forkserver", "spawn")


def one_process(method: str, gmis: int, compile_: bool) -> list[float]:
    """Wall seconds of two consecutive `train` calls in this process."""
    from gmi_drl.config import preset, validate
    from gmi_drl.train import train

    walls = []
    for _ in range(2):
        cfg = preset("classic", "CartPole-v1", "ppo")
        cfg.env.num_envs, cfg.gmi.num_gmis, cfg.gmi.start_method = 4, gmis, method
        cfg.compile, cfg.log.tensorboard, cfg.checkpoint.every = compile_, False, 0
        cfg.total_timesteps = 2 * gmis * cfg.env.num_envs * cfg.algo.num_steps
        with tempfile.TemporaryDirectory() as tmp:
            cfg.run_dir = tmp
            validate(cfg)
            start = time.perf_counter()
            train(cfg)
            walls.append(time.perf_counter() - start)
    return walls


def steady_run(method: str, num_envs: int, compile_: bool) -> float:
    """Median env steps/s of iterations 3-8 of a fresh 2-GMI CartPole-v1 run."""
    import csv

    from gmi_drl.config import preset, validate
    from gmi_drl.train import train

    cfg = preset("classic", "CartPole-v1", "ppo")
    cfg.env.num_envs, cfg.gmi.num_gmis, cfg.gmi.start_method = num_envs, 2, method
    cfg.compile, cfg.log.tensorboard, cfg.checkpoint.every = compile_, False, 0
    cfg.log.log_every = 1
    cfg.total_timesteps = 8 * 2 * num_envs * cfg.algo.num_steps
    with tempfile.TemporaryDirectory() as tmp:
        cfg.run_dir = tmp
        validate(cfg)
        train(cfg)
        with open(f"{tmp}/metrics.csv", newline="") as f:
            rows = [(int(r["global_step"]), float(r["value"])) for r in csv.DictReader(f)
                    if r["name"] == "perf/sps"]
    # each perf/sps is the mean since the loop started (elapsed = step / sps): an iteration's
    # own rate is the difference of two rows
    elapsed = [(step, step / sps) for step, sps in rows]
    rates = [(s1 - s0) / (t1 - t0) for (s0, t0), (s1, t1) in zip(elapsed, elapsed[1:])]
    return statistics.median(rates[1:])  # iterations 3-8


def steady(num_envs: int, repeats: int, compile_: bool) -> None:
    print(f"PPO CartPole-v1, 2 GMIs x {num_envs} envs, compile {'on' if compile_ else 'off'}: "
          f"median env steps/s of iterations 3-8, {repeats} pairs of fresh runs\n")
    print("| pair | first | forkserver | spawn | forkserver / spawn |\n|---:|---|---:|---:|---:|")
    rates: dict[str, list[float]] = {m: [] for m in METHODS}
    for pair in range(repeats):
        order = METHODS if pair % 2 else METHODS[::-1]
        for method in order:
            cmd = [sys.executable, __file__, "--one-steady", method, str(num_envs)]
            out = subprocess.run(cmd + (["--compile"] if compile_ else []),
                                 capture_output=True, text=True, check=True)
            rates[method].append(float(out.stdout.strip().splitlines()[-1]))
        f, s = rates["forkserver"][-1], rates["spawn"][-1]
        print(f"| {pair + 1} | {order[0]} | {f:,.0f} | {s:,.0f} | {f / s:.2f} |", flush=True)
    ratios = [f / s for f, s in zip(rates["forkserver"], rates["spawn"])]
    print(f"| median | | {statistics.median(rates['forkserver']):,.0f} | "
          f"{statistics.median(rates['spawn']):,.0f} | {statistics.median(ratios):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--gmis", type=int, nargs="+", default=[2, 4],
                        help="GMI counts of the start-up comparison (each >= 2)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fresh processes per method (--steady: pairs of runs); medians")
    parser.add_argument("--compile", action="store_true",
                        help="compile the gradient step (the default of a training run)")
    parser.add_argument("--steady", type=int, metavar="NUM_ENVS",
                        help="compare the training rate of 2 GMIs x NUM_ENVS instead")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--one-steady", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats} must be >= 1")
    if min(args.gmis) < 2:
        parser.error(f"--gmis {' '.join(map(str, args.gmis))}: each must be >= 2 (one GMI "
                     "runs in the caller's process, with no start method)")
    if args.steady is not None and args.steady < 1:
        parser.error(f"--steady {args.steady} must be >= 1 (envs per GMI)")
    if args.one:
        print(json.dumps(one_process(args.one[0], int(args.one[1]), args.compile)))
        return
    if args.one_steady:
        print(steady_run(args.one_steady[0], int(args.one_steady[1]), args.compile))
        return
    if args.steady:
        steady(args.steady, args.repeats, args.compile)
        return
    print(f"PPO CartPole-v1, 4 envs per GMI, 2 iterations per run, compile "
          f"{'on' if args.compile else 'off'}; median of {args.repeats} fresh processes "
          f"(wall seconds of the whole run)\n")
    print("| GMIs | run | forkserver | spawn | spawn / forkserver |\n|---:|---|---:|---:|---:|")
    for gmis in args.gmis:
        walls: dict[str, list[list[float]]] = {m: [] for m in METHODS}
        for _ in range(args.repeats):
            for method in METHODS:
                cmd = [sys.executable, __file__, "--one", method, str(gmis)]
                out = subprocess.run(cmd + (["--compile"] if args.compile else []),
                                     capture_output=True, text=True, check=True)
                walls[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for i, label in enumerate(("first (server starts)", "later (server up)")):
            med = {m: statistics.median(w[i] for w in walls[m]) for m in METHODS}
            print(f"| {gmis} | {label} | {med['forkserver']:.2f} | {med['spawn']:.2f} | "
                  f"{med['spawn'] / med['forkserver']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
