"""Training throughput of each algorithm against Stable-Baselines3 with the same
hyper-parameters, one invocation.

    .venv/bin/python benchmarks/algo_throughput.py                     # dqn, a2c, ddpg; 3 repeats
    .venv/bin/python benchmarks/algo_throughput.py --algos td3 --repeats 5
    .venv/bin/python benchmarks/algo_throughput.py --algos sac           # issue 49: >= 2x SB3
    .venv/bin/python benchmarks/algo_throughput.py --algos sac td3 --precisions fp32 bf16-mixed
    python benchmarks/algo_throughput.py --device cuda --sb3-device cpu   # each side's device

Cases (RL-Zoo hyper-parameters on both sides, one torch thread each):

- ``dqn``: CartPole-v1, 1 env, 256:256 ReLU, lr 2.3e-3, batch 64, replay 100k, learning starts
  1,000, train every 256 steps with 128 gradient steps, target every 10 steps; 10,000 steps.
- ``a2c``: CartPole-v1, 8 envs, 5 steps, 64:64 tanh actor and critic, RMSprop 7e-4; 50,000 steps.
- ``ddpg`` / ``td3``: HalfCheetah-v5, 1 env, 400:300 ReLU, lr 1e-3, batch 256, learning starts
  1,000 (RL-Zoo: 10,000; fewer, so the run measures training), Gaussian noise 0.1; 3,000 steps.
- ``sac``: HalfCheetah-v5, 1 env, 256:256 ReLU, lr 3e-4, batch 256, one gradient step per env
  step, entropy coefficient tuned from 1.0, learning starts 1,000; 3,000 steps.

``--precisions`` runs gmi-drl once per precision (``cfg.precision``: ``bf16-mixed`` computes
the gradient steps under autocast to bfloat16; SB3 runs in float32), one table row each.

Train steps/s = env steps / wall time of the training call. The *steady* steps/s count only
training: gmi-drl's leaves out the iterations up to the end of the first logged iteration after
``learning_starts`` (its one-time ``torch.compile``), from the run's metrics.csv; SB3's runs from
its first env step past ``learning_starts`` to its last (a callback's clock). The steady ratio
compares the two steady figures (the whole-run figures include the cheap steps before
``learning_starts``: a third of the DDPG/TD3 runs). Runs alternate (gmi-drl, SB3, ...), each
in a fresh process; medians and their ratios are printed. Targets: >= 3x SB3 (issue 13), SAC
>= 2x (issue 49).
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tyro

HERE = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    task_id: str
    steps: int
    learning_starts: int
    gmi: str
    """lines that set ``cfg`` from ``preset(...)``"""
    sb3: str
    """an SB3 model named ``m``"""
    target: float = 3.0
    """the steady ratio the issue asks for"""


CASES = {
    "dqn": Case("CartPole-v1", 10_000, 1000, 'cfg = preset("cartpole-zoo", algo="dqn")', """
from stable_baselines3 import DQN
m = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64,
        buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
        train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), seed=SEED,
        device=DEVICE)"""),
    "a2c": Case("CartPole-v1", 50_000, 0, 'cfg = preset("classic", algo="a2c")', """
from stable_baselines3 import A2C
from stable_baselines3.common.env_util import make_vec_env
m = A2C("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=SEED), ent_coef=0.0,
        seed=SEED, device=DEVICE)"""),
    "ddpg": Case("HalfCheetah-v5", 3_000, 1000, """cfg = preset("mujoco", algo="ddpg")
cfg.algo.learning_starts = 1000""", """
import numpy as np
from stable_baselines3 import DDPG
from stable_baselines3.common.noise import NormalActionNoise
env = gym.make("HalfCheetah-v5")
m = DDPG("MlpPolicy", env, learning_starts=1000, learning_rate=1e-3, batch_size=256,
         action_noise=NormalActionNoise(np.zeros(6), 0.1 * np.ones(6)),
         policy_kwargs=dict(net_arch=[400, 300]), seed=SEED, device=DEVICE)"""),
    "td3": Case("HalfCheetah-v5", 3_000, 1000, """cfg = preset("mujoco", algo="td3")
