"""A parameter server over TCP: the baselines iSwitch measures against, synchronous ("PS":
workers push gradients to one server that aggregates them and sends the result back; the
iSwitch paper §2.2 and §5.1, Table 3 and Fig. 12) and asynchronous ("Async PS": §2.2 Fig. 3,
§6.2 Table 5 and Fig. 14/15b, with the staleness bound S = 3 the paper gives both asynchronous
methods).

**Synchronous groups.**
Every worker sends its flat float32 gradient to the server; once all ``world_size`` have arrived
the server sums them in rank order, divides by ``world_size`` and sends the mean back to every
worker. All traffic crosses the server's one link, twice: what in-network aggregation removes.

Wire format (big-endian): a worker opens with ``HELLO = b"GPS1" rank:u32 world_size:u32``, and the
server answers ``b"OK"`` or ``b"NO" length:u32`` and a UTF-8 reason; then per round the worker
sends ``round:u64 nbytes:u64`` and the payload, and receives ``nbytes`` bytes of mean. A
malformed hello, a rank taken twice or another group size is refused with its reason. A round
out of order, sizes that differ between workers, or a worker that leaves or falls silent end
the group: the server logs why and closes every worker's connection (each worker's next
`PSReducer.allreduce_` raises), then waits for the next group (one group at a time).

**Asynchronous groups** (`AsyncPSClient`, hello ``b"GPA1" rank:u32 world_size:u32 S:u32``; every
member must announce the same ``S``). The server holds the current weights ``θ_u`` of each
*stream* (one per optimised module: DDPG's actor and critic are two streams) and serves every
worker on a thread of its own, so a slow worker never blocks a fast one. A worker pulls ``θ_u``
and its version ``u``, computes a gradient on it, turns it into an *update* ``Δ`` with its
learner's own rule (gradient clipping, its optimizer, the learning rate of the moment)
and pushes ``Δ`` tagged with the version ``v`` it was computed on. The server applies it at once
if its current version ``u`` has ``u - v <= S`` (``θ ← θ + Δ``, ``u ← u + 1``), else drops it and
counts it; either way it answers with the current ``θ`` and ``u``, the worker's next pull.

Why updates and not gradients: every gmi-drl learner steps its modules with its own optimizer
(Adam or RMSprop, with or without TF-style epsilon), gradient-norm clip and learning-rate
schedule, and a server in this layer cannot run the optimizers of the layer above. Pushing the
update keeps one mechanism for every learner: the server's rule is an addition, exact and the
same for all. The cost of the choice: each worker's optimizer moments see that worker's
gradients (a dropped one included), not the stream's. ``S = 0`` applies only updates computed
on the current ``θ``: with one worker every update, so ``θ`` follows the synchronous
single-worker trajectory (up to float32 rounding of ``θ + Δ``); with several, only the first
push after each change (the others are dropped).

Async messages: ``op:u8 stream:u32 version:u64 nbytes:u64`` and ``nbytes`` of payload; the
answer is ``status:u8 version:u64 nbytes:u64`` and the weights. ``PULL`` (payload: the worker's
weights, which initialise a stream the server does not know yet; empty: the stream must exist),
``PUSH`` (payload: ``Δ`` computed on ``version``; status ``APPLIED`` or ``DROPPED``) and
``FINISH`` (the worker is done with the stream: the answer waits until every member has
finished it or left, so every worker ends with the same, final weights; workers finish the
streams in the same order, and every worker finishes every stream it pulled: one that pulled a
stream and never finishes it holds the others until it leaves). A member that closes
its connection has left; a malformed message, a version from the future or a size that differs
from the stream's ends the group as above.

    python -m gmi_drl.comm.ps --bind 0.0.0.0:9998 --workers 4
"""

from __future__ import annotations

import argparse
import logging
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from gmi_drl.comm.reducer import GradReducer, flatten_into, unflatten_from

log = logging.getLogger(__name__)

