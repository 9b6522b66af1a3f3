"""The drop-in faces: what they cost over the raw pool, and SB3 trained on them vs SubprocVecEnv.

    .venv/bin/python benchmarks/faces.py                       # both parts, 5 / 3 repeats
    .venv/bin/python benchmarks/faces.py --parts overhead --repeats 9

Part ``overhead``: Hopper-v5, 8 envs, random actions drawn before timing; steps/s of the raw
pool (``pool.step``) and of the faces over it: the Gymnasium face (`gmi_drl.envs.make_vec`,
next-step autoreset, copies on and off) against a next-step pool, the SB3 face
(`gmi_drl.envs.sb3.make_vec_env`, SB3's same-step autoreset) against a same-step pool, each
``--seconds`` per repeat, all alternating. Target: every face within 5% of its pool (ratio
>= 0.95).

Part ``sb3``: Stable-Baselines3 PPO (``MlpPolicy``, n_steps 256, batch 64, 10 epochs, one torch
thread) on Hopper-v5 with 8 envs, on SB3's ``SubprocVecEnv`` (one process per env) and on the
SB3 face, ``--sb3-steps`` env steps each, alternating. Env-side seconds per rollout: time in
``step_async`` + ``step_wait`` (a pass-through wrapper times them), divided by the rollouts.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import tyro

TASK, ENVS = "Hopper-v5", 8
ROLLOUT = 256 * ENVS  # SB3 PPO's n_steps x envs: it learns in whole rollouts


@dataclass
class Args:
    parts: list[Literal["overhead", "sb3"]] = field(default_factory=lambda: ["overhead", "sb3"])
    repeats: int = 5
    """repeats per path (median reported); the sb3 part runs max(1, repeats // 2) of each"""
    seconds: float = 3.0
    """seconds per overhead measurement"""
    sb3_steps: int = 16_384
    """env steps of each SB3 PPO run (8 rollouts of 2,048; SB3 rounds up to whole rollouts)"""


def _rate(step, actions: np.ndarray, seconds: float) -> float:
    n, k, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step(actions[k])
        k = (k + 1) % len(actions)
        n += 1
    return n * ENVS / (time.perf_counter() - t0)


def overhead(args: Args) -> None:
    import gmi_drl.envs as envs
    from gmi_drl.envs.sb3 import make_vec_env

    actions = np.random.default_rng(0).uniform(-1, 1, (4096, ENVS, 3)).astype(np.float32)
    next_step = envs.make(TASK, ENVS, seed=0)
    same_step = envs.make(TASK, ENVS, seed=0, autoreset="same_step")
    owned, views = envs.make_vec(TASK, ENVS), envs.make_vec(TASK, ENVS, copy=False)
    sb3 = make_vec_env(TASK, ENVS, seed=0)
    for env in (next_step, same_step, sb3):
        env.reset()
    owned.reset(seed=0)
    views.reset(seed=0)
    paths = {"pool.step, next-step": (next_step.step, None),
             "Gymnasium face": (owned.step, "pool.step, next-step"),
             "Gymnasium face, copy=False": (views.step, "pool.step, next-step"),
             "pool.step, same-step": (same_step.step, None),
             "SB3 face": (sb3.step, "pool.step, same-step")}
    rates = {name: [] for name in paths}
    for _ in range(args.repeats):
        for name, (step, _) in paths.items():
            rates[name].append(_rate(step, actions, args.seconds))
    print(f"\n{TASK}, {ENVS} envs, random actions, median of {args.repeats} x {args.seconds:g} s "
          "(paths alternating)\n")
    print("| path | steps/s | ratio to its pool (target >= 0.95) | runs |")
    print("|---|---:|---:|---|")
    for name, (_, pool) in paths.items():
        med = statistics.median(rates[name])
        ratio = f"{med / statistics.median(rates[pool]):.3f}" if pool else "-"
        print(f"| {name} | {med:,.0f} | {ratio} | {', '.join(f'{r:,.0f}' for r in rates[name])} |")
    for env in (next_step, same_step, owned, views, sb3):
        env.close()


def _timed(venv):
    """A pass-through VecEnv wrapper that sums the seconds of step_async + step_wait."""
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class Timed(VecEnvWrapper):
        env_s = 0.0

        def reset(self):
            return self.venv.reset()

        def step_async(self, actions):
            t0 = time.perf_counter()
            self.venv.step_async(actions)
            self.env_s += time.perf_counter() - t0

        def step_wait(self):
            t0 = time.perf_counter()
            out = self.venv.step_wait()
            self.env_s += time.perf_counter() - t0
            return out

    return Timed(venv)


def _sb3_run(kind: str, steps: int, seed: int) -> tuple[float, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from gmi_drl.envs.sb3 import make_vec_env

    if kind == "SubprocVecEnv":
        venv = sb3_make_vec_env(TASK, n_envs=ENVS, seed=seed, vec_env_cls=SubprocVecEnv)
    else:
        venv = make_vec_env(TASK, ENVS, seed=seed)
    env = _timed(venv)
    model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, n_epochs=10, seed=seed,
                device="cpu")
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - t0
    env.close()
    done = model.num_timesteps  # whole rollouts: `steps` rounded up to 2,048
    return done / wall, env.env_s / (done / ROLLOUT)


def sb3(args: Args) -> None:
    torch.set_num_threads(1)
    repeats = max(1, args.repeats // 2)
    runs = {"SubprocVecEnv": [], "gmi-drl SB3 face": []}
    for r in range(repeats):
        for kind in runs:
            runs[kind].append(_sb3_run(kind, args.sb3_steps, seed=r + 1))
    steps = -(-args.sb3_steps // ROLLOUT) * ROLLOUT
    print(f"\nSB3 PPO on {TASK}, {ENVS} envs, {steps:,} steps per run, median of "
          f"{repeats} (alternating)\n")
    print("| VecEnv | train steps/s | env s per rollout (2,048 steps) | runs (steps/s) |")
    print("|---|---:|---:|---|")
    for kind, rows in runs.items():
        sps, env_s = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
        print(f"| {kind} | {sps:,.0f} | {env_s:.3f} | {', '.join(f'{r[0]:,.0f}' for r in rows)} |")
    a, b = (statistics.median(r[0] for r in runs[k]) for k in runs)
    print(f"\ntrain steps/s, face / SubprocVecEnv = {b / a:.2f}")


def main(args: Args) -> None:
    if args.seconds <= 0:
        raise ValueError(f"--seconds {args.seconds} must be > 0")
    if args.sb3_steps < 1:
        raise ValueError(f"--sb3-steps {args.sb3_steps} must be >= 1")
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats} must be >= 1")
    if "overhead" in args.parts:
        overhead(args)
    if "sb3" in args.parts:
        sb3(args)


if __name__ == "__main__":
    main(tyro.cli(Args))
