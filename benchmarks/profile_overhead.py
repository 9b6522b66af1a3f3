"""Profiling overhead: PPO training steps/s with profiling off, on the no-op path, with NVTX on.

    python benchmarks/profile_overhead.py                        # CartPole-v1, 5 repeats
    python benchmarks/profile_overhead.py --task Hopper-v5 --total-timesteps 16384

Modes (every run serial, in this process, so that no mode is relaunched under nsys):

- ``off``: ``--profile.tool none`` (the default): `NoOpProfiler`, plain timer sections.
- ``no-op``: ``--profile.tool nsys --profile.no-nvtx``: profiling asked for, nothing recorded.
  Without CUDA (this is the fallback path) the no-op profiler after its warning; with CUDA,
  ``cudaProfilerStart/Stop`` around step 1 with no nsys attached.
- ``nvtx``: ``--profile.tool nsys``: the same plus an NVTX range per timer section (every env
  step's ``env_step`` and ``inference``, every minibatch's ``forward``, ``backward``,
  ``allreduce``, ``optimizer``), with no tool attached.

Steps/s = env steps / wall time of the training loop (`train`'s ``wall_s``: set-up and the
report written at the end excluded). Each figure is the median of ``--repeats`` runs, modes
interleaved (off, no-op, nvtx, off, ...) so that drift on a shared machine hits all alike.
Targets: no-op/off >= 0.99, nvtx/off >= 0.97. Learning check: every mode trains the same seed,
so the final returns must be equal (profiling must not change training).
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tyro

from gmi_drl.config import preset
from gmi_drl.train import train

MODES = {"off": {"tool": "none"}, "no-op": {"tool": "nsys", "nvtx": False},
         "nvtx": {"tool": "nsys", "nvtx": True}}
TARGETS = {"no-op": 0.99, "nvtx": 0.97}


@dataclass
class Args:
    task: str = "CartPole-v1"
    """task (its preset's hyper-parameters)"""
    total_timesteps: int = 32_768
    """env steps per run"""
    repeats: int = 5
    """runs per mode (median reported)"""
    seed: int = 1


def _run(args: Args, mode: str, run_dir: Path) -> tuple[float, float]:
    cfg = preset("auto", args.task)
    cfg.total_timesteps, cfg.seed, cfg.run_dir = args.total_timesteps, args.seed, str(run_dir)
    cfg.serial = True
    cfg.log.tensorboard, cfg.log.checkpoint_every, cfg.log.gpu_util_interval_s = False, 0, 0.0
    for k, v in MODES[mode].items():
        setattr(cfg.profile, k, v)
    r = train(cfg)
    final = float(r.episode_returns[-20:].mean()) if len(r.episode_returns) else float("nan")
    return r.global_step / r.wall_s, final


def main(args: Args) -> None:
    logging.basicConfig(level=logging.ERROR)  # the no-CUDA fallback warns once per run
    out = Path(tempfile.mkdtemp(prefix="gmi-bench-profile-"))
    sps: dict[str, list[float]] = {m: [] for m in MODES}
    finals: dict[str, list[float]] = {m: [] for m in MODES}
    load_before = os.getloadavg()
    for rep in range(args.repeats):
        for mode in MODES:
            rate, final = _run(args, mode, out / f"{mode}-{rep}")
            sps[mode].append(rate)
            finals[mode].append(final)
    load_after = os.getloadavg()
    base = statistics.median(sps["off"])
    print(f"\n{args.task} PPO, {args.total_timesteps:,} env steps per run, median of "
          f"{args.repeats} runs per mode (interleaved); load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after\n")
    print("| mode | train steps/s (median) | runs | ratio to off | target |")
    print("|---|---:|---|---:|---|")
    for mode in MODES:
        med = statistics.median(sps[mode])
        target = f">= {TARGETS[mode]:.2f}" if mode in TARGETS else "-"
        runs = ", ".join(f"{x:,.0f}" for x in sps[mode])
        print(f"| {mode} | {med:,.0f} | {runs} | {med / base:.3f} | {target} |")
    same = all(finals[m] == finals["off"] for m in MODES)
    print(f"\nlearning check: final return (mean of last 20 episodes) {finals['off'][0]:.1f}; "
          f"identical in every mode and run: {'yes' if same else 'NO'}")
    print(f"(run dirs under {out})")


if __name__ == "__main__":
    main(tyro.cli(Args))