cfg.algo.learning_starts = 1000""", """
import numpy as np
from stable_baselines3 import TD3
from stable_baselines3.common.noise import NormalActionNoise
env = gym.make("HalfCheetah-v5")
m = TD3("MlpPolicy", env, learning_starts=1000, learning_rate=1e-3, batch_size=256,
        action_noise=NormalActionNoise(np.zeros(6), 0.1 * np.ones(6)),
        policy_kwargs=dict(net_arch=[400, 300]), seed=SEED, device=DEVICE)"""),
    "sac": Case("HalfCheetah-v5", 3_000, 1000, """cfg = preset("mujoco", algo="sac")
cfg.algo.learning_starts = 1000""", """
from stable_baselines3 import SAC
m = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), learning_starts=1000, learning_rate=3e-4,
        batch_size=256, policy_kwargs=dict(net_arch=[256, 256]), seed=SEED, device=DEVICE)""",
                2.0),
}


@dataclass
class Args:
    algos: tuple[str, ...] = ("dqn", "a2c", "ddpg")
    """cases to run (dqn, a2c, ddpg, td3, sac)"""
    repeats: int = 3
    """runs per framework and case (median reported)"""
    scale: float = 1.0
    """multiply every case's env steps by this"""
    device: str = "cpu"
    """gmi-drl's device (``cfg.device``): cpu or cuda"""
    sb3_device: str | None = None
    """SB3's ``device`` (None: the same as ``--device``)"""
    cuda_graphs: bool = True
    """gmi-drl's ``cfg.cuda_graphs`` (its gradient steps as CUDA graphs, with --device cuda)"""
    sb3: bool = True
    """run SB3's side too (--no-sb3: gmi-drl's figures alone, e.g. to compare its own options)"""
    precisions: tuple[str, ...] = ("fp32",)
    """gmi-drl's ``cfg.precision`` values, each run per repeat (fp32, bf16-mixed)"""


GMI = """
import json, time
from gmi_drl.config import preset
from gmi_drl.train import train
{setup}
cfg.total_timesteps, cfg.seed, cfg.run_dir = {steps}, {seed}, {run_dir!r}
cfg.device, cfg.cuda_graphs, cfg.precision = {device!r}, {cuda_graphs!r}, {precision!r}
cfg.log.tensorboard, cfg.log.log_every = False, max(1, {log_every})
t0 = time.perf_counter(); r = train(cfg); wall = time.perf_counter() - t0
print(json.dumps({{"steps": r.global_step, "wall": wall}}))
"""

SB3 = """
import json, time, torch
torch.set_num_threads(1)
import gymnasium as gym
from stable_baselines3.common.callbacks import BaseCallback
{model}


class Clock(BaseCallback):  # (env steps, seconds) at each step past learning_starts
    def __init__(self):
        super().__init__()
        self.first = self.last = None

    def _on_step(self):
        if self.num_timesteps > {learning_starts}:
            mark = (self.num_timesteps, time.perf_counter())
            self.first, self.last = self.first or mark, mark
        return True


clock = Clock()
t0 = time.perf_counter(); m.learn({steps}, callback=clock); wall = time.perf_counter() - t0
(s0, t_0), (s1, t_1) = clock.first, clock.last
print(json.dumps({{"steps": {steps}, "wall": wall, "steady": (s1 - s0) / (t_1 - t_0)}}))
"""


