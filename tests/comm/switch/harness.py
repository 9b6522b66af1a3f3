"""Helpers of the switch tests: daemons as subprocesses, workers as forkserver processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import subprocess
import sys
import time

import numpy as np
import torch

from gmi_drl.comm.switch import protocol as P

_CTX = None


def ctx():
    """A forkserver context whose server has imported torch and the switch once, so starting a
    worker costs milliseconds, not the 2 s of a fresh interpreter. The server is this process's
    one, which the launcher's GMIs fork from too: it preloads their modules as well."""
    from gmi_drl.gmi.launcher import PRELOAD

    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload([*PRELOAD, "numpy", "gmi_drl.comm.switch",
                                     "tests.comm.switch.harness"])
    return _CTX


PLANE_AT: dict[str, str] = {}
"""switch address -> its ``--data-plane``: workers of a ``python`` switch take the Python client
path too (`SwitchReducer(native=False)`), so each parametrisation tests one whole path."""


class Switch:
    """One ``python -m gmi_drl.comm.switch serve`` process on loopback, at MTU 1500 unless
    ``args`` name one (the segment counts the tests check are for it; serve's own default on
    loopback is 9000)."""

    def __init__(self, *args: str, bind: str = "127.0.0.1:0") -> None:
        args = args if "--mtu" in args else ("--mtu", "1500", *args)
        self.args = list(args)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gmi_drl.comm.switch", "serve", "--bind", bind,
             "--stats-interval", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"switch did not start: {line!r} {self.proc.stderr.read()}")
        self.addr = line.split()[-1]
        if "--data-plane" in self.args:
            PLANE_AT[self.addr] = self.args[self.args.index("--data-plane") + 1]
        self.stderr = ""
        self.final: dict | None = None

    def stats(self, timeout_s: float = 5.0) -> dict:
        return query_stats(self.addr, timeout_s)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()

    def stop(self) -> int:
        """SIGTERM, wait, collect the final counters; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not self.proc.stdout.closed:
            import json

            out = self.proc.stdout.read().strip().splitlines()
            self.final = json.loads(out[-1]) if out else None
            self.stderr = self.proc.stderr.read()
            self.proc.stdout.close()
            self.proc.stderr.close()
        return self.proc.returncode


def query_stats(addr: str, timeout_s: float = 5.0) -> dict:
    host, port = addr.rsplit(":", 1)
    s = P.open_socket(("127.0.0.1", 0), 1 << 16)
    buf = bytearray(P.RX_BUFFER_BYTES)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            P.send_control(s, (host, int(port)), P.Action.STATS)
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                r, _, _ = select.select([s], [], [], 0.05)
                if not r:
                    continue
                n, tos, _ = P.recv_packet(s, buf)
                if tos == P.TOS_CONTROL:
                    action, value = P.decode_control(buf[:n])
                    if action == P.Action.STATS_REPLY:
                        return value
        raise TimeoutError(f"no STATS_REPLY from {addr}")
    finally:
        s.close()


SHAPES = [(97, 211), (3, 64), (1,), (12345,)]
"""33,005 floats: 91 segments of 366 floats at MTU 1500 (a window of 128, at the default 256
slots, would hold them all, so the tests shrink ``--slots`` to exercise the window)."""


def segments(shapes=SHAPES, seg_floats: int = 366) -> int:
    return -(-sum(int(np.prod(s)) for s in shapes) // seg_floats)


def grads(rank: int, step: int, shapes=SHAPES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(104729 * step + rank)
    return [torch.randn(s, generator=g) * (1.0 + 10.0 * rank) for s in shapes]


def reference(ranks_in_order, step: int, count: int, shapes=SHAPES) -> list[np.ndarray]:
    """float32 sum in the given order (nested lists: partial sums first), divided by count."""
    def total(node):
        if isinstance(node, int):
            return [t.numpy() for t in grads(node, step, shapes)]
        parts = [total(x) for x in node]
        acc = [p.copy() for p in parts[0]]
        for p in parts[1:]:
            for a, b in zip(acc, p):
                a += b
        return acc
    return [a / np.float32(count) for a in total(ranks_in_order)]


def worker(addr: str, rank: int, n: int, steps: int, q, opts: dict, shapes=SHAPES,
           events=None) -> None:
    """Join, run ``steps`` allreduce_ calls of `grads`, put ``(rank, results, retransmits)``.

    ``opts["die_after"]``: SIGKILL itself after that many steps (a member that goes silent).
    ``opts["pipelined"]``: begin every step's round at once, then pump them all to completion.
    ``events``: ``(ready_evt, go_evt)``: after step 0, set ready and wait for go.
    """
    from gmi_drl.comm.reducer import flatten_into
    from gmi_drl.comm.switch import SwitchReducer

    torch.set_num_threads(1)
    opts = dict(opts)
    die_after = opts.pop("die_after", None)
    pipelined = opts.pop("pipelined", False)
    addr = opts.pop("addr", addr)
    try:
        red = SwitchReducer(addr, rank, n, **opts)
        out = []
        if pipelined:
            for step in range(steps):
                ts = grads(rank, step, shapes)
                vec = np.empty(sum(t.numel() for t in ts), np.float32)
                flatten_into(ts, torch.from_numpy(vec))
                red.begin(vec)
            flat = []
            while len(flat) < steps:
                flat += red.pump(0.05)
            for v in flat:
                sizes = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
                out.append([a.reshape(s) for a, s in zip(np.split(v, sizes), shapes)])
            steps = 0
        for step in range(steps):
            if die_after is not None and step == die_after:
                os.kill(os.getpid(), 9)
            ts = grads(rank, step, shapes)
            red.allreduce_(ts)
            out.append([t.numpy() for t in ts])
            if events is not None and step == 0:
                events[0].set()
                events[1].wait(60)
        q.put((rank, out, red.retransmits))
        red.close()
    except Exception as e:  # reported to the test, which fails with it
        q.put((rank, repr(e), -1))


def run_workers(addr: str, n: int, steps: int, opts: dict | None = None, shapes=SHAPES,
                timeout_s: float = 60.0, per_rank: dict | None = None, events=None,
                expect: int | None = None, on_started=None, failures_ok: bool = False) -> dict:
    """Run ``n`` worker processes; returns ``{rank: (results, retransmits)}`` for those that
    report (``expect`` of them, default all; a worker that raised reports ``(repr, -1)``, which
    fails the test unless ``failures_ok``). Every process is reaped before returning."""
    c = ctx()
    q = c.Queue()
    procs = []
    for r in range(n):
        o = dict(opts or {})
        o.update((per_rank or {}).get(r, {}))
        if PLANE_AT.get(o.get("addr", addr)) == "python":
            o.setdefault("native", False)
        procs.append(c.Process(target=worker, args=(addr, r, n, steps, q, o, shapes, events)))
    for p in procs:
        p.start()
    try:
        if on_started is not None:
            on_started()
        got = {}
        for _ in range(n if expect is None else expect):
            rank, res, retx = q.get(timeout=timeout_s)
            got[rank] = (res, retx)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
        q.join_thread()
    bad = {r: v[0] for r, v in got.items() if isinstance(v[0], str)}
    assert failures_ok or not bad, f"workers failed: {bad}"
    return got


def assert_exact(got: dict, order, count: int, steps: int, shapes=SHAPES, ranks=None) -> None:
    for step in range(steps):
        ref = reference(order, step, count, shapes)
        for rank in (ranks if ranks is not None else got):
            for j, (a, b) in enumerate(zip(got[rank][0][step], ref)):
                assert a.dtype == np.float32 and a.shape == b.shape
                assert np.array_equal(a, b), (
                    f"rank {rank} step {step} tensor {j}: max |diff| {np.abs(a - b).max()}")
