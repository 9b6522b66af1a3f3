"""Training throughput and time-to-solve: gmi-drl PPO vs Stable-Baselines3 PPO, one invocation.

    .venv/bin/python benchmarks/train_throughput.py                      # both parts, 3 repeats
    .venv/bin/python benchmarks/train_throughput.py --parts hopper --repeats 1
    .venv/bin/python benchmarks/train_throughput.py --parts hopper --baseline ../old-checkout

Part ``hopper``: Hopper-v5, 8 envs, rollout 2048 steps per env, 10 epochs, minibatch 64, running
observation and reward normalisation (SB3: VecNormalize), 64-64 tanh MLPs, one torch thread for
both by default (``--sb3-default-threads`` also runs SB3 with torch's default thread count, as
a user gets it). Envs: SB3 DummyVecEnv (Gymnasium envs one after another in the training
process); gmi-drl its native MuJoCo pool (in-process, its own thread pool).
Train steps/s = env steps / wall time of the training call (collection + updates), and
*steady* steps/s = the same over the iterations after the first (from the run's metrics.csv),
which leaves out gmi-drl's one-time ``torch.compile`` of the first gradient step (its seconds
are printed too). Each gmi-drl run is a fresh process. ``--baseline DIR`` runs the same Hopper
job from another gmi-drl checkout (e.g. ``git worktree add ../old <commit>``, its C++ cores
built with ``python setup.py build_ext --inplace``) alternating with this one: its
``benchmarks/train_throughput.py`` must define ``_gmi_hopper(seed, updates, out_dir)``.
Targets: gmi-drl >= 4x SB3 (steady); this checkout >= 0.95x the baseline (steady).

Part ``cartpole``: wall time until the mean return of the last 20 episodes first reaches 475 on
CartPole-v1, both with RL-Zoo's CartPole hyper-parameters (8 envs, 32 steps, 20 epochs,
minibatch 256, gamma 0.98, lambda 0.8, lr 1e-3 annealed; SB3 also anneals clip 0.2 linearly,
gmi-drl keeps it fixed). Each gmi-drl run is a fresh process, after one warm-up run that leaves
torch's compile caches on disk as a user's first run would. Target: gmi-drl <= 0.25x SB3.
Every figure is the median over ``--repeats`` runs (seeds 1..repeats), runs alternating.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import subprocess
import sys
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

HERE = Path(__file__).resolve().parent.parent


@dataclass
class Args:
    parts: list[Literal["hopper", "cartpole"]] = field(default_factory=lambda: ["hopper", "cartpole"])
    """which comparisons to run"""
    repeats: int = 3
    """runs per framework (median reported; >= 1)"""
    hopper_updates: int = 4
    """PPO iterations per Hopper run, >= 2 (each 16,384 env steps; the first not in steady)"""
    cartpole_budget: int = 100_000
    """CartPole step budget (RL-Zoo's n_timesteps); a run that never reaches 475: not reached"""
    sb3_default_threads: bool = False
    """also run SB3 with torch's default thread count (its out-of-the-box setting)"""
    baseline: str | None = None
    """another gmi-drl checkout whose Hopper run alternates with this one's (see the module doc)"""


def _gmi_hopper(seed: int, updates: int, out: Path) -> float:
    cfg = preset("mujoco", "Hopper-v5")
    cfg.env.num_envs, cfg.algo.num_steps, cfg.algo.num_minibatches = 8, 2048, 256
    cfg.seed, cfg.total_timesteps = seed, updates * 8 * 2048
    cfg.run_dir, cfg.log.tensorboard = str(out / f"gmi-hopper-{seed}"), False
    r = train(cfg)
    return r.global_step / r.wall_s


def _fresh(checkout: Path, call: str) -> float:
    """``call`` (of a function of ``checkout``'s copy of this script) in a fresh process, as a
    user's run starts: torch's caches on disk as earlier runs left them, none in memory."""
    code = ("import runpy, sys, torch; from pathlib import Path; torch.set_num_threads(1); "
            f"ns = runpy.run_path({str(checkout / 'benchmarks' / 'train_throughput.py')!r}, "
            f"run_name='bench'); print(ns[{call.split('(')[0]!r}]({call.split('(', 1)[1]})")
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=checkout,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{call} of {checkout} failed (exit code {done.returncode}):"
                           f"\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def _checkout_hopper(checkout: Path, seed: int, updates: int, out: Path) -> tuple[float, float]:
    """``_gmi_hopper`` of ``checkout``'s copy of this script, in a fresh process; returns
    ``(steps/s of the call, steady steps/s)``."""
    whole = _fresh(checkout, f"_gmi_hopper({seed}, {updates}, Path({str(out)!r}))")
    return whole, _steady_sps(out / f"gmi-hopper-{seed}" / "metrics.csv")


def _first_update_extra_s(metrics_csv: Path) -> float:
    """Seconds the first iteration's update took beyond the median update: the one-time
    ``torch.compile`` of the gradient step."""
    import csv

    updates = [float(r["value"]) for r in csv.DictReader(open(metrics_csv))
               if r["name"] == "perf/update_s"]
    return updates[0] - statistics.median(updates)


def _steady_sps(metrics_csv: Path) -> float:
    """Env steps per second from the end of the first iteration to the end of the run: from
    the ``perf/sps`` rows (each the mean since the loop started, so elapsed = step / sps)."""
    import csv

    rows = [(int(r["global_step"]), float(r["value"])) for r in csv.DictReader(open(metrics_csv))
            if r["name"] == "perf/sps"]
    (s0, v0), (s1, v1) = rows[0], rows[-1]
    return (s1 - s0) / (s1 / v1 - s0 / v0)


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


def _fig(x: float) -> str:
    """A time to 475 of inf is a run that never reached it."""
    return f"{x:.1f}" if math.isfinite(x) else "not reached"


def _row(name: str, gmi: list[float], sb3: list[float], unit: str, ratio_name: str) -> None:
    g, s = statistics.median(gmi), statistics.median(sb3)
    ratio = f"{g / s:.2f}" if math.isfinite(g) and math.isfinite(s) else "n/a (not reached)"
    print(f"{name:<34} | {_fig(g):>10} | {_fig(s):>10} | {unit:<8} | {ratio_name} = {ratio}")
    print(f"{'':<34} | runs gmi-drl {[_fig(x) for x in gmi]}, peer {[_fig(x) for x in sb3]}")


def _threads(n: int, fn, *a):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn(*a)
    finally:
        torch.set_num_threads(previous)


def _check(args: Args) -> None:
    """Refuse, before any run, what the benchmark cannot measure."""
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: must be >= 1")
    if "hopper" in args.parts and args.hopper_updates < 2:
        raise ValueError(f"--hopper-updates {args.hopper_updates}: at least 2 (the first "
                         "update, which compiles, is left out of the steady figure)")
    if "cartpole" in args.parts and args.cartpole_budget < 1:
        raise ValueError(f"--cartpole-budget {args.cartpole_budget}: must be >= 1")
    if args.baseline and not (Path(args.baseline) / "benchmarks" / "train_throughput.py").is_file():
        raise ValueError(f"--baseline {args.baseline}: not a gmi-drl checkout (no "
                         "benchmarks/train_throughput.py in it)")


def main(args: Args) -> None:
    _check(args)
    logging.basicConfig(level=logging.WARNING)
    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = Path(tempfile.mkdtemp(prefix="gmi-bench-"))
    print(f"{'benchmark':<34} | {'gmi-drl':>10} | {'peer':>10} | {'unit':<8} | ratio")
    if "hopper" in args.parts:
        _hopper(args, out, default_threads)
    if "cartpole" in args.parts:
        gmi, sb3, compile_s = [], [], []
        warm = out / "warm-up"  # one run first: torch's compile caches warm, as after a user's
        first = _fresh(HERE, f"_gmi_cartpole(1, {args.cartpole_budget}, Path({str(warm)!r}))")
        first_s = _first_update_extra_s(warm / "gmi-cartpole-1" / "metrics.csv")
        for seed in range(1, args.repeats + 1):
            gmi.append(_fresh(HERE, f"_gmi_cartpole({seed}, {args.cartpole_budget}, "
                                    f"Path({str(out)!r}))"))
            sb3.append(_sb3_cartpole(seed, args.cartpole_budget))
            compile_s.append(_first_update_extra_s(out / f"gmi-cartpole-{seed}" / "metrics.csv"))
        _row("CartPole-v1 time to 475 (SB3)", gmi, sb3, "s", "gmi/SB3 (target <= 0.25)")
        print(f"{'  of which compile (1st update)':<34} | {statistics.median(compile_s):>10.1f} | "
              f"{'':>10} | s        | runs {['%.1f' % x for x in compile_s]}")
        print(f"{'  warm-up run (caches as found)':<34} | {_fig(first):>10} | {'':>10} | s        "
              f"| of which compile {first_s:.1f} s")
    print(f"(run dirs under {out})")


def _hopper(args: Args, out: Path, default_threads: int) -> None:
    whole, steady, sb3, sb3_default, base_whole, base_steady = [], [], [], [], [], []
    for seed in range(1, args.repeats + 1):
        w, s = _checkout_hopper(HERE, seed, args.hopper_updates, out / "this")
        whole.append(w)
        steady.append(s)
        sb3.append(_sb3_hopper(seed, args.hopper_updates))
        if args.sb3_default_threads:
            sb3_default.append(_threads(default_threads, _sb3_hopper, seed, args.hopper_updates))
        if args.baseline:
            w, s = _checkout_hopper(Path(args.baseline).resolve(), seed, args.hopper_updates,
                                    out / "baseline")
            base_whole.append(w)
            base_steady.append(s)
    _row("Hopper-v5 PPO steps/s, steady (SB3)", steady, sb3, "steps/s", "gmi/SB3 (target >= 4)")
    _row("  whole call (SB3)", whole, sb3, "steps/s", "gmi/SB3")
    u, b = args.hopper_updates, 8 * 2048
    first_s = [u * b / w - (u - 1) * b / s for w, s in zip(whole, steady)]
    print(f"{'  first iteration (with compile)':<34} | {statistics.median(first_s):>10.1f} | "
          f"{'':>10} | s        | runs {['%.1f' % x for x in first_s]}")
    if sb3_default:
        _row(f"  vs SB3 with {default_threads} torch threads", steady, sb3_default, "steps/s",
             "gmi/SB3")
    if base_steady:
        _row("  steady (baseline checkout)", steady, base_steady, "steps/s",
             "this/baseline (target >= 0.95)")
        _row("  whole call (baseline checkout)", whole, base_whole, "steps/s", "this/baseline")


if __name__ == "__main__":
    main(tyro.cli(Args))
