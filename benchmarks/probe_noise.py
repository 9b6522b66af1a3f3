"""How much a `tune` probe's throughput varies, and which estimator varies least.

Trains one (GMIs, num_envs) point of PPO ``--repeats`` times, each in a fresh process as a probe
is, logging every iteration; from each run's per-iteration throughput (env steps per second of
one iteration, from metrics.csv's ``wall_s``, which has millisecond resolution) it takes: the
mean over the first ``--short-s`` seconds after the warm-up iteration (what a probe of that
window measures), the mean over the whole run, and the median of the per-iteration figures.
Printed: each run's figures and, per estimator, the spread over the runs ((max - min) / mean).

    python benchmarks/probe_noise.py                                  # CartPole-v1, 1 x 4
    python benchmarks/probe_noise.py --task Hopper-v5 --num-envs 16 --iterations 25
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_run(task: str, gmis: int, num_envs: int, iterations: int) -> list[tuple[float, float]]:
    """(env steps, seconds) of each iteration after the first (the warm-up: start-up,
    compilation), from GMI 0's metrics."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tune import config

    from gmi_drl.config import validate
    from gmi_drl.gmi.probe import _metric_rows
    from gmi_drl.train import train

    cfg = config(task)
    cfg.env = dataclasses.replace(cfg.env, num_envs=num_envs)
    cfg.gmi = dataclasses.replace(cfg.gmi, num_devices=1, num_gmis=gmis)
    with tempfile.TemporaryDirectory() as tmp:
        cfg.run_dir, cfg.total_timesteps = tmp, iterations * cfg.batch_size
        cfg.log.tensorboard, cfg.log.log_every, cfg.checkpoint.every = False, 1, 0
        validate(cfg)
        train(cfg)
        rows = _metric_rows(Path(tmp) / "metrics.csv")
    return [(b["global_step"] - a["global_step"], b["wall_s"] - a["wall_s"])
            for a, b in zip(rows, rows[1:])]


def estimators(iters: list[tuple[float, float]], short_s: float) -> tuple[float, float, float]:
    """Env steps/s: the mean over the first ``short_s`` seconds, the mean over all ``iters``,
    and the median of the per-iteration figures (iterations of 0 ms, below the log's
    resolution, left out of the median)."""
    short, elapsed = [], 0.0
    for steps, seconds in iters:
        short.append((steps, seconds))
        elapsed += seconds
        if elapsed >= short_s:
            break

    def mean(part):
        return sum(s for s, _ in part) / sum(t for _, t in part)

    return (mean(short), mean(iters),
            statistics.median(s / t for s, t in iters if t > 0))


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.mean(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="CartPole-v1")
    parser.add_argument("--gmis", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--short-s", type=float, default=1.0)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.task, args.gmis, args.num_envs, args.iterations)))
        return
    print(f"{args.task}, {args.gmis} GMI(s) x {args.num_envs} envs, {args.iterations} "
          f"iterations per run, {args.repeats} runs (env steps/s)\n")
    print(f"| run | mean, first {args.short_s:g} s | mean, whole run | median, whole run | "
          "measured s |\n|---:|---:|---:|---:|---:|")
    rows = []
    for run in range(args.repeats):
        out = subprocess.run([sys.executable, __file__, "--one", "--task", args.task, "--gmis",
                              str(args.gmis), "--num-envs", str(args.num_envs), "--iterations",
                              str(args.iterations)], capture_output=True, text=True, check=True)
        iters = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(estimators(iters, args.short_s))
        print(f"| {run + 1} | " + " | ".join(f"{v:,.0f}" for v in rows[-1])
              + f" | {sum(t for _, t in iters):.1f} |", flush=True)
    print("| spread | " + " | ".join(f"{spread(list(col)):.0%}" for col in zip(*rows)) + " | |")


if __name__ == "__main__":
    main()
