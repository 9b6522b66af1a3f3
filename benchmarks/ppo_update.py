"""One PPO update and one acting step, by execution path: compiled, eager, hand-derived NumPy.

    .venv/bin/python benchmarks/ppo_update.py                          # this checkout's paths
    .venv/bin/python benchmarks/ppo_update.py --baseline ../old-checkout

Hopper-v5's shapes (11 observations, 3 actions, 64-64 tanh MLPs), 8 envs x 2048 steps per
rollout, 10 epochs of minibatch 64 (2,560 gradient steps per update), one torch thread. The
rollout is random (fixed seed) and the same for every path. Update: seconds per
`PPO.update()`, the first call (compilation) left out and printed apart; acting: microseconds
per ``act`` of 8 observations. Medians of ``--repeats``; paths alternate.

``--baseline DIR``: a gmi-drl checkout from before the runner refactor (``<= 21df3e1``, e.g.
``git worktree add ../old 21df3e1`` with its C++ cores built), whose PPO takes a ``Batch`` and
has the hand-derived NumPy gradient (``ppo.fast_path``); its update runs in a subprocess with
the same data, with the hand gradient and with autograd. Target (issue "One runner ..."): the
compiled update within 15% of the hand-derived one.
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import tyro

OBS, ACT, ENVS, STEPS, MINIBATCH, EPOCHS = 11, 3, 8, 2048, 64, 10
N = ENVS * STEPS


@dataclass
class Args:
    repeats: int = 5
    """timed updates per path (after the first, timed apart), the paths alternating"""
    baseline: str | None = None
    """a checkout with the hand-derived NumPy gradient (see the module docstring)"""


def _rollout(seed: int = 0) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    return {"obs": g.standard_normal((N, OBS)).astype(np.float32),
            "actions": g.uniform(-1, 1, (N, ACT)).astype(np.float32),
            "logprobs": -g.uniform(1, 4, N).astype(np.float32),
            "values": g.standard_normal(N).astype(np.float32),
            "advantages": g.standard_normal(N).astype(np.float32),
            "returns": g.standard_normal(N).astype(np.float32)}


def _spaces():
    return gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float64), gym.spaces.Box(-1, 1, (ACT,))


def _this_update(compile: bool, data):
    """``(seconds of the first update, run one more update)`` for this checkout's PPO."""
    from gmi_drl.algos import AlgoContext, ModelConfig, PPOConfig, build_algorithm
    from gmi_drl.envs.spec import EnvSpec
    from gmi_drl.optim.grad_step import make_grad_step

    obs_space, act_space = _spaces()
    cfg = PPOConfig(num_steps=STEPS, learning_rate=3e-4, num_minibatches=N // MINIBATCH,
                    update_epochs=EPOCHS, ent_coef=0.0, anneal_lr=False)
    ctx = AlgoContext(EnvSpec("Hopper-v5", obs_space, act_space, None), ENVS, ModelConfig(), 10,
                      1, functools.partial(make_grad_step, compile=compile), torch.Generator())
    torch.manual_seed(0)
    algo = build_algorithm(cfg, ctx)
    b = algo.buf
    for name, value in data.items():
        getattr(b, name).view(N, -1).copy_(torch.from_numpy(value).view(N, -1))
    return _seconds(algo.update), lambda: _seconds(algo.update)


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


BASELINE_SNIPPET = """
import sys, time, numpy as np, torch, gymnasium as gym
torch.set_num_threads(1)
from gmi_drl.algos.ppo import PPO, PPOConfig
from gmi_drl.models import build_actor_critic
from gmi_drl.rollout.storage import Batch
data = np.load(sys.argv[2])
n = len(data["obs"])
cfg = PPOConfig(num_steps=2048, learning_rate=3e-4, num_minibatches=n // 64, update_epochs=10,
                ent_coef=0.0, anneal_lr=False, fast_path=sys.argv[1] == "1")
torch.manual_seed(0)
model = build_actor_critic(gym.spaces.Box(-np.inf, np.inf, (11,), np.float64),
                           gym.spaces.Box(-1, 1, (3,)))
learner = PPO(cfg, model, n, 10)
batch = Batch(*(torch.from_numpy(data[k]) for k in
                ("obs", "actions", "logprobs", "values", "advantages", "returns")))
for line in sys.stdin:
    t0 = time.perf_counter(); learner.update(batch)
    print(time.perf_counter() - t0, flush=True)
"""
"""the old API's update, in ``--baseline``'s interpreter with that checkout on its path: one
update per line read from stdin, its seconds printed"""


