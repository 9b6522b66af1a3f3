"""Gradient aggregation through the iSwitch switch: per-iteration time in an emulated rack against
ring and PS (``--mode reduce``), and stale-sync training against synchronous (``--mode stale-sync``).

``--mode reduce`` (the default):

Builds the `gmi_drl.comm.switch.netns.Rack` (root only): worker namespaces, each with its own
rate-limited veth link (tc tbf, 100 Mbit/s by default) to a switch namespace that forwards IP,
and a parameter-server namespace on the same switch. With more than 4 workers the rack is a tree:
``--per-tor`` workers per ToR under one core (iSwitch Fig. 15). On that topology it times:

- ``switch``: `SwitchReducer` through the aggregation daemon(s) running in the switch namespaces,
  on their native data plane (``switch-py``: on the Python one);
- ``ring``: torch.distributed gloo ``all_reduce`` between the workers (TCP through the switch);
- ``ps``: the parameter server `gmi_drl.comm.ps` (TCP): every worker sends its vector, the
  server sums in rank order, divides and sends the mean back to every worker.

Per iteration the aggregation time is the slowest worker's ``allreduce`` call; the table shows its
median and 95th percentile (ms) over the timed iterations, after 2 warm-up iterations, and the
CPU time per iteration (ms, user + system) of every process in the rack (workers, switch daemons,
parameter server): on a shared machine a figure steadier than wall time; for the switch also the
daemons' own CPU. On shaped links it adds the line-rate floor (M / link rate) and switch / floor.
After each table: the daemons' float32 bytes aggregated per CPU-second at the largest size (native
against Python), as a fraction of this machine's memory bandwidth, checked against their counters.
``--rate-mbit 0`` leaves the links unshaped (CPU-bound); ``--switch-opts`` passes more daemon
options (``--slots``, ``--window-bytes``). ``--loopback`` (no root) runs the same processes on
127.0.0.1 instead of a rack, as a user without one would (needs ``--rate-mbit 0`` and one switch;
``--mtu 0``: the daemon's default, the loopback interface's MTU).

    sudo .venv/bin/python benchmarks/switch.py --workers 4
    sudo .venv/bin/python benchmarks/switch.py --workers 6 9 12 --per-tor 3
    sudo .venv/bin/python benchmarks/switch.py --rate-mbit 0 --methods switch switch-py ring
    .venv/bin/python benchmarks/switch.py --loopback --rate-mbit 0 --mtu 0 --sizes 6.4MB \
        --methods switch ring

``--mode stale-sync`` (iSwitch §4.1, no root needed): ``--workers`` PPO learners on loopback, each
updating on a fixed synthetic batch with the Hopper-v5 networks (64-64 tanh MLPs, 10,119 float32
= 40 KB: the paper's PPO model), reduce every minibatch gradient through one switch daemon whose
``--delay-ms`` adds aggregation latency. Per staleness bound (``sync`` = `SwitchReducer.allreduce_`
then the step; ``S`` = `gmi_drl.comm.switch.pipeline`) it prints the median wall time of one
update (the slowest worker's; 2,048 samples, 32 minibatches, 2 epochs = 64 aggregations) and the
mean staleness, after one warm-up update.

    .venv/bin/python benchmarks/switch.py --mode stale-sync --workers 4 --delays-ms 0 2 5
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

# the paper's model sizes, its KB and MB read as KiB and MiB (every switch figure in
# docs/benchmarks.md was measured so; benchmarks/reduce.py reads them as 10^3 and 10^6 bytes)
SIZES = {"40KB": 40 * 1024, "157.5KB": int(157.5 * 1024), "3.3MB": int(3.3 * 2**20),
         "6.4MB": int(6.4 * 2**20)}
ITERS = {"40KB": 30, "157.5KB": 20, "3.3MB": 6, "6.4MB": 6}
WARMUP = 2
SWITCH_PORT, PS_PORT, RING_PORT = 9999, 9998, 29500
SWITCH_METHODS = {"switch": "native", "switch-py": "python"}
"""method name -> the daemons' ``--data-plane``"""


def _iters(label: str, scale: float) -> int:
    return max(3, int(round(ITERS[label] * scale)))


