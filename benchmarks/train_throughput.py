"""Training throughput and time-to-solve: gmi-drl PPO vs Stable-Baselines3 PPO, one invocation.

    .venv/bin/python benchmarks/train_throughput.py                      # both parts, 3 repeats
    .venv/bin/python benchmarks/train_throughput.py --parts hopper --repeats 1

Part ``hopper``: Hopper-v5, 8 envs, rollout 2048 steps per env, 10 epochs, minibatch 64, running
observation and reward normalisation (SB3: VecNormalize), 64-64 tanh MLPs, one torch thread for
both by default (``--sb3-default-threads`` also runs SB3 with torch's default thread count, as
a user gets it). Envs: SB3 DummyVecEnv (Gymnasium envs one after another in the training
process); gmi-drl its native MuJoCo pool (in-process, its own thread pool).
Train steps/s = env steps / wall time of the training call (collection + updates). Target:
gmi-drl >= 4x SB3.

Part ``cartpole``: wall time until the mean return of the last 20 episodes first reaches 475 on
CartPole-v1, both with RL-Zoo's CartPole hyper-parameters (8 envs, 32 steps, 20 epochs,
minibatch 256, gamma 0.98, lambda 0.8, lr 1e-3 annealed; SB3 also anneals clip 0.2 linearly,
gmi-drl keeps it fixed). Target: gmi-drl <= 0.5x SB3.
Every figure is the median over ``--repeats`` runs (seeds 1..repeats), runs alternating.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import tyro

from gmi_drl.config import preset
from gmi_drl.telemetry.summary import first_crossing
from gmi_drl.train import train


@dataclass
class Args:
    parts: list[Literal["hopper", "cartpole"]] = field(default_factory=lambda: ["hopper", "cartpole"])
    """which comparisons to run"""
    repeats: int = 3
    """runs per framework (median reported)"""
    hopper_updates: int = 2
    """PPO updates per Hopper run (each 16,384 env steps)"""
    cartpole_budget: int = 100_000
    """CartPole step budget (RL-Zoo's n_timesteps); a run that never reaches 475 counts as inf"""
    sb3_default_threads: bool = False
    """also run SB3 with torch's default thread count (its out-of-the-box setting)"""


def _gmi_hopper(seed: int, updates: int, out: Path) -> float:
    cfg = preset("mujoco", "Hopper-v5")
    cfg.env.num_envs, cfg.ppo.num_steps, cfg.ppo.num_minibatches = 8, 2048, 256
    cfg.seed, cfg.total_timesteps = seed, updates * 8 * 2048
    cfg.run_dir, cfg.log.tensorboard = str(out / f"gmi-hopper-{seed}"), False
    r = train(cfg)
    return r.global_step / r.wall_s


def _sb3_hopper(seed: int, updates: int) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_vec_env("Hopper-v5", n_envs=8, seed=seed), gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4,
                gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, max_grad_norm=0.5,
                seed=seed, device="cpu")
    steps = updates * 8 * 2048
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - t0
    env.close()
    return steps / wall


def _gmi_cartpole(seed: int, budget: int, out: Path) -> float:
    cfg = preset("cartpole-zoo")
    cfg.seed, cfg.total_timesteps = seed, budget
    cfg.run_dir, cfg.log.tensorboard = str(out / f"gmi-cartpole-{seed}"), False
    r = train(cfg)
    hit = first_crossing(r.episode_steps, r.episode_returns, r.episode_wall_s, 475.0)
    return hit[1] if hit else float("inf")


def _sb3_cartpole(seed: int, budget: int) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class StopAt475(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: list[float] = []
            self.reached_s = float("inf")
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
            if len(self.returns) >= 20 and np.mean(self.returns[-20:]) >= 475:
                self.reached_s = time.perf_counter() - self.t0
                return False
            return True

    def lin(v: float):
        return lambda progress_remaining: progress_remaining * v

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                n_epochs=20, ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2),
                seed=seed, device="cpu")
    cb = StopAt475()
    cb.t0 = time.perf_counter()
    model.learn(total_timesteps=budget, callback=cb)
    env.close()
    return cb.reached_s


def _row(name: str, gmi: list[float], sb3: list[float], unit: str, ratio_name: str) -> None:
    g, s = statistics.median(gmi), statistics.median(sb3)
    print(f"{name:<34} | {g:>10.1f} | {s:>10.1f} | {unit:<8} | {ratio_name} = {g / s:.2f}")
    print(f"{'':<34} | runs gmi-drl {['%.1f' % x for x in gmi]}, sb3 {['%.1f' % x for x in sb3]}")


def _threads(n: int, fn, *a):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn(*a)
    finally:
        torch.set_num_threads(previous)


def main(args: Args) -> None:
    logging.basicConfig(level=logging.WARNING)
    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = Path(tempfile.mkdtemp(prefix="gmi-bench-"))
    print(f"{'benchmark':<34} | {'gmi-drl':>10} | {'SB3':>10} | {'unit':<8} | ratio")
    parts = {"hopper": ("Hopper-v5 PPO train throughput", _gmi_hopper, _sb3_hopper,
                        args.hopper_updates, "steps/s", "gmi/SB3 (target >= 4)"),
             "cartpole": ("CartPole-v1 time to 475", _gmi_cartpole, _sb3_cartpole,
                          args.cartpole_budget, "s", "gmi/SB3 (target <= 0.5)")}
    for part in args.parts:
        title, gmi_fn, sb3_fn, budget, unit, ratio = parts[part]
        gmi, sb3, sb3_default = [], [], []
        for seed in range(1, args.repeats + 1):
            gmi.append(gmi_fn(seed, budget, out))
            sb3.append(sb3_fn(seed, budget))
            if args.sb3_default_threads:
                sb3_default.append(_threads(default_threads, sb3_fn, seed, budget))
        _row(title, gmi, sb3, unit, ratio)
        if sb3_default:
            _row(f"  vs SB3 with {default_threads} torch threads", gmi, sb3_default, unit,
                 "gmi/SB3")
    print(f"(run dirs under {out})")


if __name__ == "__main__":
    main(tyro.cli(Args))
