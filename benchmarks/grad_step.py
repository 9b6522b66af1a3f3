"""The off-policy update alone, by execution path: eager, compiled, compiled + CUDA graphs.

    .venv/bin/python benchmarks/grad_step.py                       # CPU: eager vs compiled
    python benchmarks/grad_step.py --device cuda --repeats 5       # and the CUDA-graph path

Times ``update()`` of DQN (the ``cartpole-zoo`` preset: 256:256 ReLU, batch 64, 128 gradient
steps per update) and DDPG (the ``mujoco`` preset on HalfCheetah-v5's shapes: 400:300 ReLU,
batch 256, one critic and one actor step per update) on a replay of random transitions, with
no envs: what each path costs per gradient step, replay sampling and target updates included.
Microseconds per gradient step (DDPG: per critic + actor pair), medians of ``--repeats``
timed blocks after a warm-up block (compilation, graph capture); paths alternate.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import tyro

from gmi_drl.algos import AlgoContext, build_algorithm
from gmi_drl.config import preset
from gmi_drl.envs.spec import EnvSpec
from gmi_drl.optim.grad_step import make_grad_step
from gmi_drl.rollout.replay import make_replay

SPECS = {"dqn": ("cartpole-zoo", EnvSpec("CartPole-v1", gym.spaces.Box(-5, 5, (4,), np.float32),
                                         gym.spaces.Discrete(2), None)),
         "ddpg": ("mujoco", EnvSpec("HalfCheetah-v5",
                                    gym.spaces.Box(-np.inf, np.inf, (17,), np.float64),
                                    gym.spaces.Box(-1, 1, (6,), np.float32), None))}
PATHS = {"eager": dict(compile=False, cuda_graphs=False),
         "compiled": dict(compile=True, cuda_graphs=False),
         "compiled + CUDA graphs": dict(compile=True, cuda_graphs=True)}


@dataclass
class Args:
    algos: tuple[str, ...] = ("dqn", "ddpg")
    """which updates to time: dqn, ddpg"""
    device: str = "cpu"
    """cpu or cuda (the CUDA-graph path runs on cuda only)"""
    repeats: int = 5
    """timed blocks per path (median reported; >= 1)"""
    steps: int = 256
    """gradient steps per timed block (>= 1; rounded down to whole updates, at least one)"""


def _learner(algo: str, device: torch.device, **step_kw):
    """The algorithm with a replay of 10,000 random transitions; returns ``(algo, steps per
    update)``."""
    name, spec = SPECS[algo]
    cfg = preset(name, algo=algo)
    ctx = AlgoContext(spec, 1, cfg.model, 100, 1,
                      functools.partial(make_grad_step, **step_kw),
                      torch.Generator(device).manual_seed(1), device)
    torch.manual_seed(0)
    learner = build_algorithm(cfg.algo, ctx)
    learner.replay = make_replay(10_000, spec, 1, device)
    g = np.random.default_rng(0)
    obs_shape = spec.observation_space.shape
    for _ in range(10_000 // 1000):
        obs = g.standard_normal((1000, *obs_shape)).astype(np.float32)
        if isinstance(spec.action_space, gym.spaces.Discrete):
            actions = g.integers(0, spec.action_space.n, 1000)
        else:
            actions = g.uniform(-1, 1, (1000, *spec.action_space.shape)).astype(np.float32)
        learner.replay.add(obs, actions, g.standard_normal(1000).astype(np.float32),
                           obs + 0.01, g.random(1000) < 0.01)
    learner.env_steps = 10**9  # past learning_starts
    return learner, cfg.algo.gradient_steps


def _block(learner, updates: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(updates):
        learner.env_steps += learner.steps_per_iteration  # as collect would: DQN's target moves
        learner.update()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _check(args: Args) -> None:
    """Refuse, before any measurement, what the benchmark cannot run."""
    unknown = [a for a in args.algos if a not in SPECS]
    if unknown:
        raise ValueError(f"--algos {' '.join(unknown)}: unknown; choose from {', '.join(SPECS)}")
    try:
        kind = torch.device(args.device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device {args.device}: cpu or cuda (cuda:K for one GPU)")
    for flag, value in (("--repeats", args.repeats), ("--steps", args.steps)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")


def main(args: Args) -> None:
    _check(args)
    if args.device != "cpu" and not torch.cuda.is_available():
        print("skipped: no CUDA device here (run with --device cpu for the eager and compiled "
              "paths)")
        return
    torch.set_num_threads(1)
    device = torch.device(args.device)
    for algo in args.algos:
        paths = {name: kw for name, kw in PATHS.items()
                 if device.type == "cuda" or not kw["cuda_graphs"]}
        learners = {name: _learner(algo, device, **kw) for name, kw in paths.items()}
        updates = {name: max(1, args.steps // n) for name, (_, n) in learners.items()}
        block = updates["eager"] * learners["eager"][1]  # whole updates: may differ from --steps
        first = {name: _block(learner, updates[name], device)
                 for name, (learner, _) in learners.items()}
        times = {name: [] for name in paths}
        for _ in range(args.repeats):
            for name, (learner, n) in learners.items():
                times[name].append(_block(learner, updates[name], device)
                                   / (updates[name] * n) * 1e6)
        print(f"\n{algo} update ({SPECS[algo][0]} preset), device {device}, us per gradient "
              f"step, median of {args.repeats} blocks of {block}")
        print(f"{'path':<24} | {'us/step':>8} | {'vs eager':>8} | {'first block s':>13} | runs")
        eager = statistics.median(times["eager"])
        for name in paths:
            med = statistics.median(times[name])
            print(f"{name:<24} | {med:>8.1f} | {eager / med:>7.2f}x | {first[name]:>13.2f} | "
                  f"{['%.1f' % t for t in times[name]]}")


if __name__ == "__main__":
    main(tyro.cli(Args))
