"""The warp engine on a GPU: GMI-DRL's Fig. 7 (GMIs per GPU) and Fig. 10 / Table 10 (num_envs).

Source: the GMI-DRL paper §6, Fig. 7, Fig. 10, Table 10.

(a) serving throughput (physics + Table 6 policy inference, env steps/s summed over GMIs) of
    one process holding all ``--total-envs`` worlds (each total given) against 2 / 4 / 8 GMI
    processes sharing the GPU, each with its share of the worlds, all started together (as MPS
    clients of a private daemon where ``nvidia-cuda-mps-control`` exists, else time slicing;
    the line above its table says which);
(b) physics throughput (env steps/s) and device memory against ``num_envs`` for each task;
(c) training (PPO with the task's ``gmi-*`` preset, end to end on the device) for each layout
    of ``--train-layouts`` (``GxN``: G GMIs of N worlds each; ``cuda_mps`` GMIs on a GPU,
    reducing gradients through MPR; each GMI a data-parallel replica at the preset's
    minibatch of 32,768 samples): steady env steps/s summed over the GMIs between the first
    and the last update of ``--train-steps``, each against the best one-process layout listed
    (the paper tunes its baselines the same way: one process per GPU at the ``num_envs`` of
    its peak throughput; Fig. 7's training half);
(d) the pool against its physics bound (``--parts bound``; not run unless named): on the pool's
    own MuJoCo Warp model and data (the same worlds and ``nconmax``/``njmax``, built by the pool
    itself), mujoco_warp's ``step`` alone (``frame_skip`` of them per call, a captured CUDA graph;
    plain launches on Warp's CPU device) against the pool's env step with random actions in
    [-1, 1]; ratio = env steps/s x physics steps per env step / physics steps/s (the share of
    the bound the pool reaches; target >= 0.8). The gap's breakdown, in microseconds per env
    step of all worlds: the physics, the task alone (the same step captured without its physics
    steps: action kernel, task kernel with its resets, body kinematics where the task observes
    bodies; run on a state the physics does not advance, so resets only at time limits and
    terminations that state holds), the pool's captured step launched alone (physics + task,
    no host work) and ``pool.step`` (that graph plus the host's action copy, stream waits and
    outputs), and the share of worlds that ended per env step under random actions.

    python benchmarks/gpu_sim.py                          # on cuda:0; skips without CUDA
    python benchmarks/gpu_sim.py --parts bound --tasks Ant-gmi-v0 Humanoid-gmi-v0 \\
        ShadowHand-gmi-v0 --num-envs 8192                 # (d): the pool vs its physics bound
    python benchmarks/gpu_sim.py --device cpu --num-envs 4 8 --gmis 1 2 --total-envs 8 \\
        --train-layouts 1x8 2x4 --train-steps 4000 --seconds 3   # the same on Warp's CPU device

Medians of ``--repeats`` timed windows; each window steps ``--seconds`` after a warm-up (kernel
loading and CUDA graph capture are outside it).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
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


def _collect(procs, out, what: str) -> list:
    """One result per process from ``out``, in arrival order; joins them (kills stragglers).

    Raises:
        RuntimeError: a process put an error string, or died without a result.
    """
    import queue

    got: list = []
    try:
        while len(got) < len(procs):
            try:
                item = out.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"{what}: a process died (exit code {dead[0]})") from None
                continue
            if isinstance(item, str):
                raise RuntimeError(f"{what}: {item}")
            got.append(item)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got


def _child_main(fn, args, out) -> None:
    try:
        out.put(fn(*args))
    except BaseException as e:
        out.put(f"{type(e).__name__}: {e}")
        raise


def _in_child(fn, *args):
    """``fn(*args)`` in a spawned process of its own: each measurement gets a fresh CUDA
    context, and this process never holds one (an MPS daemon started later serves clean
    clients)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_child_main, args=(fn, args, out))
    proc.start()
    return _collect([proc], out, getattr(fn, "__name__", "child"))[0]