def _run(code: str, who: str) -> dict:
    """Runs ``code`` in a fresh interpreter; its last stdout line is JSON.

    Raises:
        ValueError: the run refused its config (a ConfigError or ValueError: these flags,
            ``--scale`` or ``--device``, make a config it cannot run), in one line.
        RuntimeError: the run failed otherwise, with its stderr's tail.
    """
    out = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True)
    if out.returncode:
        lines = out.stderr.splitlines()
        heads = [i for i, line in enumerate(lines) if re.match(r"[\w.]+: ", line)]
        kind, _, msg = (lines[heads[-1]] if heads else "").partition(": ")
        if kind.endswith(("ConfigError", "ValueError")):
            msg = " ".join([msg, *(line.strip() for line in lines[heads[-1] + 1:])])
            raise ValueError(f"the {who} run refused its config (set by --scale, --device and "
                             f"this script's case, not by train flags): {msg}")
        raise RuntimeError(f"the {who} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _steady_sps(run_dir: Path, learning_starts: int) -> float:
    """Env steps per second between the first logged row past ``learning_starts`` (so its
    compile is behind it) and the last one; each row's ``perf/sps`` is steps / seconds since the
    loop started, which gives the elapsed seconds at that row."""
    elapsed = {int(r["global_step"]): int(r["global_step"]) / float(r["value"])
               for r in csv.DictReader(open(run_dir / "metrics.csv"))
               if r["name"] == "perf/sps" and float(r["value"]) > 0}
    steps = sorted(s for s in elapsed if s > learning_starts)
    if len(steps) < 2:
        return float("nan")
    return (steps[-1] - steps[0]) / (elapsed[steps[-1]] - elapsed[steps[0]])


def _case(name: str, case: Case, args: Args, tmp: Path) -> list[tuple[float, ...]]:
    """Medians over the repeats, one row per ``--precisions`` value: gmi-drl's whole-call and
    steady steps/s, SB3's whole-call and steady steps/s (the same SB3 runs in every row)."""
    steps = int(case.steps * args.scale)
    gmi = {p: ([], []) for p in args.precisions}
    sb3, sb3_steady = [], []
    for seed in range(1, args.repeats + 1):
        line = []
        for precision, (whole, steady) in gmi.items():
            run_dir = tmp / f"{name}-{precision}-{seed}"
            # about 20 logged rows per run: the steady figure needs a few after learning_starts
            r = _run(GMI.format(setup=case.gmi, steps=steps, seed=seed, run_dir=str(run_dir),
                                log_every=f"{steps // 20} // cfg.batch_size",
                                device=args.device, cuda_graphs=args.cuda_graphs,
                                precision=precision), f"gmi-drl {name}")
            whole.append(r["steps"] / r["wall"])
            steady.append(_steady_sps(run_dir, case.learning_starts))
            line.append(f"gmi-drl {precision} {whole[-1]:,.0f} (steady {steady[-1]:,.0f})")
        if args.sb3:
            model = case.sb3.replace("SEED", str(seed)).replace(
                "DEVICE", repr(args.sb3_device or args.device))
            s = _run(SB3.format(model=model, steps=steps,
                                learning_starts=case.learning_starts), f"SB3 {name}")
        else:
            s = {"steps": float("nan"), "wall": 1.0, "steady": float("nan")}
        sb3.append(s["steps"] / s["wall"])
        sb3_steady.append(s["steady"])
        print(f"{name} seed {seed}: {' | '.join(line)} | SB3 {sb3[-1]:,.0f} "
              f"(steady {sb3_steady[-1]:,.0f}) steps/s", flush=True)
    theirs = [statistics.median(x) for x in (sb3, sb3_steady)]
    return [(p, statistics.median(w), statistics.median(st), *theirs)
            for p, (w, st) in gmi.items()]


def main(args: Args) -> None:
    unknown = [a for a in args.algos if a not in CASES]
    if unknown:
        raise ValueError(f"unknown --algos {unknown}: choose from {list(CASES)}")
    if args.repeats < 1 or args.scale <= 0:
        raise ValueError(f"--repeats {args.repeats} must be >= 1 and --scale {args.scale} > 0")
    from gmi_drl.optim.grad_step import PRECISIONS

    bad = [p for p in args.precisions if p not in PRECISIONS]
    if bad or not args.precisions:
        raise ValueError(f"--precisions {list(args.precisions)}: choose from {PRECISIONS}")
    import torch

    for device in {args.device, args.sb3_device or args.device} - {"cpu"}:
        if not torch.cuda.is_available():
            raise ValueError(f"--device/--sb3-device {device}: no CUDA device here")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.algos:
            case = CASES[name]
            rows += [(name, case, *row) for row in _case(name, case, args, Path(tmp))]
    print(f"\nTrain steps/s vs Stable-Baselines3, RL-Zoo hyper-parameters, one torch thread, "
          f"median of {args.repeats}; devices: gmi-drl {args.device}, SB3 "
          f"{args.sb3_device or args.device}"
          + (f"; gmi-drl's CUDA graphs {'on' if args.cuda_graphs else 'off'}"
             if args.device == "cuda" else ""))
    print("| algo | precision | task | env steps | gmi-drl | SB3 | ratio | gmi-drl steady | "
          "SB3 steady | steady ratio (target) |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, case, precision, g, gs, s, ss in rows:
        print(f"| {name} | {precision} | {case.task_id} | {int(case.steps * args.scale):,} | "
              f"{g:,.0f} | "
              f"{s:,.0f} | {g / s:.2f} | {gs:,.0f} | {ss:,.0f} | {gs / ss:.2f} "
              f"(>= {case.target:g}) |")


if __name__ == "__main__":
    main(tyro.cli(Args))
