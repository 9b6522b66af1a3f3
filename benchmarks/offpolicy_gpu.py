"""Off-policy at GPU scale against PPO on the same worlds (issue: SAC and off-policy training at
GPU scale): how long TD3 or SAC with FastTD3's recipe (the ``gmi-ant`` / ``gmi-humanoid``
presets of ``td3`` and ``sac``) takes to reach the return PPO (its ``gmi-*`` preset, rl_games'
settings) has at its 5-minute mark, with the same number of worlds on the same GPU.

    python benchmarks/offpolicy_gpu.py --tasks Humanoid-gmi-v0 Ant-gmi-v0 --algo td3   # gmi-drl bench offpolicy
    python benchmarks/offpolicy_gpu.py --algo sac --ppo-seconds 300 --cap-seconds 600

For each task: PPO trains for ``--ppo-seconds`` of its training loop; its return there (the
mean of its last 20 episodes, as the progress line shows it, read every 5 iterations) is the
target. The off-policy run then trains until the mean of its last 20 episodes reaches the
target, or ``--cap-seconds``. Printed per run: the wall time
to the target (and its ratio to PPO's ``--ppo-seconds``; target <= 1.0 on Humanoid), env steps/s,
gradient steps/s (off-policy: critic steps) and device memory per world (this process's
memory on the GPU as NVML reports it, CUDA context included, divided by the worlds; torch's
peak allocation beside it). Each run is one process's lone GMI, started here; the run
directories (metrics.csv, learning curves) go under ``--out``.

On a machine without CUDA ``--device cpu --num-envs 16 --ppo-seconds 20 --cap-seconds 40``
runs the same pipeline on Warp's CPU device (a smoke run: the figures mean nothing there).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np

from gmi_drl.config import preset
from gmi_drl.telemetry.progress import Progress
from gmi_drl.train import train


class _Stop(Exception):
    """Raised from the progress callback: the run has what this benchmark needs."""


def _device_bytes() -> tuple[float, float]:
    """(NVML: this process's bytes on GPU 0, torch's peak allocated bytes); nan off CUDA."""
    import torch

    if not torch.cuda.is_available():
        return math.nan, math.nan
    peak = float(torch.cuda.max_memory_allocated())
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        used = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                if p.pid == os.getpid() and p.usedGpuMemory]
        pynvml.nvmlShutdown()
        return float(sum(used)) if used else math.nan, peak
    except Exception:  # noqa: BLE001 - NVML absent or refused: report torch's figure only
        return math.nan, peak


def _run(algo: str, task: str, args, run_dir: Path, stop_s: float,
         target: float | None) -> dict:
    """Train ``algo``'s preset of ``task`` until ``stop_s`` seconds (or, with ``target``, until
    the mean of the last 20 episodes reaches it); the run's figures."""
    cfg = preset("auto", task, algo=algo)
    cfg.env.num_envs, cfg.device, cfg.run_dir = args.num_envs, args.device, str(run_dir)
    cfg.total_timesteps, cfg.log.log_every, cfg.seed = 10**12, 5, args.seed
    if hasattr(cfg.algo, "num_minibatches"):  # PPO: minibatches of 32,768 (the preset's size)
        cfg.algo.num_minibatches = max(1, args.num_envs * cfg.algo.num_steps // 32768)
    if hasattr(cfg.algo, "buffer_size"):
        cfg.algo.buffer_size = args.num_envs * 1024
        cfg.algo.learning_starts = args.num_envs * 10
        cfg.algo.minibatch_size = min(cfg.algo.minibatch_size, cfg.algo.learning_starts)
    if args.device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    seen: list[Progress] = []

    def progress(p: Progress) -> None:
        seen.append(p)
        if p.elapsed_s >= stop_s or (target is not None and p.recent_return >= target):
            raise _Stop

    t0 = time.perf_counter()
    try:
        train(cfg, progress)
    except Exception as e:  # noqa: BLE001 - the stop travels as the run's stop cause
        if not any(isinstance(x, _Stop) for x in _chain(e)):
            raise
    wall = time.perf_counter() - t0
    nvml, peak = _device_bytes()
    p = seen[-1]
    grad_steps = 0.0
    if hasattr(cfg.algo, "gradient_steps"):
        per_iter = args.num_envs * cfg.algo.train_frequency
        iters = max(0, (p.global_step - cfg.algo.learning_starts) // per_iter)
        grad_steps = iters * cfg.algo.gradient_steps
    else:
        per_iter = args.num_envs * cfg.algo.num_steps
        grad_steps = (p.global_step // per_iter) * cfg.algo.update_epochs * \
            cfg.algo.num_minibatches
    hit = [q.elapsed_s for q in seen if target is not None and q.recent_return >= target]
    return {"algo": algo, "task": task, "wall_s": wall, "loop_s": p.elapsed_s,
            "env_steps": p.global_step, "sps": p.sps, "grad_steps_s": grad_steps / p.elapsed_s,
            "return": p.recent_return, "reached_s": hit[0] if hit else math.nan,
            "mem_per_world": nvml / args.num_envs, "peak_per_world": peak / args.num_envs}


def _chain(e: BaseException):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["Humanoid-gmi-v0", "Ant-gmi-v0"])
    ap.add_argument("--algo", choices=["td3", "sac"], default="td3")
    ap.add_argument("--num-envs", type=int, default=4096)
    ap.add_argument("--ppo-seconds", type=float, default=300.0)
    ap.add_argument("--cap-seconds", type=float, default=600.0)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/offpolicy_gpu"))
    args = ap.parse_args()
    rows = []
    for task in args.tasks:
        ppo = _run("ppo", task, args, args.out / f"ppo-{task}", args.ppo_seconds, None)
        off = _run(args.algo, task, args, args.out / f"{args.algo}-{task}", args.cap_seconds,
                   ppo["return"])
        rows += [ppo, off]
        print(f"{task}: PPO's return at {args.ppo_seconds:.0f} s: {ppo['return']:.1f}; "
              f"{args.algo} reached it at {off['reached_s']:.1f} s "
              f"({off['reached_s'] / args.ppo_seconds:.2f}x)", flush=True)
    print(f"\n{args.num_envs:,} worlds per run, {args.device}\n")
    print("| task | algorithm | return | reached PPO's at s | / PPO's s | env steps/s | "
          "gradient steps/s | device MiB per world (NVML / torch peak) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = r["reached_s"] / args.ppo_seconds if r["algo"] != "ppo" else math.nan
        print(f"| {r['task']} | {r['algo']} | {r['return']:,.1f} | {r['reached_s']:.1f} | "
              f"{ratio:.2f} | {r['sps']:,.0f} | {r['grad_steps_s']:,.1f} | "
              f"{r['mem_per_world'] / 2**20:.3f} / {r['peak_per_world'] / 2**20:.3f} |")


if __name__ == "__main__":
    main()