MAGIC = b"GPS1"
ASYNC_MAGIC = b"GPA1"
_HELLO = struct.Struct(">4sII")
_STALENESS = struct.Struct(">I")
_OP = struct.Struct(">BIQQ")
_ANSWER = struct.Struct(">BQQ")
PULL, PUSH, FINISH = 0, 1, 2
"""async ops"""
SENT, APPLIED, DROPPED = 0, 1, 2
"""async answers' status: the weights (``PULL``, ``FINISH``), or to a ``PUSH``"""
_ROUND = struct.Struct(">QQ")
_REFUSAL = struct.Struct(">2sI")
MAX_BYTES = 1 << 31
"""Largest gradient a round carries, bytes"""


class GroupError(RuntimeError):
    """A group of workers cannot go on (the server logs why and closes the group)."""


class _GroupLeft(Exception):
    """Every worker closed its connection between rounds: the group is done."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    Raises:
        ValueError: no port, or a port that is not an int in ``[0, 65535]``.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address {addr!r} must be HOST:PORT")
    return host or "0.0.0.0", int(port)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed")
        got += k


def _recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_exact(sock, memoryview(buf))
    return bytes(buf)


class ParameterServer:
    """Serves one group of ``num_workers`` workers at a time, forever (until `close`).

    Args:
        bind: ``(host, port)``; port 0 picks a free one (`address` tells which).
        num_workers: the group size every worker must announce.
        member_timeout_s: a worker silent this long ends the group, seconds: inside a round,
            before its hello, and between its rounds or updates too (raise it where a run
            pauses longer between reductions, e.g. a long evaluation); in an asynchronous
            group, also the longest ``FINISH`` wait.

    Attributes:
        rounds, groups, bytes_in: synchronous rounds, groups served, bytes received in rounds.
        applied, dropped: asynchronous updates applied and dropped (staleness > S), all groups.
        streams: ``{stream id: state}`` of the current (or last) asynchronous group; a state has
            ``weights`` ``(P,) float32``, ``version`` (updates applied), ``dropped`` and
            ``staleness_counts`` (``{u - v: updates applied with it}``).

    Raises:
        ValueError: ``num_workers < 1``.
        OSError: the address cannot be bound.
    """

    def __init__(self, bind: tuple[str, int], num_workers: int,
                 member_timeout_s: float = 600.0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1")
        self.num_workers, self.member_timeout_s = num_workers, member_timeout_s
        self._srv = socket.create_server(bind, reuse_port=False)
        self._srv.listen(num_workers)
        self.rounds = self.groups = self.bytes_in = 0
        self.applied = self.dropped = 0
        self.streams: dict[int, _Stream] = {}

    @property
    def address(self) -> tuple[str, int]:
        return self._srv.getsockname()[:2]

    def serve_forever(self) -> None:
        """Accept a group, serve its rounds until a worker leaves, repeat."""
        while True:
            try:
                conns, bound = self._accept_group()
            except OSError:
                return  # closed
            try:
                if bound is None:
                    self._serve(conns)
                else:
                    self._serve_async(conns, bound)
            except _GroupLeft:
                log.info("parameter server: worker 0 closed its connection (the group is done, "
                         "or it left) after %d rounds in all", self.rounds)
            except GroupError as e:
                log.warning("parameter server: group ended: %s", e)
            finally:
                for c in conns:
                    c.close()
            self.groups += 1

    def _accept_group(self) -> tuple[list[socket.socket], int | None]:
        """The next group's connections by rank, and its staleness bound (``None``: a
        synchronous group); the first member fixes the kind, the others must match it."""
        conns: dict[int, socket.socket] = {}
        kind: tuple[bytes, int | None] | None = None
        while len(conns) < self.num_workers:
            c, peer = self._srv.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(self.member_timeout_s)
            try:
                magic, rank, world = _HELLO.unpack(_recv_bytes(c, _HELLO.size))
                bound = (_STALENESS.unpack(_recv_bytes(c, _STALENESS.size))[0]
                         if magic == ASYNC_MAGIC else None)
            except (OSError, struct.error):
                c.close()
                continue
            why = (f"bad hello from {peer[0]}" if magic not in (MAGIC, ASYNC_MAGIC) else
                   f"group size {world}, the server serves groups of {self.num_workers}"
                   if world != self.num_workers else
                   f"rank {rank} is not in [0, {world})" if rank >= world else
                   f"rank {rank} is taken" if rank in conns else
                   f"this member is {_kind(bound)}, the group forming is {_kind(kind[1])}"
                   if kind is not None and kind != (magic, bound) else None)
            if why is not None:
                _refuse(c, why)
                c.close()
                continue
            c.sendall(b"OK")
            conns[rank] = c
            kind = (magic, bound)
        return [conns[r] for r in range(self.num_workers)], kind[1]

    def _serve(self, conns: list[socket.socket]) -> None:
        buf = np.zeros(0, np.float32)
        acc = np.zeros(0, np.float32)
        expected = 0
        while True:
            nbytes = None
            for rank, c in enumerate(conns):
                try:
                    head = _recv_bytes(c, _ROUND.size)
                except (ConnectionError, socket.timeout) as e:
                    if rank == 0 and isinstance(e, ConnectionError):
                        raise _GroupLeft() from None  # closed between rounds
                    raise GroupError(f"worker {rank}: {e} before round {expected}") from None
                rnd, n = _ROUND.unpack(head)
                if rnd != expected or n % 4 or n > MAX_BYTES or (nbytes is not None
                                                                 and n != nbytes):
                    raise GroupError(f"worker {rank} sent round {rnd} of {n} bytes; expected "
                                     f"round {expected}"
                                     + (f" of {nbytes} bytes" if nbytes is not None else ""))
                if nbytes is None:
                    nbytes = n
                    if buf.nbytes != n:
                        buf, acc = np.zeros(n // 4, np.float32), np.zeros(n // 4, np.float32)
                try:
                    _recv_exact(c, memoryview(buf).cast("B"))
                except (ConnectionError, socket.timeout) as e:
                    raise GroupError(f"worker {rank}: {e} in round {rnd}") from None
                if rank == 0:
                    acc[...] = buf
                else:
                    acc += buf
            acc /= np.float32(self.num_workers)
            # counted before the results go out: a worker that has its result sees the count
            expected += 1
            self.rounds += 1
            self.bytes_in += nbytes * self.num_workers
            for rank, c in enumerate(conns):
                try:
                    c.sendall(memoryview(acc).cast("B"))
                except OSError as e:
                    raise GroupError(f"worker {rank}: {e}") from None

    def _serve_async(self, conns: list[socket.socket], bound: int) -> None:
        """Serve an asynchronous group: a thread per member, until every member left."""
        group = _AsyncGroup(bound, len(conns))
        group.conns = conns
        self.streams = group.streams
        threads = [threading.Thread(target=self._serve_member, args=(group, rank, c),
                                    name=f"ps-worker-{rank}", daemon=True)
                   for rank, c in enumerate(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if group.error is not None:
            raise GroupError(group.error)
        log.info("parameter server: asynchronous group done: %d updates applied, %d dropped",
                 self.applied, self.dropped)

    def _serve_member(self, group: "_AsyncGroup", rank: int, c: socket.socket) -> None:
        try:
            while True:
                try:
                    head = _recv_bytes(c, _OP.size)
                except ConnectionError:
                    return  # the member left
                op, sid, version, n = _OP.unpack(head)
                if op not in (PULL, PUSH, FINISH) or n % 4 or n > MAX_BYTES:
                    raise GroupError(f"worker {rank} sent op {op} of {n} bytes")
                payload = np.zeros(n // 4, np.float32)
                _recv_exact(c, memoryview(payload).cast("B"))
                status, version, out = self._async_op(group, rank, op, sid, version, payload)
                c.sendall(_ANSWER.pack(status, version, out.nbytes))
                c.sendall(memoryview(out).cast("B"))
        except (GroupError, OSError, ConnectionError) as e:
            why = str(e) if isinstance(e, GroupError) else f"worker {rank}: {e}"
            with group.cond:
                group.error = group.error or why
                group.cond.notify_all()
            for other in group.conns_to_close(rank):
                try:
                    other.shutdown(socket.SHUT_RDWR)  # its thread's recv returns
                except OSError:
                    pass
        finally:
            c.close()
            with group.cond:
                group.left.add(rank)
                group.cond.notify_all()

    def _async_op(self, group: "_AsyncGroup", rank: int, op: int, sid: int, version: int,
                  payload: np.ndarray) -> tuple[int, int, np.ndarray]:
        """One message of worker ``rank`` on stream ``sid``; returns the answer: its status, and
        the weights with their version (copied together). Raises `GroupError` for a bad
        message."""
        with group.cond:
            stream = group.streams.get(sid)
            if stream is None:
                if op != PULL or not payload.size:
                    raise GroupError(f"worker {rank}: stream {sid} is not initialised")
                stream = group.streams[sid] = _Stream(payload.copy())
            if payload.size and payload.size != stream.weights.size:
                raise GroupError(f"worker {rank} sent {payload.size} values on stream {sid} "
                                 f"of {stream.weights.size}")
            if op == PUSH:
                staleness = stream.version - version
                if staleness < 0:
                    raise GroupError(f"worker {rank} pushed on version {version} of stream "
                                     f"{sid}, which is at {stream.version}")
                if staleness <= group.bound:
                    stream.weights += payload
                    stream.version += 1
                    stream.staleness_counts[staleness] += 1
                    self.applied += 1
                    return APPLIED, stream.version, stream.weights.copy()
                stream.dropped += 1
                self.dropped += 1
                return DROPPED, stream.version, stream.weights.copy()
            if op == FINISH:
                stream.finished.add(rank)
                group.cond.notify_all()
                deadline = time.monotonic() + self.member_timeout_s
                while (len(stream.finished | group.left) < group.size
                       and group.error is None):
                    if not group.cond.wait(max(deadline - time.monotonic(), 0)):
                        raise GroupError(f"worker {rank} waited {self.member_timeout_s} s for "
                                         f"the others to finish stream {sid}")
            return SENT, stream.version, stream.weights.copy()

    def close(self) -> None:
        """Stop accepting; `serve_forever` returns once the group it serves ends."""
        try:
            self._srv.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._srv.close()


@dataclass
class _Stream:
    """The server's state of one optimised module in an asynchronous group."""

    weights: np.ndarray
    version: int = 0
    dropped: int = 0
    staleness_counts: Counter = field(default_factory=Counter)
    finished: set = field(default_factory=set)