# ---- processes inside the rack -----------------------------------------------------------------

def worker_main(a) -> None:
    import torch

    torch.set_num_threads(1)
    labels = a.sizes.split(",")
    if a.method in SWITCH_METHODS:
        from gmi_drl.comm.switch import SwitchReducer

        red = SwitchReducer(a.addr, a.rank, a.world, job_id="bench", timeout_s=120,
                            join_timeout_s=120)
        reduce = lambda t: red.allreduce_([t])  # noqa: E731
    elif a.method == "ring":
        import datetime

        import torch.distributed as dist

        os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
        dist.init_process_group("gloo", init_method=f"tcp://{a.addr}", rank=a.rank,
                                world_size=a.world, timeout=datetime.timedelta(seconds=300))
        reduce = lambda t: (dist.all_reduce(t), t.div_(a.world))  # noqa: E731
    else:
        from gmi_drl.comm.ps import PSReducer

        red = PSReducer(a.addr, a.rank, a.world, timeout_s=120)
        reduce = lambda t: red.allreduce_([t])  # noqa: E731
    out = {}
    for label in labels:
        n = SIZES[label] // 4
        t = torch.randn(n, generator=torch.Generator().manual_seed(a.rank))
        times = []
        for i in range(WARMUP + _iters(label, a.iters_scale)):
            if i == WARMUP and a.rank == 0:
                print("begin", flush=True)  # the driver samples the rack's CPU time
            t0 = time.perf_counter()
            reduce(t)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        if a.rank == 0:
            print("end", flush=True)
        out[label] = times
    retx = red.retransmits if a.method in SWITCH_METHODS else 0
    print(json.dumps({"rank": a.rank, "times": out, "retransmits": retx}), flush=True)
    if a.method != "ring":
        red.close()
    elif a.method == "ring":
        import torch.distributed as dist

        dist.destroy_process_group()


# ---- the driver --------------------------------------------------------------------------------