def serving(task_id: str, total: int, gmis: int, device: str, seconds: float,
            repeats: int) -> float:
    """Summed env steps/s of ``gmis`` processes of ``total // gmis`` worlds each (median).

    Raises:
        RuntimeError: a GMI failed or died (its error or exit code).
    """
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(gmis), ctx.Queue()
    procs = [ctx.Process(target=_gmi, args=((task_id, total // gmis, device, seconds, repeats),
                                            start, out)) for _ in range(gmis)]
    for p in procs:
        p.start()
    per_gmi = _collect(procs, out, f"{task_id}, {gmis} GMIs")
    return float(sum(statistics.median(r) for r in per_gmi))


def _window(call, sync, seconds: float) -> float:
    """Calls per second of ``call()`` over one window of at least ``seconds`` (batches of 16
    calls, each closed by ``sync()``, a wait for the device)."""
    sync()
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(16):
            call()
        calls += 16
        sync()
    return calls / (time.perf_counter() - t0)


def _graphed(pool, fn):
    """``fn`` (Warp launches on the pool's device) as a zero-argument call: on CUDA the replay
    of a graph of it, captured on the pool's stream as the pool captures its own step (after one
    uncaptured run that loads the kernels, Python's GC off); on the CPU ``fn`` itself."""
    wp = pool._wp

    def plain() -> None:
        with wp.ScopedDevice(pool._device):
            fn()
    plain()
    if not pool._on_cuda:
        return plain
    enabled = gc.isenabled()
    gc.disable()
    try:
        with wp.ScopedDevice(pool._device), wp.ScopedCapture(stream=pool._stream) as cap:
            fn()
    finally:
        if enabled:
            gc.enable()
    graph = cap.graph
    return lambda: wp.capture_launch(graph, stream=pool._stream)


def bound(task_id: str, num_envs: int, device: str, seconds: float, repeats: int,
          nconmax: int | None = None, njmax: int | None = None) -> dict:
    """The pool's env step against MuJoCo Warp's ``step`` alone on the pool's own model and
    data (part (d) of the module doc): the windows of each call interleaved, ``repeats`` each.

    Returns:
        ``frame_skip``, ``nconmax``, ``njmax`` (the pool's), medians ``physics`` (physics
        steps/s of all worlds: world-steps), ``pool`` (env steps/s of ``pool.step``), ``graph``
        (env steps/s of the pool's captured step alone), ``task`` (env steps/s of the step
        without physics), and ``ended`` (worlds that ended per world and env step, random
        actions, 64 env steps after the windows).

    Raises:
        RuntimeError: a world overflowed its contact or constraint buffers (`check_limits`).
    """
    sizes = {k: v for k, v in (("nconmax", nconmax), ("njmax", njmax)) if v is not None}
    with envs.make(task_id, num_envs, seed=0, autoreset="same_step", device=device,
                   tensors=True, **sizes) as pool:
        wp, mjw, task, fs = pool._wp, pool._mjw, pool.task, pool.task.frame_skip
        on_cuda = pool._on_cuda

        def sync() -> None:
            if on_cuda:
                wp.synchronize_device(pool._device)
        gen = torch.Generator(pool.device).manual_seed(0)
        actions = torch.rand((16, num_envs, pool.model.nu), generator=gen,
                             device=pool.device) * 2 - 1
        done = [0]

        def env_step():
            out = pool.step(actions[done[0] & 15])
            done[0] += 1
            return out

        def without_physics() -> None:
            pool.task = dataclasses.replace(task, frame_skip=0)
            try:
                pool._step_kernels()
            finally:
                pool.task = task

        def physics() -> None:
            for _ in range(fs):
                mjw.step(pool._m, pool._d)
        pool.reset()
        for _ in range(3):  # kernel loading, graph capture, one replay
            env_step()
        calls = {"pool": env_step,
                 "graph": ((lambda: wp.capture_launch(pool._graph, stream=pool._stream))
                           if on_cuda else _graphed(pool, pool._step_kernels)),
                 "task": _graphed(pool, without_physics),
                 "physics": _graphed(pool, physics)}
        for call in calls.values():  # a first replay of each graph
            call()
        rates: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(repeats):  # interleaved: drift hits every call alike
            for name, call in calls.items():
                rates[name].append(_window(call, sync, seconds))
        ended = torch.zeros((), dtype=torch.int64, device=pool.device)
        for _ in range(64):
            _, _, terminated, truncated, _ = env_step()
            ended += (terminated | truncated).sum()
        pool.check_limits()
        med = {k: statistics.median(v) * num_envs for k, v in rates.items()}
        med["physics"] *= fs
        return {**med, "frame_skip": fs, "ended": float(ended) / (64 * num_envs),
                "nconmax": nconmax or task.nconmax, "njmax": njmax or task.njmax}


def _check(ap: argparse.ArgumentParser, args) -> None:
    """Refuse, as usage errors, what the parts cannot run."""
    from gmi_drl.envs.warp import tasks

    unknown = [t for t in args.tasks if t not in tasks()]
    if unknown:
        ap.error(f"--tasks {unknown}: not warp tasks; choose from {sorted(tasks())}")
    for name in ("num_envs", "total_envs", "gmis", "nconmax", "njmax"):
        values = getattr(args, name)
        if values is not None and min(values if isinstance(values, list) else [values]) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if "serving" in args.parts:
        if args.gmis[0] != 1:
            ap.error("--gmis must start with 1: the serving part compares with one process")
        bad = [(t, g) for t in args.total_envs for g in args.gmis if t % g]
        if bad:
            ap.error(f"--total-envs must split evenly over every --gmis (not {bad[0][0]} "
                     f"worlds over {bad[0][1]} GMIs)")
    for flag, value in (("--repeats", args.repeats), ("--train-steps", args.train_steps)):
        if value < 1:
            ap.error(f"{flag} {value}: must be >= 1")
    if args.seconds <= 0:
        ap.error(f"--seconds {args.seconds:g}: must be > 0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--device", default="cuda:0",
                    help="cuda[:K] (the whole run is skipped without CUDA) or cpu (Warp's CPU "
                         "device)")
    ap.add_argument("--tasks", nargs="+", default=["Ant-gmi-v0", "Humanoid-gmi-v0", "Anymal-gmi-v0",
                                                  "BallBalance-gmi-v0", "FrankaCabinet-gmi-v0",
                                                  "ShadowHand-gmi-v0"],
                    help="warp tasks (the *-gmi-v0 ids), each through every part")
    ap.add_argument("--num-envs", type=int, nargs="+",
                    default=[512, 1024, 2048, 4096, 8192, 16384],
                    help="worlds of each pool of the physics part, one row each (>= 1)")
    ap.add_argument("--total-envs", type=int, nargs="+", default=[8192],
                    help="worlds in all of the serving part, split over the GMIs (each total is "
                         "one comparison: fewer worlds leave one process latency-bound)")
    ap.add_argument("--gmis", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="GMI counts of the serving part, the first 1 (the one-process "
                         "baseline); each must divide every --total-envs")
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="length of each timed window of the physics and serving parts, "
                         "seconds (> 0)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed windows per measurement; the median is reported (>= 1)")
    ap.add_argument("--parts", nargs="+", choices=["physics", "serving", "training", "bound"],
                    default=["physics", "serving", "training"],
                    help="which parts to run: physics (b), serving (a), training (c), bound "
                         "(d: the pool against its physics bound, only when named) of the "
                         "module doc")
    ap.add_argument("--nconmax", type=int, default=None,
                    help="contacts per world of the bound part's pools (default: the task's)")
    ap.add_argument("--njmax", type=int, default=None,
                    help="constraint rows per world of the bound part's pools (default: the "
                         "task's)")
    ap.add_argument("--train-steps", type=int, default=20_000_000,
                    help="env steps of each training run of the training part (>= 1)")
    ap.add_argument("--train-layouts", nargs="+", type=_layout,
                    default=[(1, 4096), (1, 8192), (1, 16384), (2, 4096), (4, 4096), (2, 8192)],
                    help="GxN: G GMIs of N worlds each, for the training part (the best 1xN "
                         "listed is the one-process baseline)")
    ap.add_argument("--mps", choices=["auto", "on", "off"], default="auto",
                    help="run the serving part's GMIs as MPS clients of a private MPS daemon "
                         "started here (auto: where nvidia-cuda-mps-control exists)")
    args = ap.parse_args()
    _check(ap, args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device here (run with --device cpu to try the code on Warp's "
              "CPU device)")
        return
    # this process holds no CUDA context: every measurement runs in processes of its own
    print(f"device: {args.device} ({_device_name(args.device)})", flush=True)
    if "physics" in args.parts:
        _physics(args)
    if "bound" in args.parts:
        _bound(args)
    if "serving" in args.parts:
        daemon = _start_mps(args)
        print(f"\nserving GMIs share the {'GPU' if args.device.startswith('cuda') else 'CPU'} "
              f"{'through MPS (a daemon started here)' if daemon else 'by time slicing'}")
        try:
            _serving(args)
        finally:
            if daemon is not None:
                daemon.stop()
                for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
                    os.environ.pop(key, None)
    if "training" in args.parts:
        _training(args)


def _gpu(device: str):
    """The `gmi_drl.gmi.devices.Gpu` of ``"cuda[:k]"``, from NVML (no CUDA context here)."""
    from gmi_drl.gmi.devices import discover

    index = int(device.split(":")[1]) if ":" in device else 0
    return next(g for g in discover().gpus if g.index == index)


def _device_name(device: str) -> str:
    return _gpu(device).name if device.startswith("cuda") else "cpu"


def _start_mps(args):
    """A private MPS daemon whose clients are the serving GMIs spawned while it runs (they
    inherit its pipe directory), or None (``--mps off``, the CPU device, or no daemon binary
    with ``--mps auto``)."""
    import tempfile

    from gmi_drl.gmi.backends import MPSDaemon

    if args.mps == "off" or not args.device.startswith("cuda"):
        return None
    if not MPSDaemon.available():
        if args.mps == "on":
            raise SystemExit(f"--mps on: {MPSDaemon.BINARY} is not on PATH")
        return None
    daemon = MPSDaemon(tempfile.mkdtemp(prefix="gpu-sim-mps-"), [_gpu(args.device).uuid])
    daemon.start()
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        os.environ[key] = daemon.env[key]
    return daemon


def _name_width(tasks) -> int:
    """The task column's width: the longest name and two spaces (at least 18)."""
    return max(18, 2 + max(map(len, tasks)))


def _physics(args) -> None:
    w = _name_width(args.tasks)
    print("\n(b) physics: env steps/s and device memory vs num_envs (medians of "
          f"{args.repeats} x {args.seconds:g} s)")
    print(f"{'task':<{w}}{'num_envs':>10}{'steps/s':>14}{'memory MiB':>12}")
    for task in args.tasks:
        for n in args.num_envs:
            rates, mem = _in_child(_run, task, n, args.device, args.seconds, args.repeats,
                                   False)
            print(f"{task:<{w}}{n:>10,}{statistics.median(rates):>14,.0f}{mem / 2**20:>12,.0f}",
                  flush=True)


def _bound(args) -> None:
    w = _name_width(args.tasks)
    print("\n(d) the pool against its physics bound (same model and data; random actions; "
          f"medians of {args.repeats} x {args.seconds:g} s): world-steps/s, ratio = env steps/s "
          "x substeps / physics; then microseconds per env step of all worlds")
    print(f"{'task':<{w}}{'num_envs':>9}{'substeps':>9}{'nconmax':>8}{'njmax':>6}"
          f"{'physics/s':>14}{'env steps/s':>13}{'ratio':>7}{'physics':>9}{'task':>8}"
          f"{'graph':>8}{'step':>8}{'ended':>7}")
    for task in args.tasks:
        for n in args.num_envs:
            r = _in_child(bound, task, n, args.device, args.seconds, args.repeats, args.nconmax,
                          args.njmax)
            fs = r["frame_skip"]
            us = {k: 1e6 * n / r[k] for k in ("pool", "graph", "task")}
            us["physics"] = 1e6 * n * fs / r["physics"]
            print(f"{task:<{w}}{n:>9,}{fs:>9}{r['nconmax']:>8}{r['njmax']:>6}"
                  f"{r['physics']:>14,.0f}{r['pool']:>13,.0f}{r['pool'] * fs / r['physics']:>7.2f}"
                  f"{us['physics']:>9,.0f}{us['task']:>8,.0f}{us['graph']:>8,.0f}"
                  f"{us['pool']:>8,.0f}{r['ended']:>7.1%}", flush=True)


def _serving(args) -> None:
    w = _name_width(args.tasks)
    print("\n(a) serving (physics + policy): the worlds as 1..N GMIs, summed env steps/s")
    print(f"{'task':<{w}}{'worlds':>8}{'GMIs':>6}{'steps/s':>14}{'vs 1 process':>14}")
    for task in args.tasks:
        for total in args.total_envs:
            base = None
            for g in args.gmis:
                rate = serving(task, total, g, args.device, args.seconds, args.repeats)
                base = base or rate
                print(f"{task:<{w}}{total:>8,}{g:>6}{rate:>14,.0f}{rate / base:>13.2f}x",
                      flush=True)


def _layout(text: str) -> tuple[int, int]:
    """``"GxN"`` -> ``(G, N)``: G GMIs of N worlds each."""
    try:
        g, n = (int(v) for v in text.lower().split("x"))
        if g < 1 or n < 1:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a layout is GxN with positive integers, "
                                         "e.g. 4x4096 (4 GMIs of 4,096 worlds)") from None
    return g, n


