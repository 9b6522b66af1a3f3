"""Training throughput of this checkout against another one (the commit before a refactor), one
invocation: the guard a change to the runner, the loops or the learners is measured by.

    git worktree add ../base <commit>        # its compiled modules: make build there, or copy
    python benchmarks/checkouts.py --baseline ../base --repeats 3
    python benchmarks/checkouts.py --baseline ../base --cases appo-hopper --repeats 6

Cases (each a fresh process per run, the two checkouts alternating, the first side of each
pair alternating between repeats; steady env steps/s = after a run's first iteration, which
pays the one-time costs):

- ``ppo-hopper``: PPO Hopper-v5, 8 envs x 512 steps, 14 iterations (sync_training, 1 GMI).
- ``appo-hopper``: APPO Hopper-v5, 2 serving GMIs x 8 envs, 1 trainer GMI, 12 updates
  (async_training; its rate moves by 15% between runs on a 2-core machine: use 6 repeats).
- ``dqn-cartpole``: DQN CartPole-v1, the ``cartpole-zoo`` preset, 10,000 env steps.
- ``td3-pendulum``: TD3 Pendulum-v1, learning from step 1,000, 4,000 env steps.

Printed: per case the median of each side, their ratio (this / baseline; target >= 0.95) and
the median of the per-pair ratios. Both checkouts run with this interpreter: each run puts its
checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tyro

HERE = Path(__file__).resolve().parent.parent

CASES = {
    "ppo-hopper": ('cfg = preset("auto", "Hopper-v5", "ppo"); cfg.env.num_envs = 8; '
                   "cfg.algo.num_steps = 512; cfg.total_timesteps = 14 * cfg.batch_size"),
    "appo-hopper": ('cfg = preset("auto", "Hopper-v5", "appo"); cfg.gmi.serving_gmis = 2; '
                    "cfg.env.num_envs = 8; cfg.total_timesteps = 12 * cfg.batch_size"),
    "dqn-cartpole": ('cfg = preset("cartpole-zoo", "CartPole-v1", "dqn"); '
                     "cfg.total_timesteps = 10_000"),
    "td3-pendulum": ('cfg = preset("auto", "Pendulum-v1", "td3"); '
                     "cfg.algo.learning_starts = 1000; cfg.total_timesteps = 4_000; "
                     "cfg.log.log_every = 500"),
}

RUN = """
import json
from gmi_drl.config import preset
from gmi_drl.train import train
{setup}
cfg.run_dir, cfg.seed, cfg.log.tensorboard, cfg.checkpoint.every = {run_dir!r}, 1, False, 0
r = train(cfg)
print("RESULT", json.dumps({{"steady": r.steady_sps}}))
"""


@dataclass
class Args:
    baseline: str
    """the other checkout (a directory with its gmi_drl package and compiled modules)"""
    cases: list[str] = field(default_factory=lambda: list(CASES))
    """cases to run: ppo-hopper, appo-hopper, dqn-cartpole, td3-pendulum"""
    repeats: int = 3
    """runs per checkout and case (medians reported)"""


def _steady(checkout: Path, setup: str) -> float:
    """Steady env steps/s of one fresh run of ``setup`` with ``checkout``'s gmi_drl."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(checkout), MUJOCO_GL="disable")
        code = RUN.format(setup=setup, run_dir=f"{tmp}/run")
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=1800)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"a run of {checkout} failed:\n{out.stderr[-2000:]}")
    return json.loads(line[0][len("RESULT "):])["steady"]


def main(a: Args) -> None:
    unknown = sorted(set(a.cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}: use some of {list(CASES)}")
    sides = {"this": HERE, "baseline": Path(a.baseline).resolve()}
    got = {c: {s: [] for s in sides} for c in a.cases}
    for rep in range(a.repeats):
        for case in a.cases:
            for side in (("baseline", "this") if rep % 2 == 0 else ("this", "baseline")):
                got[case][side].append(_steady(sides[side], CASES[case]))
                print(f"{case} {side} {rep}: {got[case][side][-1]:,.0f} env steps/s", flush=True)
    print(f"\n| case | baseline ({a.baseline}) | this | this / baseline | median of pair ratios |"
          "\n|---|---:|---:|---:|---:|")
    for case, r in got.items():
        base, this = statistics.median(r["baseline"]), statistics.median(r["this"])
        pairs = statistics.median(t / b for b, t in zip(r["baseline"], r["this"]))
        print(f"| {case} | {base:,.0f} | {this:,.0f} | {this / base:.3f} | {pairs:.3f} |")


if __name__ == "__main__":
    main(tyro.cli(Args))