def run_method(rack, method: str, world: int, labels: list[str], a) -> dict:
    py = [sys.executable, os.path.abspath(__file__)]
    common = ["--sizes", ",".join(labels), "--iters-scale", str(a.iters_scale)]
    helpers, aggregated, run_cpu = [], 0, 0.0
    try:
        if method in SWITCH_METHODS:
            mtu = (["--mtu", str(a.mtu)] if a.mtu else []) + [
                   "--member-timeout", "120", "--stats-interval", "0",
                   "--data-plane", SWITCH_METHODS[method], *shlex.split(a.switch_opts)]
            helpers.append(rack.popen(rack.root, [*py[:1], "-m", "gmi_drl.comm.switch", "serve",
                                                  "--bind", f"0.0.0.0:{SWITCH_PORT}", *mtu],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            for j in range(rack.tors):
                helpers.append(rack.popen(f"t{j}", [
                    *py[:1], "-m", "gmi_drl.comm.switch", "serve", "--bind",
                    f"0.0.0.0:{SWITCH_PORT}", "--parent", f"{rack.tor_parent_ip[j]}:{SWITCH_PORT}",
                    "--member-id", str(j), "--switch-id", str(j + 1), *mtu],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            for h in helpers:
                h.stdout.readline()  # "listening on ..."
        elif method == "ps":
            helpers.append(rack.popen("ps", [*py[:1], "-m", "gmi_drl.comm.ps", "--bind",
                                             f"0.0.0.0:{PS_PORT}", "--workers", str(world)],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            helpers[-1].stdout.readline()  # "listening on ..."
        procs = []
        for r in range(world):
            if method in SWITCH_METHODS:
                addr = f"{rack.worker_gateway[r]}:{SWITCH_PORT}"
            elif method == "ring":
                addr = f"{rack.worker_ip[0]}:{RING_PORT}"
            else:
                addr = f"{rack.ps_ip}:{PS_PORT}"
            procs.append(rack.popen(f"w{r}", [*py, "_worker", "--method", method, "--rank", str(r),
                                              "--world", str(world), "--addr", addr, "--ifname",
                                              rack.worker_dev[r], *common],
                                    stdout=subprocess.PIPE, text=True))
        cpu, sw_cpu, lines = [], [], []
        for line in procs[0].stdout:  # rank 0 marks the timed iterations of each size
            if line.strip() in ("begin", "end"):
                cpu.append(rack.cpu_seconds())
                sw_cpu.append(rack.cpu_seconds(rack.switch_roles()))
            else:
                lines.append(line)
        outs = ["".join(lines)] + [p.communicate(timeout=a.timeout)[0] for p in procs[1:]]
        results = []
        for p, out in zip(procs, outs):
            if p.wait(a.timeout) != 0:
                raise RuntimeError(f"{method} worker failed ({p.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
        if a.verbose and method in SWITCH_METHODS:
            print(f"  worker retransmits: {[r['retransmits'] for r in results]}", flush=True)
        run_cpu = rack.cpu_seconds(rack.switch_roles()) if helpers and method != "ps" else 0.0
    finally:
        for h in helpers:
            h.terminate()
            try:
                h.wait(10)
            except subprocess.TimeoutExpired:
                h.kill()
                h.wait()
            if h.stdout is not None:
                final = h.stdout.read().decode().strip().splitlines()
                if a.verbose and final:
                    print(f"  switch counters: {final[-1]}", flush=True)
                if final and method in SWITCH_METHODS:
                    aggregated += json.loads(final[-1])["bytes_aggregated"]
                h.stdout.close()
    table = {}
    for k, label in enumerate(labels):
        per_iter = np.max([r["times"][label] for r in results], axis=0) * 1000
        cpu_ms = (cpu[2 * k + 1] - cpu[2 * k]) / len(per_iter) * 1000
        sw_ms = (sw_cpu[2 * k + 1] - sw_cpu[2 * k]) / len(per_iter) * 1000
        table[label] = (float(np.median(per_iter)), float(np.percentile(per_iter, 95)), cpu_ms,
                        sw_ms)
    if method in SWITCH_METHODS:
        table["daemons"] = {"bytes_aggregated": aggregated, "cpu_s": run_cpu}
    return table


# ---- stale-sync training (--mode stale-sync) ---------------------------------------------------

STALE_BATCH, STALE_MINIBATCHES, STALE_EPOCHS = 2048, 32, 2


def stale_sync_worker_main(a) -> None:
    import functools

    import gymnasium as gym
    import torch

    from gmi_drl.algos import AlgoContext, ModelConfig, PPOConfig, build_algorithm
    from gmi_drl.comm.switch import SwitchReducer
    from gmi_drl.envs.spec import EnvSpec
    from gmi_drl.optim.grad_step import make_grad_step

    torch.set_num_threads(1)
    red = SwitchReducer(a.addr, a.rank, a.world, job_id="bench-stale-sync", timeout_s=120,
                        join_timeout_s=120)
    spec = EnvSpec("Hopper-v5", gym.spaces.Box(-np.inf, np.inf, (11,)),
                   gym.spaces.Box(-1.0, 1.0, (3,)), None)  # Hopper-v5's spaces
    bound = None if a.staleness[0] < 0 else a.staleness[0]
    steps = functools.partial(make_grad_step, reducer=red, staleness_bound=bound, compile=False)
    envs = 8
    ctx = AlgoContext(spec, envs, ModelConfig(), 1000, 0, steps, torch.Generator())
    torch.manual_seed(0)
    learner = build_algorithm(PPOConfig(num_steps=STALE_BATCH // envs,
                                        num_minibatches=STALE_MINIBATCHES,
                                        update_epochs=STALE_EPOCHS), ctx)
    g, buf = torch.Generator().manual_seed(a.rank), learner.buf
    buf.obs.copy_(torch.randn(buf.obs.shape, generator=g))
    buf.actions.copy_(torch.randn(buf.actions.shape, generator=g).clamp(-1, 1))
    buf.logprobs.copy_(-torch.rand(buf.logprobs.shape, generator=g) * 3)
    for x in (buf.values, buf.advantages, buf.returns):
        x.copy_(torch.randn(x.shape, generator=g))
    times, staleness = [], []
    for i in range(1 + a.updates):
        t0 = time.perf_counter()
        stats = learner.update()
        if i:
            times.append(time.perf_counter() - t0)
            staleness.append(stats.get("comm/staleness_mean", 0.0))
    learner.close()
    red.close()
    print(json.dumps({"rank": a.rank, "times": times, "staleness": staleness}), flush=True)


def stale_sync_driver(a) -> None:
    py = sys.executable
    print(f"\n{a.workers[0]} PPO learners on loopback, Hopper-v5 networks (40 KB), "
          f"{STALE_BATCH} samples x {STALE_EPOCHS} epochs / {STALE_MINIBATCHES} minibatches = "
          f"{STALE_EPOCHS * STALE_MINIBATCHES} aggregations per update; load average "
          f"{os.getloadavg()[0]:.2f}")
    names = ["sync" if s < 0 else f"S={s}" for s in a.staleness]
    print(f"{'delay ms':>8} | " + " | ".join(f"{m:>16}" for m in names)
          + " | ms per update (median), mean staleness")
    for delay in a.delays_ms:
        sw = subprocess.Popen([py, "-m", "gmi_drl.comm.switch", "serve", "--bind", "127.0.0.1:0",
                               "--mtu", str(a.mtu), "--delay-ms", str(delay), "--stats-interval",
                               "0", "--member-timeout", "120"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            addr = sw.stdout.readline().split()[-1]
            cells = []
            for s in a.staleness:
                procs = [subprocess.Popen(
                    [py, os.path.abspath(__file__), "_stale_sync_worker", "--rank", str(r), "--world",
                     str(a.workers[0]), "--addr", addr, "--staleness", str(s), "--updates",
                     str(a.updates)], stdout=subprocess.PIPE, text=True)
                    for r in range(a.workers[0])]
                results = []
                for p in procs:
                    out, _ = p.communicate(timeout=a.timeout)
                    if p.returncode != 0:
                        raise RuntimeError(f"stale-sync worker failed ({p.returncode})")
                    results.append(json.loads(out.strip().splitlines()[-1]))
                per_update = np.max([r["times"] for r in results], axis=0) * 1000
                stale = np.mean([r["staleness"] for r in results])
                cells.append(f"{np.median(per_update):8.1f} ms {stale:4.2f}")
            print(f"{delay:>8} | " + " | ".join(f"{c:>16}" for c in cells), flush=True)
        finally:
            sw.terminate()
            sw.communicate(timeout=10)


def memory_bandwidth_gbs() -> float:
    """This machine's memory bandwidth, GB/s: bytes read + written by one core's `np.copyto` of
    256 MiB, best of 5."""
    src = np.ones(32 << 20, np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def _cell(method: str, r: tuple) -> str:
    cell = f"{r[0]:7.1f} / {r[1]:6.1f} / {r[2]:6.0f}"
    return cell + (f" / {r[3]:5.0f}" if method in SWITCH_METHODS else "")


class Loopback:
    """What `run_method` uses of a `gmi_drl.comm.switch.netns.Rack`, on 127.0.0.1: every role a
    plain process of this host, every address loopback (``--loopback``)."""

    root, tors, ps_ip = "sw", 0, "127.0.0.1"

    def __init__(self, num_workers: int, *_) -> None:
        self.worker_ip = self.worker_gateway = ["127.0.0.1"] * num_workers
        self.worker_dev = ["lo"] * num_workers
        self._pids: dict[str, list[int]] = {}

    def __enter__(self) -> "Loopback":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def popen(self, role: str, argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, **kw)
        self._pids.setdefault(role, []).append(proc.pid)
        return proc

    def switch_roles(self) -> list[str]:
        return [self.root]

    def cpu_seconds(self, roles: list[str] | None = None) -> float:
        """CPU seconds (user + system) so far of the live processes of ``roles`` (all)."""
        total = 0
        for role, pids in self._pids.items():
            for pid in pids if roles is None or role in roles else ():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:  # exited
                    continue
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")


def driver(a) -> None:
    from gmi_drl.comm.switch.netns import Rack, netns_available

    why = None if a.loopback else netns_available()
    if why:
        sys.exit(f"benchmarks/switch.py {why}")
    labels = a.sizes.split(",")
    bw = memory_bandwidth_gbs()
    print(f"memory bandwidth (np.copyto, one core): {bw:.1f} GB/s")
    switches = [m for m in a.methods if m in SWITCH_METHODS]
    for world in a.workers:
        per_tor = None if world <= 4 else a.per_tor
        topo = "1 switch" if per_tor is None else f"{-(-world // per_tor)} ToR x {per_tor} + core"
        link = (f"{a.rate_mbit:g} Mbit/s tbf" if a.rate_mbit > 0 else "loopback (127.0.0.1)"
                if a.loopback else "unshaped veth")
        print(f"\n{world} workers ({topo}), links {link}, MTU {a.mtu or 'the daemon default'}, "
              f"load average {os.getloadavg()[0]:.2f}")
        with (Loopback if a.loopback else Rack)(world, per_tor, a.rate_mbit, a.mtu) as rack:
            res = {m: run_method(rack, m, world, labels, a) for m in a.methods}
        head = f"{'size':>8} | " + " | ".join(
            f"{m:>9} med / p95 / cpu" + (" / daemon ms" if m in SWITCH_METHODS else " ms")
            for m in a.methods)
        if a.rate_mbit > 0:
            head += " | floor ms"
        for m in switches:
            head += "".join(f" | {m}/{o}" for o in (["floor"] if a.rate_mbit > 0 else [])
                            + [x for x in ("ps", "ring") if x in res])
        print(head)
        for label in labels:
            row = f"{label:>8} | " + " | ".join(_cell(m, res[m][label]) for m in a.methods)
            floor = SIZES[label] * 8 / (a.rate_mbit * 1e6) * 1000 if a.rate_mbit > 0 else None
            if floor is not None:
                row += f" | {floor:8.1f}"
            for m in switches:
                sw = res[m][label][0]
                for o in ([floor] if floor is not None else []) + [
                        res[x][label][0] for x in ("ps", "ring") if x in res]:
                    row += f" | {sw / o:5.2f}x"
            print(row, flush=True)
        members = world + (-(-world // per_tor) if per_tor else 0)  # ToRs are the core's
        big = max(labels, key=SIZES.get)
        rates = {}
        for m in switches:
            # every member's contribution is aggregated once per iteration (no loss here); the
            # daemons' own counters over the whole run must agree
            expect = sum((WARMUP + _iters(lb, a.iters_scale)) * members * (SIZES[lb] // 4 * 4)
                         for lb in labels)
            got = res[m]["daemons"]["bytes_aggregated"]
            check = "counters agree" if got == expect else f"COUNTERS DISAGREE: {got} != {expect}"
            rates[m] = members * (SIZES[big] // 4 * 4) / (res[m][big][3] / 1000)
            print(f"{m} daemons at {big}: {rates[m] / 1e9:.2f} GB aggregated per CPU-second "
                  f"({members} members x {SIZES[big] / 2**20:.1f} MiB per {res[m][big][3]:.1f} ms "
                  f"of daemon CPU), {rates[m] / (bw * 1e9):.1%} of the memory bandwidth; "
                  f"{check}")
        if "switch" in rates and "switch-py" in rates:
            print(f"native / python data plane, bytes per CPU-second at {big}: "
                  f"{rates['switch'] / rates['switch-py']:.1f}x")
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps({"workers": world, "per_tor": per_tor, "rate_mbit": a.rate_mbit,
                                    "mtu": a.mtu, "memory_gbs": bw, "results": res}) + "\n")


def _check(p: argparse.ArgumentParser, a) -> None:
    """Refuse, as usage errors and before any rack or process starts, what the driver cannot
    run."""
    unknown = [label for label in a.sizes.split(",") if label not in SIZES]
    if unknown:
        p.error(f"--sizes {a.sizes}: {unknown} unknown; comma-separated, of {','.join(SIZES)}")
    for flag, value in (("--workers", min(a.workers)), ("--per-tor", a.per_tor),
                        ("--updates", a.updates)):
        if value < 1:
            p.error(f"{flag} {value}: must be >= 1")
    for flag, value in (("--iters-scale", a.iters_scale), ("--timeout", a.timeout)):
        if value <= 0:
            p.error(f"{flag} {value:g}: must be > 0")
    for flag, value in (("--rate-mbit", a.rate_mbit), ("--delays-ms", min(a.delays_ms))):
        if value < 0:
            p.error(f"{flag} {value:g}: must be >= 0")
    if a.loopback and (a.rate_mbit != 0 or max(a.workers) > 4 or a.mode != "reduce"):
        p.error("--loopback: --mode reduce with --rate-mbit 0 and at most 4 workers (no links "
                "to shape, one switch)")
    if a.mtu == 0 and not a.loopback:
        p.error("--mtu 0 (the daemon's default) is for --loopback; the rack's links need one")
    if min(a.staleness) < -1:
        p.error(f"--staleness {min(a.staleness)}: a bound >= 0, or -1 (synchronous)")
    if a.mode == "stale-sync" and len(a.workers) > 1:
        p.error(f"--workers {' '.join(map(str, a.workers))}: --mode stale-sync runs one worker "
                "count")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("role", nargs="?", default="driver",
                   choices=["driver", "_worker", "_stale_sync_worker"], help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=["reduce", "stale-sync"], default="reduce",
                   help="reduce: aggregation time per iteration in the emulated rack (root); "
                        "stale-sync: PPO updates through one switch daemon on loopback")
    p.add_argument("--workers", type=int, nargs="+", default=[4],
                   help="worker counts, one rack and table each (>= 1); --mode stale-sync: one "
                        "count")
    p.add_argument("--per-tor", type=int, default=3,
                   help="workers per ToR switch of a rack of more than 4 workers (a tree under "
                        "one core)")
    p.add_argument("--methods", nargs="+", default=["switch", "ring", "ps"],
                   choices=[*SWITCH_METHODS, "ring", "ps"],
                   help="switch: the native data plane; switch-py: the Python one")
    p.add_argument("--sizes", default=",".join(SIZES),
                   help=f"vectors to aggregate, comma-separated, of {','.join(SIZES)}")
    p.add_argument("--iters-scale", type=float, default=1.0,
                   help="multiply each size's timed iterations (" + ", ".join(
                       f"{k} {v}" for k, v in ITERS.items()) + "; at least 3) by this (> 0)")
    p.add_argument("--rate-mbit", type=float, default=100.0,
                   help="tbf rate of every link, Mbit/s; 0: unshaped veth links (CPU-bound)")
    p.add_argument("--mtu", type=int, default=9000,
                   help="MTU of the rack's links and the switch daemons' packets, bytes (0 with "
                        "--loopback: the daemon's default)")
    p.add_argument("--loopback", action="store_true",
                   help="--mode reduce on 127.0.0.1, no rack (no root needed)")
    p.add_argument("--switch-opts", default="",
                   help="more options of every switch daemon, e.g. \"--slots 1024 --window-bytes "
                        "8388608\"")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds to wait for each worker process (> 0)")
    p.add_argument("--verbose", action="store_true", help="print the switches' counters")
    p.add_argument("--json", default=None, help="append results as JSON lines to this file")
    p.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 2.0, 5.0],
                   help="--mode stale-sync: the switch's added latency per packet sent, ms")
    p.add_argument("--staleness", type=int, nargs="+", default=[-1, 1, 2, 4],
                   help="--mode stale-sync: staleness bounds to compare (-1: synchronous); a worker "
                        "takes one")
    p.add_argument("--updates", type=int, default=5,
                   help="--mode stale-sync: timed updates, after one warm-up (>= 1)")
    for internal in ("--method", "--addr", "--ifname"):  # of the worker roles, set by the driver
        p.add_argument(internal, help=argparse.SUPPRESS)
    for internal in ("--rank", "--world"):
        p.add_argument(internal, type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.role == "driver":
        _check(p, a)
        (stale_sync_driver if a.mode == "stale-sync" else driver)(a)
    else:
        {"_worker": worker_main, "_stale_sync_worker": stale_sync_worker_main}[a.role](a)


if __name__ == "__main__":
    main()
