"""Runs as GMIs against the same runs one after another: the seeds of one PPO command started by
``gmi-drl train ppo --seeds 1-N`` (every run a GMI of its own, packed onto the machine) against
N ``gmi-drl train ppo --seed k`` started in turn. One invocation, both sides, fresh processes.

    python benchmarks/runs.py --task Hopper-v5 --num-envs 8 --seeds 2 --repeats 3
    python benchmarks/runs.py --task Ant-gmi-v0 --num-envs 1024 --seeds 8 --device cuda

With ``--other-budget FLAGS`` a third side runs the GMIs again with those flags added (the
per-GMI budgets against the planner's defaults, an even share each), e.g. on a GPU::

    python benchmarks/runs.py --task Ant-gmi-v0 --num-envs 4096 --seeds 4 --device cuda \
        "--other-budget=--budget.threads-pct 100"

Printed: per side the wall seconds until every run finished (process start-up included) and the
aggregate env steps/s (every run's env steps over that wall time), medians of the repeats, and
their ratio (runs as GMIs / one after another; CPU target >= 1.4x with 2 seeds on 2 cores).
"""

from __future__ import annotations

import shlex
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
    """invocations of each side (their order rotates); the median is reported"""
    other_budget: str = ""
    """flags of a third side: the runs as GMIs with these ``--budget.*`` flags (shell words;
    give them as ``--other-budget=FLAGS``, as they start with ``--``)
    instead of the planner's default budgets; empty: no third side"""


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
    other = shlex.split(a.other_budget)
    names = ["gmis", "serial"] + (["other"] if other else [])
    walls: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base, steps = _command(a)
        for r in range(a.repeats):
            for side in names[r % len(names):] + names[:r % len(names)]:
                out = work / f"{side}-{r}"
                if side == "serial":
                    cmds = [base + ["--seed", str(s), "--run-dir", str(out / f"seed-{s}")]
                            for s in seeds]
                else:
                    cmds = [base + ["--seeds", f"1-{a.seeds}", "--run-dir", str(out)]
                            + (other if side == "other" else [])]
                walls[side].append(_timed(cmds, work))
                print(f"repeat {r + 1} {side}: {walls[side][-1]:.1f} s", flush=True)
    total = steps * a.seeds
    med = {n: statistics.median(w) for n, w in walls.items()}
    print(f"\n{a.seeds} PPO runs of {a.task}, {a.num_envs} envs each, {steps:,} env steps each, "
          f"device {a.device}; medians of {a.repeats}")
    print("| side | wall s | aggregate env steps/s |\n|---|---:|---:|")
    print(f"| runs as GMIs (--seeds), default budgets | {med['gmis']:.1f} | "
          f"{total / med['gmis']:,.0f} |")
    if other:
        print(f"| runs as GMIs, {a.other_budget} | {med['other']:.1f} | "
              f"{total / med['other']:,.0f} |")
    print(f"| one after another | {med['serial']:.1f} | {total / med['serial']:,.0f} |")
    print(f"ratio (GMIs / one after another): {med['serial'] / med['gmis']:.2f}x")
    if other:
        print(f"ratio (default budgets / {a.other_budget}): {med['other'] / med['gmis']:.2f}x")


if __name__ == "__main__":
    main(tyro.cli(Args))