def training(task_id: str, gmis: int, num_envs: int, device: str, steps: int, run_dir: str
             ) -> float:
    """Steady env steps/s (summed over GMIs) of PPO on ``task_id`` (its ``gmi-*`` preset) as
    ``gmis`` GMIs of ``num_envs`` worlds each, between the run's first and last update."""
    import csv

    from gmi_drl.config import preset
    from gmi_drl.train import train

    cfg = preset("auto", task_id)  # the task's own gmi-* preset
    cuda = device.startswith("cuda")
    cfg.device = "cuda" if cuda else "cpu"
    cfg.gmi.num_gmis, cfg.env.num_envs = gmis, num_envs
    cfg.gmi.backend = ("cuda_mps" if gmis > 1 else "cuda_shared") if cuda else "cpu"
    # each GMI a replica at the preset's minibatch of 32,768 samples
    cfg.algo.num_minibatches = max(1, num_envs * cfg.algo.num_steps // 32768)
    cfg.total_timesteps, cfg.run_dir = steps, run_dir
    cfg.log.tensorboard, cfg.log.log_every, cfg.checkpoint.every = False, 1, 0
    train(cfg)
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = [(float(r["global_step"]), float(r["wall_s"])) for r in csv.DictReader(f)
                if r["name"] == "perf/sps"]
    (s0, w0), (s1, w1) = rows[0], rows[-1]
    return (s1 - s0) / (w1 - w0) if w1 > w0 else float("nan")


def _training(args) -> None:
    import tempfile

    w = _name_width(args.tasks)
    out = tempfile.mkdtemp(prefix="gpu-sim-train-")
    print(f"\n(c) training (PPO, gmi-* preset, {args.train_steps:,} env steps per run): GMIs x "
          f"worlds each, steady env steps/s summed over GMIs; runs in {out}")
    print(f"{'task':<{w}}{'GMIs':>6}{'worlds/GMI':>12}{'steps/s':>14}")
    for task in args.tasks:
        rates = {}
        for g, n in args.train_layouts:  # each figure printed as it comes (a cut run keeps it)
            try:
                rates[g, n] = _in_child(training, task, g, n, args.device, args.train_steps,
                                        os.path.join(out, f"{task}-{g}x{n}"))
                print(f"{task:<{w}}{g:>6}{n:>12,}{rates[g, n]:>14,.0f}", flush=True)
            except RuntimeError as e:  # a layout that fails (out of memory, ...) is a result
                print(f"{task:<{w}}{g:>6}{n:>12,}  not runnable: {e}", flush=True)
        one = {k: r for k, r in rates.items() if k[0] == 1}
        gmis = {k: r for k, r in rates.items() if k[0] > 1}
        if one and gmis:
            (g1, n1), (g, n) = max(one, key=one.get), max(gmis, key=gmis.get)
            print(f"{task}: best GMI layout {g}x{n} {gmis[g, n]:,.0f} steps/s = "
                  f"{gmis[g, n] / one[g1, n1]:.2f}x the best one process ({g1}x{n1}, "
                  f"{one[g1, n1]:,.0f})", flush=True)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
