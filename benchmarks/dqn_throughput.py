"""DQN training throughput: gmi-drl DQN vs Stable-Baselines3 DQN, one invocation.

    .venv/bin/python benchmarks/dqn_throughput.py                 # 3 repeats, 10,000 steps each
    .venv/bin/python benchmarks/dqn_throughput.py --steps 20000 --repeats 5

CartPole-v1 with RL-Zoo's DQN hyper-parameters on both sides (1 env, 256:256 ReLU Q-network,
lr 2.3e-3, batch 64, replay 100k, learning starts 1,000, train every 256 steps with 128 gradient
steps, target update every 10 steps, epsilon 1 -> 0.04 over 16% of the run), one torch thread.
Train steps/s = env steps / wall time of the training call; gmi-drl's *steady* steps/s leaves
out the iterations up to the first gradient step's end (its one-time ``torch.compile``), from
the run's metrics.csv. Runs alternate (gmi-drl, SB3, gmi-drl, ...), each in a fresh process;
the medians and their ratio are printed. Target (issue 13): gmi-drl >= 3x SB3.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tyro

HERE = Path(__file__).resolve().parent.parent


@dataclass
class Args:
    steps: int = 10_000
    """env steps per run"""
    repeats: int = 3
    """runs per framework (median reported)"""


GMI = """
import json, sys, time
from gmi_drl.config import preset
from gmi_drl.train import train
cfg = preset("cartpole-zoo", algo="dqn")
cfg.total_timesteps, cfg.seed, cfg.run_dir = {steps}, {seed}, {run_dir!r}
cfg.log.tensorboard = False
t0 = time.perf_counter(); r = train(cfg); wall = time.perf_counter() - t0
print(json.dumps({{"steps": r.global_step, "wall": wall}}))
"""

SB3 = """
import json, time, torch
torch.set_num_threads(1)
import gymnasium as gym
from stable_baselines3 import DQN
m = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64,
        buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
        train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), seed={seed})
t0 = time.perf_counter(); m.learn({steps}); wall = time.perf_counter() - t0
print(json.dumps({{"steps": {steps}, "wall": wall}}))
"""


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _steady_sps(run_dir: Path, learning_starts: int) -> float:
    """Env steps per second over the iterations after the first one that trained."""
    rows = [r for r in csv.DictReader(open(run_dir / "metrics.csv"))
            if r["name"] in ("perf/update_s", "perf/rollout_s", "perf/log_s")]
    per_step: dict[int, float] = {}
    for r in rows:
        per_step[int(r["global_step"])] = per_step.get(int(r["global_step"]), 0.0) + float(r["value"])
    steps = sorted(s for s in per_step if s > learning_starts + 256)
    return (steps[-1] - steps[0]) / sum(per_step[s] for s in steps[1:]) if len(steps) > 1 else float("nan")


def main(args: Args) -> None:
    gmi, gmi_steady, sb3 = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.repeats + 1):
            run_dir = Path(tmp) / f"dqn-{seed}"
            r = _run(GMI.format(steps=args.steps, seed=seed, run_dir=str(run_dir)))
            gmi.append(r["steps"] / r["wall"])
            gmi_steady.append(_steady_sps(run_dir, 1000))
            s = _run(SB3.format(steps=args.steps, seed=seed))
            sb3.append(s["steps"] / s["wall"])
            print(f"seed {seed}: gmi-drl {gmi[-1]:,.0f} (steady {gmi_steady[-1]:,.0f}) | "
                  f"SB3 {sb3[-1]:,.0f} steps/s", flush=True)
    g, gs, s = (statistics.median(x) for x in (gmi, gmi_steady, sb3))
    print(f"\nDQN CartPole-v1, RL-Zoo hyper-parameters, {args.steps:,} steps, "
          f"median of {args.repeats}")
    print("| | gmi-drl | SB3 | ratio (target >= 3) |\n|---|---:|---:|---:|")
    print(f"| steps/s, whole call | {g:,.0f} | {s:,.0f} | {g / s:.2f} |")
    print(f"| steps/s, steady | {gs:,.0f} | {s:,.0f} | {gs / s:.2f} |")


if __name__ == "__main__":
    main(tyro.cli(Args))
