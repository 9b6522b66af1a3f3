"""Profiling overhead: PPO training steps/s with profiling off, on the no-op path, with NVTX on.

    python benchmarks/profile_overhead.py                        # CartPole-v1, 5 repeats
    python benchmarks/profile_overhead.py --task Hopper-v5 --total-timesteps 16384

Modes (every run serial, in this process, so that no mode is relaunched under nsys):

- ``off``: ``--profile.tool none`` (the default): `NoOpProfiler`, plain timer sections.
- ``no-op``: ``--profile.tool nsys --profile.no-nvtx``: profiling asked for, nothing recorded.
  Without CUDA (this is the fallback path) the no-op profiler after its warning; with CUDA,
  ``cudaProfilerStart/Stop`` around iteration 1 with no nsys attached.
- ``nvtx``: ``--profile.tool nsys``: the same plus an NVTX range per timer section (every env
  step's ``env_step`` and ``inference``, every gradient step's ``compiled_step``), with no tool
  attached.

Steps/s = env steps / wall time of the training loop (`train`'s ``wall_s``: set-up and the
report written at the end excluded). Each figure is the median of ``--repeats`` runs, modes
interleaved and their order rotated each repeat, so that drift on a shared machine and the
position in a repeat hit all modes alike; one discarded run first warms the compile cache.
Targets (on the medians): no-op/off >= 0.99, nvtx/off >= 0.97; the best run of each mode is
shown too (the least disturbed on a shared machine). A noise-free estimate follows: the measured
cost of one timer section plain and with NVTX (best of 5 x 100,000), times the sections the loop
opens per second (2 per env step, 1 per gradient step, 5 per iteration). Learning check: every
mode trains the same seed, so the final returns must be equal (profiling must not change
training).
"""

from __future__ import annotations

import gc
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from gmi_drl.config import preset
from gmi_drl.telemetry import Timeline, TimingTree, set_tree, timer
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
    cfg.placement = "serial"
    cfg.log.tensorboard, cfg.checkpoint.every, cfg.log.gpu_util_interval_s = False, 0, 0.0
    for k, v in MODES[mode].items():
        setattr(cfg.profile, k, v)
    gc.collect()  # no garbage of the previous run (a profiled run's report) is collected in this
    r = train(cfg)
    final = float(r.episode_returns[-20:].mean()) if len(r.episode_returns) else float("nan")
    return r.global_step / r.wall_s, final


def _section_cost_us(ranges: str, n: int = 100_000) -> float:
    """Best of 5: microseconds per ``with timer(...)`` (a nested one: a timeline detail event)."""
    tree = TimingTree(Timeline(), ranges=ranges)
    previous = set_tree(tree)
    best = float("inf")
    try:
        with timer("rollout"):
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    with timer("env_step"):
                        pass
                best = min(best, (time.perf_counter() - t0) / n * 1e6)
    finally:
        set_tree(previous)
    return best


def main(args: Args) -> None:
    logging.basicConfig(level=logging.ERROR)  # the no-CUDA fallback warns once per run
    out = Path(tempfile.mkdtemp(prefix="gmi-bench-profile-"))
    sps: dict[str, list[float]] = {m: [] for m in MODES}
    finals: dict[str, list[float]] = {m: [] for m in MODES}
    load_before = os.getloadavg()
    order = list(MODES)
    _run(args, "off", out / "warm-up")  # discarded: torch.compile's cold cache, first imports
    for rep in range(args.repeats):
        for mode in order[rep % 3:] + order[:rep % 3]:  # each mode first as often as the others
            rate, final = _run(args, mode, out / f"{mode}-{rep}")
            sps[mode].append(rate)
            finals[mode].append(final)
    load_after = os.getloadavg()
    base = statistics.median(sps["off"])
    print(f"\n{args.task} PPO, {args.total_timesteps:,} env steps per run, median of "
          f"{args.repeats} runs per mode (interleaved, order rotated); load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after\n")
    best_off = max(sps["off"])
    print("| mode | train steps/s (median) | ratio to off | target | best of runs | best ratio | "
          "runs |")
    print("|---|---:|---:|---|---:|---:|---|")
    for mode in MODES:
        med, best = statistics.median(sps[mode]), max(sps[mode])
        target = f">= {TARGETS[mode]:.2f}" if mode in TARGETS else "-"
        runs = ", ".join(f"{x:,.0f}" for x in sps[mode])
        print(f"| {mode} | {med:,.0f} | {med / base:.3f} | {target} | {best:,.0f} | "
              f"{best / best_off:.3f} | {runs} |")
    cfg = preset("auto", args.task)
    p = cfg.algo
    per_update = 2 * p.num_steps + p.update_epochs * p.num_minibatches + 5
    per_s = per_update * base / cfg.batch_size
    plain, nvtx = _section_cost_us("none"), _section_cost_us("nvtx")
    print(f"\nestimate: one timer section costs {plain:.2f} us plain, {nvtx:.2f} us with NVTX (no "
          f"tool attached); the loop opens {per_s:,.0f} sections/s at the off median, so NVTX "
          f"costs ~{100 * per_s * (nvtx - plain) * 1e-6:.2f}% and the sections themselves "
          f"~{100 * per_s * plain * 1e-6:.2f}% of the loop")
    same = all(finals[m] == finals["off"] for m in MODES)
    print(f"\nlearning check: final return (mean of last 20 episodes) {finals['off'][0]:.1f}; "
          f"identical in every mode and run: {'yes' if same else 'NO'}")
    print(f"(run dirs under {out})")


if __name__ == "__main__":
    main(tyro.cli(Args))
