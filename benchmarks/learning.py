"""Learning benchmark: does gmi-drl PPO reach the target returns, how fast, on how many seeds?

    .venv/bin/python benchmarks/learning.py                       # CartPole (3 seeds) + Hopper (3 seeds)
    .venv/bin/python benchmarks/learning.py --tasks cartpole --seeds 1 2 3
    .venv/bin/python benchmarks/learning.py --tasks hopper --seeds 1 --hopper-steps 1000000

Targets: CartPole-v1 mean return >= 475 over the last 20 episodes within 200k steps on 3/3
seeds (RL-Zoo's CartPole hyper-parameters, preset ``cartpole-zoo``); Hopper-v5 >= 1500 within 1M
steps on 2/3 seeds (CleanRL's MuJoCo hyper-parameters with 8 envs x 256 steps, i.e. CleanRL's
batch of 2048 and minibatch of 64). Prints one row per seed (first step and wall time at which
the 20-episode mean crossed the target, final mean, wall time, run dir with its learning curve).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from gmi_drl.config import TrainConfig, preset
from gmi_drl.telemetry.summary import first_crossing
from gmi_drl.train import train


@dataclass
class Args:
    tasks: list[Literal["cartpole", "hopper"]] = field(default_factory=lambda: ["cartpole", "hopper"])
    """which tasks to run"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """seeds per task"""
    cartpole_steps: int = 200_000
    """CartPole budget (env steps)"""
    hopper_steps: int = 1_000_000
    """Hopper budget (env steps)"""
    out_dir: str | None = None
    """where the runs go (default: a new ``runs/bench-learning-<time>/``; runs never overwrite)"""


TARGETS = {"cartpole": ("CartPole-v1", 475.0, 3), "hopper": ("Hopper-v5", 1500.0, 2)}


def _config(task: str, seed: int, args: Args, out_dir: str) -> TrainConfig:
    if task == "cartpole":
        cfg = preset("cartpole-zoo")
        cfg.total_timesteps = args.cartpole_steps
    else:
        cfg = preset("mujoco", "Hopper-v5")
        cfg.env.num_envs, cfg.algo.num_steps = 8, 256
        cfg.total_timesteps = args.hopper_steps
    cfg.seed = seed
    cfg.run_dir = str(Path(out_dir) / f"{task}-seed{seed}")
    cfg.log.tensorboard = False
    return cfg


def main(args: Args) -> None:
    logging.basicConfig(level=logging.WARNING)
    out_dir = args.out_dir or time.strftime("runs/bench-learning-%Y%m%d-%H%M%S")
    for task in args.tasks:
        task_id, target, need = TARGETS[task]
        print(f"\n{task_id}: target mean(last 20) >= {target:g}, needed on {need}/{len(args.seeds)} seeds")
        print(f"{'seed':>4} | {'reached at step':>15} | {'reached at s':>12} | {'final mean':>10} | "
              f"{'wall s':>7} | {'sps':>6} | run dir")
        passed = 0
        for seed in args.seeds:
            cfg = _config(task, seed, args, out_dir)
            r = train(cfg)
            hit = first_crossing(r.episode_steps, r.episode_returns, r.episode_wall_s, target)
            passed += hit is not None
            final = r.episode_returns[-20:].mean()
            print(f"{seed:>4} | {hit[0] if hit else '-':>15} | {f'{hit[1]:.1f}' if hit else '-':>12} | "
                  f"{final:>10.1f} | {r.wall_s:>7.1f} | {r.global_step / r.wall_s:>6.0f} | {r.run_dir}",
                  flush=True)
        verdict = "PASS" if passed >= need else "FAIL"
        print(f"{task_id}: reached on {passed}/{len(args.seeds)} seeds -> {verdict}")


if __name__ == "__main__":
    main(tyro.cli(Args))
