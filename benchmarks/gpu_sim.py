"""The warp engine on a GPU: GMI-DRL's Fig. 7 (GMIs per GPU) and Fig. 10 / Table 10 (num_envs).

Source: papers/002_5a461f8f92ce1cbb.txt §6, Fig. 7, Fig. 10, Table 10.

(a) serving throughput (physics + Table 6 policy inference, env steps/s summed over GMIs) of
    one process holding all ``--total-envs`` worlds (each total given) against 2 / 4 / 8 GMI
    processes sharing the GPU, each with its share of the worlds, all started together (as MPS
    clients of a private daemon where ``nvidia-cuda-mps-control`` exists, else time slicing;
    the first line printed says which);
(b) physics throughput (env steps/s) and device memory against ``num_envs`` for each task.

    python benchmarks/gpu_sim.py                          # on cuda:0; skips without CUDA
    python benchmarks/gpu_sim.py --device cpu --num-envs 4 8 --gmis 1 2 --total-envs 8 \\
        --seconds 3                                       # the same code on Warp's CPU device

Medians of ``--repeats`` timed windows; each window steps ``--seconds`` after a warm-up (kernel
loading and CUDA graph capture are outside it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import torch

from gmi_drl import envs


def _policy(task_id: str, device: str) -> torch.nn.Module:
    from gmi_drl.envs.warp import tasks

    t = tasks()[task_id]
    sizes = [t.obs_dim, *t.policy, t.action_dim]
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ELU()]
    return torch.nn.Sequential(*layers[:-1]).to(device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _run(task_id: str, num_envs: int, device: str, seconds: float, repeats: int,
         infer: bool, start=None) -> tuple[list[float], float]:
    """Env steps/s of each timed window, and device memory the pool took (bytes; 0 on CPU)."""
    free0 = torch.cuda.mem_get_info(device)[0] if device.startswith("cuda") else 0
    with envs.make(task_id, num_envs, seed=0, autoreset="same_step", device=device,
                   tensors=True) as pool:
        mem = free0 - torch.cuda.mem_get_info(device)[0] if device.startswith("cuda") else 0
        policy = _policy(task_id, device) if infer else None
        obs, _ = pool.reset()
        action = torch.zeros(num_envs, pool.model.nu, device=device)
        for _ in range(3):  # kernel loading, graph capture, one replay
            obs, *_ = pool.step(action)
        if start is not None:
            start.wait()
        rates = []
        for _ in range(repeats):
            _sync(device)
            t0, steps = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                for _ in range(16):
                    if policy is not None:
                        with torch.no_grad():
                            action = policy(obs)
                    obs, *_ = pool.step(action)
                steps += 16
                _sync(device)
            rates.append(steps * num_envs / (time.perf_counter() - t0))
        pool.check_limits()
    return rates, float(mem)


def _gmi(args_tuple, start, out) -> None:
    task_id, num_envs, device, seconds, repeats = args_tuple
    try:
        rates, _ = _run(task_id, num_envs, device, seconds, repeats, True, start)
    except BaseException as e:  # the parent reports it instead of waiting for rates
        start.abort()
        out.put(f"{type(e).__name__}: {e}")
        raise
    out.put(rates)


def serving(task_id: str, total: int, gmis: int, device: str, seconds: float,
            repeats: int) -> float:
    """Summed env steps/s of ``gmis`` processes of ``total // gmis`` worlds each (median).

    Raises:
        RuntimeError: a GMI failed or died (its error or exit code).
    """
    import queue

    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(gmis), ctx.Queue()
    procs = [ctx.Process(target=_gmi, args=((task_id, total // gmis, device, seconds, repeats),
                                            start, out)) for _ in range(gmis)]
    for p in procs:
        p.start()
    per_gmi: list = []
    try:
        while len(per_gmi) < gmis:
            try:
                got = out.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"{task_id}: a GMI process died (exit code {dead[0]})")
                continue
            if isinstance(got, str):
                raise RuntimeError(f"{task_id}: a GMI failed: {got}")
            per_gmi.append(got)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return float(sum(statistics.median(r) for r in per_gmi))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--tasks", nargs="+", default=["Ant-gmi-v0", "Humanoid-gmi-v0", "Anymal-gmi-v0",
                                                  "BallBalance-gmi-v0", "FrankaCabinet-gmi-v0",
                                                  "ShadowHand-gmi-v0"])
    ap.add_argument("--num-envs", type=int, nargs="+",
                    default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--total-envs", type=int, nargs="+", default=[8192],
                    help="worlds in all of the serving part, split over the GMIs (each total is "
                         "one comparison: fewer worlds leave one process latency-bound)")
    ap.add_argument("--gmis", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", nargs="+", choices=["physics", "serving"],
                    default=["physics", "serving"])
    ap.add_argument("--mps", choices=["auto", "on", "off"], default="auto",
                    help="run the serving part's GMIs as MPS clients of a private MPS daemon "
                         "started here (auto: where nvidia-cuda-mps-control exists)")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device here (run with --device cpu to try the code on Warp's "
              "CPU device)")
        return
    daemon = _start_mps(args) if "serving" in args.parts else None
    try:
        _report(args, daemon)
    finally:
        if daemon is not None:
            daemon.stop()


def _start_mps(args):
    """A private MPS daemon whose clients are this process and the GMIs it spawns (they inherit
    its pipe directory), or None (``--mps off``, the CPU device, or no daemon binary with
    ``--mps auto``)."""
    import tempfile

    from gmi_drl.gmi.backends import MPSDaemon

    if args.mps == "off" or not args.device.startswith("cuda"):
        return None
    if not MPSDaemon.available():
        if args.mps == "on":
            raise SystemExit(f"--mps on: {MPSDaemon.BINARY} is not on PATH")
        return None
    from gmi_drl.gmi.devices import discover

    index = int(args.device.split(":")[1]) if ":" in args.device else 0
    gpu = next(g for g in discover().gpus if g.index == index)
    daemon = MPSDaemon(tempfile.mkdtemp(prefix="gpu-sim-mps-"), [gpu.uuid])
    daemon.start()
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        os.environ[key] = daemon.env[key]
    return daemon


def _report(args, daemon) -> None:
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    sharing = ("through MPS (a daemon started here)" if daemon
               else "without MPS (time slicing)" if args.device.startswith("cuda")
               else "the CPU's cores")
    print(f"device: {args.device} ({where}); serving GMIs share {sharing}", flush=True)

    if "physics" in args.parts:
        _physics(args)
    if "serving" in args.parts:
        _serving(args)


def _physics(args) -> None:
    print("\n(b) physics: env steps/s and device memory vs num_envs (medians of "
          f"{args.repeats} x {args.seconds:.0f} s)")
    print(f"{'task':<18}{'num_envs':>10}{'steps/s':>14}{'memory MiB':>12}")
    for task in args.tasks:
        for n in args.num_envs:
            rates, mem = _run(task, n, args.device, args.seconds, args.repeats, False)
            print(f"{task:<18}{n:>10,}{statistics.median(rates):>14,.0f}{mem / 2**20:>12,.0f}",
                  flush=True)


def _serving(args) -> None:
    print("\n(a) serving (physics + policy): the worlds as 1..N GMIs, summed env steps/s")
    print(f"{'task':<18}{'worlds':>8}{'GMIs':>6}{'steps/s':>14}{'vs 1 process':>14}")
    for task in args.tasks:
        for total in args.total_envs:
            base = None
            for g in args.gmis:
                rate = serving(task, total, g, args.device, args.seconds, args.repeats)
                base = base or rate
                print(f"{task:<18}{total:>8,}{g:>6}{rate:>14,.0f}{rate / base:>13.2f}x",
                      flush=True)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