def _baseline_update(checkout: Path, fast: bool, data_path: Path):
    """Like `_this_update`, for the baseline checkout's PPO in a subprocess kept open.

    Raises:
        ValueError: the subprocess failed (the last line of its stderr).
    """
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    err_path = data_path.with_name(f"baseline-{'hand' if fast else 'autograd'}.stderr")
    with open(err_path, "w") as err:  # a file, not a pipe: nobody reads it while it runs
        proc = subprocess.Popen([sys.executable, "-c", BASELINE_SNIPPET, "1" if fast else "0",
                                 str(data_path)], env=env, cwd=checkout, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True)

    def one() -> float:
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        except BrokenPipeError:  # it died: reported below
            pass
        line = proc.stdout.readline()
        if not line:
            last = (err_path.read_text().strip().splitlines() or ["no output on stderr"])[-1]
            raise ValueError(f"--baseline {checkout}: its {'hand-derived' if fast else 'autograd'}"
                             f" update failed (exit code {proc.wait()}): {last.strip()}")
        return float(line)

    return one(), one


def _acting(repeats: int) -> dict[str, list[float]]:
    from gmi_drl.models import build_actor_critic
    from gmi_drl.rollout.acting import CompiledActing, NumpyActing, TorchActing
    from gmi_drl.rollout.arrays import HostArrays

    torch.manual_seed(0)
    model = build_actor_critic(*_spaces())
    gen = torch.Generator().manual_seed(0)
    obs = np.random.default_rng(1).standard_normal((ENVS, OBS)).astype(np.float32)
    paths = {"NumPy twin": NumpyActing(model, gen),
             "torch.compile": CompiledActing(model, gen, HostArrays()),
             "torch eager": TorchActing(model, gen, HostArrays())}
    for acting in paths.values():
        acting.act(obs)  # compiles
    out = {name: [] for name in paths}
    for _ in range(repeats):
        for name, acting in paths.items():
            t0 = time.perf_counter()
            for _ in range(2000):
                acting.act(obs)
            out[name].append((time.perf_counter() - t0) / 2000 * 1e6)
    return out


def _check(args: Args) -> None:
    """Refuse, before any compile, what the benchmark cannot run."""
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: must be >= 1")
    if args.baseline and not (Path(args.baseline) / "gmi_drl" / "algos" / "ppo_fast.py").is_file():
        raise ValueError(f"--baseline {args.baseline}: expected a gmi-drl checkout from before the "
                         "runner refactor (<= 21df3e1, e.g. git worktree add ../old 21df3e1, its "
                         "C++ cores built), which has gmi_drl/algos/ppo_fast.py (the hand-derived "
                         "NumPy gradient)")


def main(args: Args) -> None:
    import tempfile

    _check(args)
    torch.set_num_threads(1)
    data = _rollout()
    paths = {"compiled (torch.compile, this checkout)": _this_update(True, data),
             "eager autograd (this checkout)": _this_update(False, data)}
    with tempfile.TemporaryDirectory(prefix="ppo-update-") as tmp:  # baseline rollout, stderr
        if args.baseline:
            path = Path(tmp) / "rollout.npz"
            np.savez(path, **data)
            base = Path(args.baseline).resolve()
            paths["hand-derived NumPy gradient (baseline)"] = _baseline_update(base, True, path)
            paths["eager autograd (baseline)"] = _baseline_update(base, False, path)
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.repeats):  # the paths alternate
            for name, (_, update) in paths.items():
                times[name].append(update())
    print(f"PPO update, Hopper-v5 shapes, {N:,} samples x {EPOCHS} epochs, minibatch "
          f"{MINIBATCH} ({N // MINIBATCH * EPOCHS:,} gradient steps), one thread")
    print(f"{'path':<42} | {'s/update':>9} | {'first s':>8} | runs")
    for name, (first, _) in paths.items():
        print(f"{name:<42} | {statistics.median(times[name]):>9.3f} | {first:>8.1f} | "
              f"{['%.3f' % t for t in times[name]]}")
    hand = times.get("hand-derived NumPy gradient (baseline)")
    if hand:
        ratio = (statistics.median(times["compiled (torch.compile, this checkout)"])
                 / statistics.median(hand))
        print(f"compiled / hand-derived time = {ratio:.2f} (target <= 1.15)")
    print(f"\nacting, {ENVS} observations per call, us per call")
    for name, runs in _acting(args.repeats).items():
        print(f"{name:<42} | {statistics.median(runs):>9.1f} | runs "
              f"{['%.1f' % t for t in runs]}")


if __name__ == "__main__":
    main(tyro.cli(Args))
