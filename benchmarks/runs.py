"""Runs as GMIs against the same runs one after another: the seeds of one PPO command started by
``gmi-drl train ppo --seeds 1-N`` (every run a GMI of its own, packed onto the machine) against
N ``gmi-drl train ppo --seed k`` started in turn. One invocation, both sides, fresh processes.

    python benchmarks/runs.py --task Hopper-v5 --num-envs 8 --seeds 2 --repeats 3
    python benchmarks/runs.py --task Ant-gmi-v0 --num-envs 1024 --seeds 8 --device cuda

Printed: per side the wall seconds until every run finished (process start-up included) and the
aggregate env steps/s (every run's env steps over that wall time), medians of the repeats, and
their ratio (runs as GMIs / one after another; CPU target >= 1.4x with 2 seeds on 2 cores).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro


@dataclass
class Args:
    task: str = "Hopper-v5"
    """env.task-id of every run"""
    num_envs: int = 8
    """env.num-envs of each run"""
    seeds: int = 2
    """runs: seeds 1..seeds"""
    iterations: int = 3
    """PPO iterations of each run (of the task's preset: ``auto``)"""
    device: str = "cpu"
    """--device of each run"""
    repeats: int = 3
    """invocations of each side (their order alternates); the median is reported"""


def _command(a: Args) -> tuple[list[str], int]:
    """The command of one run (no seed, no run dir) and its env steps."""
    from gmi_drl.config import preset

    cfg = preset("auto", a.task, "ppo")
    cfg.env.num_envs = a.num_envs
    steps = a.iterations * cfg.batch_size
    return [sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--env.task-id", a.task,
            "--env.num-envs", str(a.num_envs), "--total-timesteps", str(steps), "--device",
            a.device, "--log.no-tensorboard", "--checkpoint.every", "0"], steps


def _timed(commands: list[list[str]], cwd: Path) -> float:
    t0 = time.perf_counter()
    for c in commands:
        subprocess.run(c, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(a: Args) -> None:
    seeds = list(range(1, a.seeds + 1))
    walls: dict[str, list[float]] = {"gmis": [], "serial": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base, steps = _command(a)
        for r in range(a.repeats):
            sides = ["gmis", "serial"] if r % 2 == 0 else ["serial", "gmis"]
            for side in sides:
                out = work / f"{side}-{r}"
                if side == "gmis":
                    cmds = [base + ["--seeds", f"1-{a.seeds}", "--run-dir", str(out)]]
                else:
                    cmds = [base + ["--seed", str(s), "--run-dir", str(out / f"seed-{s}")]
                            for s in seeds]
                walls[side].append(_timed(cmds, work))
                print(f"repeat {r + 1} {side}: {walls[side][-1]:.1f} s", flush=True)
    total = steps * a.seeds
    g, s = statistics.median(walls["gmis"]), statistics.median(walls["serial"])
    print(f"\n{a.seeds} PPO runs of {a.task}, {a.num_envs} envs each, {steps:,} env steps each, "
          f"device {a.device}; medians of {a.repeats}")
    print("| side | wall s | aggregate env steps/s |\n|---|---:|---:|")
    print(f"| runs as GMIs (--seeds) | {g:.1f} | {total / g:,.0f} |")
    print(f"| one after another | {s:.1f} | {total / s:,.0f} |")
    print(f"ratio (GMIs / one after another): {s / g:.2f}x")


if __name__ == "__main__":
    main(tyro.cli(Args))
