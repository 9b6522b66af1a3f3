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


def _config(task: str):
    """benchmarks/tune.py's PPO config of ``task``.

    Raises:
        ValueError: a task it cannot train (ConfigError).
    """
    sys.path.insert(0, str(Path(__file__).parent))
    from tune import config

    return config(task)


def one_run(task: str, gmis: int, num_envs: int, iterations: int) -> list[tuple[float, float]]:
    """(env steps, seconds) of each iteration after the first (the warm-up: start-up,
    compilation), from GMI 0's metrics."""
    from gmi_drl.config import validate
    from gmi_drl.tune.probe import _metric_rows
    from gmi_drl.train import train

    cfg = _config(task)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--task", default="CartPole-v1",
                        help="task id, trained with PPO as benchmarks/tune.py configures it")
    parser.add_argument("--gmis", type=int, default=1, help="GMIs of the probed point (>= 1)")
    parser.add_argument("--num-envs", type=int, default=4,
                        help="envs of each GMI's pool at the probed point (>= 1)")
    parser.add_argument("--iterations", type=int, default=120,
                        help="PPO iterations per run, the first a warm-up left out (>= 2)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs, each in a fresh process (>= 1)")
    parser.add_argument("--short-s", type=float, default=1.0,
                        help="the short probe's window after the warm-up iteration, seconds (> 0)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for flag, value in (("--gmis", args.gmis), ("--num-envs", args.num_envs),
                        ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag} {value}: must be >= 1")
    if args.iterations < 2:
        parser.error(f"--iterations {args.iterations}: at least 2 (the first, a warm-up, is left "
                     "out)")
    if args.short_s <= 0:
        parser.error(f"--short-s {args.short_s:g}: must be > 0")
    if args.one:
        print(json.dumps(one_run(args.task, args.gmis, args.num_envs, args.iterations)))
        return
    try:
        _config(args.task)
    except ValueError as e:
        parser.error(f"--task {args.task}: {' '.join(str(e).split())}")
    print(f"{args.task}, {args.gmis} GMI(s) x {args.num_envs} envs, {args.iterations} "
          f"iterations per run, {args.repeats} runs (env steps/s)\n")
    print(f"| run | mean, first {args.short_s:g} s | mean, whole run | median, whole run | "
          "measured s |\n|---:|---:|---:|---:|---:|")
    rows = []
    for run in range(args.repeats):
        out = subprocess.run([sys.executable, __file__, "--one", "--task", args.task, "--gmis",
                              str(args.gmis), "--num-envs", str(args.num_envs), "--iterations",
                              str(args.iterations)], capture_output=True, text=True)
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output on stderr"])[-1].strip()
            raise ValueError(f"run {run + 1} failed (exit code {out.returncode}): {last}")
        iters = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(estimators(iters, args.short_s))
        print(f"| {run + 1} | " + " | ".join(f"{v:,.0f}" for v in rows[-1])
              + f" | {sum(t for _, t in iters):.1f} |", flush=True)
    print("| spread | " + " | ".join(f"{spread(list(col)):.0%}" for col in zip(*rows)) + " | |")


if __name__ == "__main__":
    main()
