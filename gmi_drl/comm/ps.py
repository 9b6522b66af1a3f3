"""A parameter server for gradient averaging over TCP: the baseline iSwitch measures against
(the iSwitch paper §2.2 and §5.1: "PS", workers push gradients to one server that
aggregates them and sends the result back; Table 3 and Fig. 12 compare the switch with it).

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

    python -m gmi_drl.comm.ps --bind 0.0.0.0:9998 --workers 4
"""

from __future__ import annotations

import argparse
import logging
import socket
import struct
import sys
import time
from typing import Sequence

import numpy as np
import torch

from gmi_drl.comm.reducer import GradReducer, flatten_into, unflatten_from

log = logging.getLogger(__name__)

MAGIC = b"GPS1"
_HELLO = struct.Struct(">4sII")
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
        member_timeout_s: a worker silent this long inside a round (or before its hello) ends
            the group, seconds.

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

    @property
    def address(self) -> tuple[str, int]:
        return self._srv.getsockname()[:2]

    def serve_forever(self) -> None:
        """Accept a group, serve its rounds until a worker leaves, repeat."""
        while True:
            try:
                conns = self._accept_group()
            except OSError:
                return  # closed
            try:
                self._serve(conns)
            except _GroupLeft:
                log.info("parameter server: worker 0 closed its connection (the group is done, "
                         "or it left) after %d rounds in all", self.rounds)
            except GroupError as e:
                log.warning("parameter server: group ended: %s", e)
            finally:
                for c in conns:
                    c.close()
            self.groups += 1

    def _accept_group(self) -> list[socket.socket]:
        conns: dict[int, socket.socket] = {}
        while len(conns) < self.num_workers:
            c, peer = self._srv.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(self.member_timeout_s)
            try:
                magic, rank, world = _HELLO.unpack(_recv_bytes(c, _HELLO.size))
            except (OSError, struct.error):
                c.close()
                continue
            why = (f"bad hello from {peer[0]}" if magic != MAGIC else
                   f"group size {world}, the server serves groups of {self.num_workers}"
                   if world != self.num_workers else
                   f"rank {rank} is not in [0, {world})" if rank >= world else
                   f"rank {rank} is taken" if rank in conns else None)
            if why is not None:
                _refuse(c, why)
                c.close()
                continue
            c.sendall(b"OK")
            conns[rank] = c
        return [conns[r] for r in range(self.num_workers)]

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

    def close(self) -> None:
        """Stop accepting; `serve_forever` returns once the group it serves ends."""
        try:
            self._srv.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._srv.close()


def _refuse(c: socket.socket, why: str) -> None:
    data = why.encode()
    try:
        c.sendall(_REFUSAL.pack(b"NO", len(data)) + data)
    except OSError:
        pass


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
        host, port = parse_addr(addr)
        deadline = time.monotonic() + join_timeout_s
        waited = False
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=timeout_s)
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
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(_HELLO.pack(MAGIC, rank, world_size))
        self._check_answer("joining")
        self._round = 0
        self._flat = torch.zeros(0)

    def _check_answer(self, what: str) -> None:
        try:
            status = _recv_bytes(self._sock, 2)
            if status == b"OK":
                return
            (length,) = struct.unpack(">I", _recv_bytes(self._sock, 4))
            why = _recv_bytes(self._sock, length).decode(errors="replace")
        except (OSError, ConnectionError) as e:
            why = str(e)
        raise RuntimeError(f"parameter server {self.addr} refused worker {self.rank} "
                           f"{what}: {why}")

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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gmi_drl.comm.ps``: prints ``listening on HOST:PORT``, serves until killed,
    then the counters."""
    p = argparse.ArgumentParser(prog="python -m gmi_drl.comm.ps",
                                description="a parameter server for gradient averaging")
    p.add_argument("--bind", required=True, type=parse_addr, help="HOST:PORT to listen on")
    p.add_argument("--workers", required=True, type=int, help="workers per group")
    p.add_argument("--member-timeout", type=float, default=600.0,
                   help="end a group whose worker is silent this long inside a round, seconds")
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
    print(f"groups {server.groups} rounds {server.rounds} bytes_in {server.bytes_in}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
