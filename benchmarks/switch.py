"""Per-iteration gradient aggregation time in an emulated rack: iSwitch vs ring vs PS.

Builds the `gmi_drl.comm.switch.netns.Rack` (root only): worker namespaces, each with its own
rate-limited veth link (tc tbf, 100 Mbit/s by default) to a switch namespace that forwards IP,
and a parameter-server namespace on the same switch. With more than 4 workers the rack is a tree:
``--per-tor`` workers per ToR under one core (iSwitch Fig. 15). On that topology it times:

- ``switch``: `SwitchReducer` through the aggregation daemon(s) running in the switch namespaces;
- ``ring``: torch.distributed gloo ``all_reduce`` between the workers (TCP through the switch);
- ``ps``: a parameter server (TCP): every worker sends its vector, the server sums in rank
  order, divides and sends the mean back to every worker.

Per iteration the aggregation time is the slowest worker's ``allreduce`` call; the table shows its
median and 95th percentile (ms) over the timed iterations, after 2 warm-up iterations.

    sudo .venv/bin/python benchmarks/switch.py --workers 4
    sudo .venv/bin/python benchmarks/switch.py --workers 6 9 12 --per-tor 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np

SIZES = {"40KB": 40 * 1024, "157.5KB": int(157.5 * 1024), "3.3MB": int(3.3 * 2**20),
         "6.4MB": int(6.4 * 2**20)}
ITERS = {"40KB": 30, "157.5KB": 20, "3.3MB": 6, "6.4MB": 6}
WARMUP = 2
SWITCH_PORT, PS_PORT, RING_PORT = 9999, 9998, 29500


def _iters(label: str, scale: float) -> int:
    return max(3, int(round(ITERS[label] * scale)))


# ---- processes inside the rack -----------------------------------------------------------------

def worker_main(a) -> None:
    import torch

    torch.set_num_threads(1)
    labels = a.sizes.split(",")
    if a.method == "switch":
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
        host, port = a.addr.rsplit(":", 1)
        sock = _connect(host, int(port))
        sock.sendall(a.rank.to_bytes(4, "big"))

        def reduce(t):
            sock.sendall(t.numpy().data)
            _recv_into(sock, memoryview(t.numpy()).cast("B"))
    out = {}
    for label in labels:
        n = SIZES[label] // 4
        t = torch.randn(n, generator=torch.Generator().manual_seed(a.rank))
        times = []
        for i in range(WARMUP + _iters(label, a.iters_scale)):
            t0 = time.perf_counter()
            reduce(t)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        out[label] = times
    print(json.dumps({"rank": a.rank, "times": out}), flush=True)
    if a.method == "switch":
        red.close()
    elif a.method == "ring":
        import torch.distributed as dist

        dist.destroy_process_group()


def _connect(host: str, port: int) -> socket.socket:
    for _ in range(600):
        try:
            s = socket.create_connection((host, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no parameter server at {host}:{port}")


def _recv_into(sock: socket.socket, mv: memoryview) -> None:
    got = 0
    while got < len(mv):
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise RuntimeError("connection closed")
        got += k


def ps_main(a) -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", PS_PORT))
    srv.listen(a.world)
    conns = {}
    while len(conns) < a.world:
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rank = bytearray(4)
        _recv_into(c, memoryview(rank))
        conns[int.from_bytes(rank, "big")] = c
    srv.close()
    for label in a.sizes.split(","):
        n = SIZES[label] // 4
        bufs = np.zeros((a.world, n), np.float32)
        acc = np.zeros(n, np.float32)
        for _ in range(WARMUP + _iters(label, a.iters_scale)):
            th = [threading.Thread(target=_recv_into, args=(conns[r], memoryview(bufs[r]).cast("B")))
                  for r in range(a.world)]
            for t in th:
                t.start()
            for t in th:
                t.join()
            acc[:] = bufs[0]
            for r in range(1, a.world):
                acc += bufs[r]
            acc /= np.float32(a.world)
            th = [threading.Thread(target=conns[r].sendall, args=(acc.data,)) for r in range(a.world)]
            for t in th:
                t.start()
            for t in th:
                t.join()
    for c in conns.values():
        c.close()


# ---- the driver --------------------------------------------------------------------------------

def run_method(rack, method: str, world: int, labels: list[str], a) -> dict:
    py = [sys.executable, os.path.abspath(__file__)]
    common = ["--sizes", ",".join(labels), "--iters-scale", str(a.iters_scale)]
    helpers = []
    try:
        if method == "switch":
            mtu = ["--mtu", str(a.mtu), "--member-timeout", "120", "--stats-interval", "0"]
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
            helpers.append(rack.popen("ps", [*py, "_ps", "--world", str(world), *common]))
        procs = []
        for r in range(world):
            if method == "switch":
                addr = f"{rack.worker_gateway[r]}:{SWITCH_PORT}"
            elif method == "ring":
                addr = f"{rack.worker_ip[0]}:{RING_PORT}"
            else:
                addr = f"{rack.ps_ip}:{PS_PORT}"
            procs.append(rack.popen(f"w{r}", [*py, "_worker", "--method", method, "--rank", str(r),
                                              "--world", str(world), "--addr", addr, "--ifname",
                                              rack.worker_dev[r], *common],
                                    stdout=subprocess.PIPE, text=True))
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=a.timeout)
            if p.returncode != 0:
                raise RuntimeError(f"{method} worker failed ({p.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
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
                h.stdout.close()
    table = {}
    for label in labels:
        per_iter = np.max([r["times"][label] for r in results], axis=0) * 1000
        table[label] = (float(np.median(per_iter)), float(np.percentile(per_iter, 95)))
    return table


def driver(a) -> None:
    from gmi_drl.comm.switch.netns import Rack, netns_available

    why = netns_available()
    if why:
        sys.exit(f"benchmarks/switch.py {why}")
    labels = a.sizes.split(",")
    for world in a.workers:
        per_tor = None if world <= 4 else a.per_tor
        topo = "1 switch" if per_tor is None else f"{-(-world // per_tor)} ToR x {per_tor} + core"
        print(f"\n{world} workers ({topo}), links {a.rate_mbit} Mbit/s tbf, MTU {a.mtu}")
        with Rack(world, per_tor, a.rate_mbit, a.mtu) as rack:
            res = {m: run_method(rack, m, world, labels, a) for m in a.methods}
        head = f"{'size':>8} | " + " | ".join(f"{m:>8} med / p95 ms" for m in a.methods)
        if "switch" in a.methods:
            head += " | sw/ps  | sw/ring"
        print(head)
        for label in labels:
            row = f"{label:>8} | " + " | ".join(
                f"{res[m][label][0]:8.1f} / {res[m][label][1]:7.1f}" for m in a.methods)
            if "switch" in a.methods:
                sw = res["switch"][label][0]
                row += " | " + (f"{sw / res['ps'][label][0]:5.2f}x" if "ps" in res else "   - ")
                row += " | " + (f"{sw / res['ring'][label][0]:5.2f}x" if "ring" in res else "   - ")
            print(row, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps({"workers": world, "per_tor": per_tor, "rate_mbit": a.rate_mbit,
                                    "mtu": a.mtu, "results": res}) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", nargs="?", default="driver", choices=["driver", "_worker", "_ps"])
    p.add_argument("--workers", type=int, nargs="+", default=[4])
    p.add_argument("--per-tor", type=int, default=3)
    p.add_argument("--methods", nargs="+", default=["switch", "ring", "ps"])
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--iters-scale", type=float, default=1.0)
    p.add_argument("--rate-mbit", type=float, default=100.0)
    p.add_argument("--mtu", type=int, default=9000)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--verbose", action="store_true", help="print the switches' counters")
    p.add_argument("--json", default=None, help="append results as JSON lines to this file")
    p.add_argument("--method")
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--addr")
    p.add_argument("--ifname")
    a = p.parse_args(argv)
    {"driver": driver, "_worker": worker_main, "_ps": ps_main}[a.role](a)


if __name__ == "__main__":
    main()