class _AsyncGroup:
    """What the threads serving an asynchronous group share (under ``cond``)."""

    def __init__(self, bound: int, size: int) -> None:
        self.bound, self.size = bound, size
        self.cond = threading.Condition()
        self.streams: dict[int, _Stream] = {}
        self.left: set[int] = set()
        self.error: str | None = None
        self.conns: list[socket.socket] = []

    def conns_to_close(self, rank: int) -> list[socket.socket]:
        return [c for r, c in enumerate(self.conns) if r != rank]


def _kind(bound: int | None) -> str:
    return "synchronous" if bound is None else f"asynchronous (S = {bound})"


def _refuse(c: socket.socket, why: str) -> None:
    data = why.encode()
    try:
        c.sendall(_REFUSAL.pack(b"NO", len(data)) + data)
    except OSError:
        pass


def _join(addr: str, rank: int, world_size: int, hello: bytes, timeout_s: float,
          join_timeout_s: float) -> socket.socket:
    """A socket to the server at ``addr`` that joined with ``hello`` (retried up to
    ``join_timeout_s``). Raises ``RuntimeError`` with the reason when no server answers or it
    refuses."""
    host, port = parse_addr(addr)
    deadline = time.monotonic() + join_timeout_s
    waited = False
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no parameter server at {addr} within {join_timeout_s} "
                                   f"s: {e.strerror or e}; start it first: python -m "
                                   f"gmi_drl.comm.ps --bind {addr} --workers {world_size}"
                                   ) from None
            if not waited and rank == 0:  # a server started after the workers is fine
                log.warning("parameter server at %s: %s; retrying for up to %g s", addr,
                            e.strerror or e, join_timeout_s)
                waited = True
            time.sleep(0.1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.sendall(hello)
        status = _recv_bytes(sock, 2)
        if status == b"OK":
            return sock
        (length,) = struct.unpack(">I", _recv_bytes(sock, 4))
        why = _recv_bytes(sock, length).decode(errors="replace")
    except (OSError, ConnectionError) as e:
        why = str(e)
    sock.close()
    raise RuntimeError(f"parameter server {addr} refused worker {rank} joining: {why}")


class PSReducer(GradReducer):
    """A worker of a `ParameterServer` group: `allreduce_` pushes the flat gradient and
    receives the mean (iSwitch's PS baseline, synchronous).

    Args:
        addr: the server's ``HOST:PORT``.
        rank, world_size: this worker and the group size.
        timeout_s: longest wait for the mean of a round, seconds.
        join_timeout_s: how long to retry reaching the server, seconds.

    Raises:
        ValueError: a bad address or rank.
        RuntimeError: no server answered within ``join_timeout_s``, or it refused this worker
            (the reason is in the message).
    """

    def __init__(self, addr: str, rank: int, world_size: int, timeout_s: float = 600.0,
                 join_timeout_s: float = 60.0) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.addr, self.rank, self.world_size = addr, rank, world_size
        self._sock = _join(addr, rank, world_size, _HELLO.pack(MAGIC, rank, world_size),
                           timeout_s, join_timeout_s)
        self._round = 0
        self._flat = torch.zeros(0)

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        total = sum(t.numel() for t in tensors)
        if self._flat.numel() != total:
            self._flat = torch.zeros(total, dtype=torch.float32)
        flatten_into(tensors, self._flat)
        data = memoryview(self._flat.numpy()).cast("B")
        try:
            self._sock.sendall(_ROUND.pack(self._round, len(data)))
            self._sock.sendall(data)
            _recv_exact(self._sock, data)
        except (OSError, ConnectionError) as e:
            raise RuntimeError(f"parameter server {self.addr}, round {self._round}, worker "
                               f"{self.rank}: {e} (a member left or the server stopped; its "
                               f"log says why)") from None
        self._round += 1
        unflatten_from(self._flat, tensors)

    def close(self) -> None:
        sock, self._sock = getattr(self, "_sock", None), None
        if sock is not None:
            sock.close()


class AsyncPSClient(GradReducer):
    """A worker of an asynchronous `ParameterServer` group (iSwitch's Async PS baseline, §2.2
    Fig. 3, with staleness bound ``S``; see the module docstring). Not a collective: its
    `allreduce_` raises; a learner reaches it through ``gmi_drl.optim.grad_step.AsyncPSGradStep``
    (one stream per optimised module, numbered by `new_stream` in construction order, the same
    on every worker). Calls are blocking and come from one thread.

    Args:
        addr: the server's ``HOST:PORT``.
        rank, world_size: this worker and the group size.
        staleness_bound: ``S >= 0``: the server applies an update computed on version ``v``
            while its version ``u`` has ``u - v <= S``, and drops it otherwise.
        timeout_s: longest wait for an answer (and for the others at `finish`), seconds.
        join_timeout_s: how long to retry reaching the server, seconds.

    Raises:
        ValueError: a bad address or rank, ``staleness_bound < 0``.
        RuntimeError: no server answered within ``join_timeout_s``, or it refused this worker
            (the reason is in the message: e.g. another member announced another ``S``).

    Attributes:
        pushed, applied, dropped: this worker's updates pushed, applied and dropped.
    """

    def __init__(self, addr: str, rank: int, world_size: int, staleness_bound: int,
                 timeout_s: float = 600.0, join_timeout_s: float = 60.0) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if not 0 <= staleness_bound < 1 << 32:
            raise ValueError(f"staleness_bound={staleness_bound} must be in [0, 2**32)")
        self.addr, self.rank, self.world_size = addr, rank, world_size
        self.staleness_bound = staleness_bound
        self._sock = _join(addr, rank, world_size, _HELLO.pack(ASYNC_MAGIC, rank, world_size)
                           + _STALENESS.pack(staleness_bound), timeout_s, join_timeout_s)
        self._streams = 0
        self.pushed = self.applied = self.dropped = 0

    def new_stream(self) -> int:
        """The id of one more optimised module (0, 1, ... in call order)."""
        self._streams += 1
        return self._streams - 1

    def pull(self, stream: int, weights: np.ndarray) -> int:
        """Overwrite ``weights`` ``(P,) float32`` with the server's current weights of
        ``stream``; a stream the server does not know yet starts from ``weights`` (every worker
        passes the same initial weights; the first to arrive wins). Returns their version.

        Raises:
            RuntimeError: the group broke or the server stopped.
        """
        return self._ask(PULL, stream, 0, weights, weights)[1]

    def push(self, stream: int, version: int, update: np.ndarray,
             weights: np.ndarray) -> tuple[bool, int]:
        """Push ``update`` ``(P,) float32`` (what the learner's rule adds to the weights,
        computed on version ``version``) and pull: ``weights`` receives the server's current
        weights. Returns ``(applied, version of weights)``; an update that was not applied was
        ``> S`` versions stale.

        Raises:
            RuntimeError: the group broke or the server stopped.
        """
        status, now = self._ask(PUSH, stream, version, update, weights)
        self.pushed += 1
        self.applied += status == APPLIED
        self.dropped += status == DROPPED
        return status == APPLIED, now

    def finish(self, stream: int, weights: np.ndarray) -> int:
        """Done with ``stream``: wait until every worker finished it (or left), then pull its
        final weights into ``weights``. Returns their version.

        Raises:
            RuntimeError: the group broke, the server stopped, or the others took longer than
                ``timeout_s``.
        """
        return self._ask(FINISH, stream, 0, np.zeros(0, np.float32), weights)[1]

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        raise RuntimeError("an asynchronous parameter server has no collective allreduce_: "
                           "gradient steps push updates (gmi_drl.optim.grad_step."
                           "AsyncPSGradStep)")

    def _ask(self, op: int, stream: int, version: int, payload: np.ndarray,
             out: np.ndarray) -> tuple[int, int]:
        data = memoryview(np.ascontiguousarray(payload, np.float32)).cast("B")
        try:
            self._sock.sendall(_OP.pack(op, stream, version, len(data)))
            self._sock.sendall(data)
            status, now, n = _ANSWER.unpack(_recv_bytes(self._sock, _ANSWER.size))
            if n != out.nbytes:
                raise ConnectionError(f"the server sent {n} bytes of weights for "
                                      f"{out.nbytes}")
            _recv_exact(self._sock, memoryview(out).cast("B"))
        except (OSError, ConnectionError, struct.error) as e:
            raise RuntimeError(f"parameter server {self.addr}, stream {stream}, worker "
                               f"{self.rank}: {e} (a member left or the server stopped; its "
                               f"log says why)") from None
        return status, now

    def close(self) -> None:
        sock, self._sock = getattr(self, "_sock", None), None
        if sock is not None:
            sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gmi_drl.comm.ps``: prints ``listening on HOST:PORT``, serves until killed,
    then the counters."""
    p = argparse.ArgumentParser(prog="python -m gmi_drl.comm.ps",
                                description="a parameter server: synchronous gradient "
                                "averaging, or asynchronous updates under the staleness bound "
                                "its workers announce")
    p.add_argument("--bind", required=True, type=parse_addr, help="HOST:PORT to listen on")
    p.add_argument("--workers", required=True, type=int, help="workers per group")
    p.add_argument("--member-timeout", type=float, default=600.0,
                   help="end a group whose worker is silent this long (in a round or between "
                        "its rounds or updates), seconds")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    server = ParameterServer(a.bind, a.workers, a.member_timeout)
    host, port = server.address
    print(f"listening on {host}:{port}", flush=True)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: server.close())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.close()
    print(f"groups {server.groups} rounds {server.rounds} bytes_in {server.bytes_in} "
          f"applied {server.applied} dropped {server.dropped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
