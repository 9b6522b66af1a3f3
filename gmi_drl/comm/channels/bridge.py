"""Experience channels across hosts: a TCP bridge between the fabric of a serving GMI and the
fabric of the trainer (GMI-DRL §4.2: the migrator's "other device: gather, then distribute").

Each side keeps the same shared-memory channels as on one host (`Fabric`, `Dispenser`,
`Batcher` are unchanged); the bridge moves published transfers between them:

- `BridgeClient` (in a serving GMI): a forwarder thread reads each transfer its dispenser
  published (the slots of every field ring at one position, in lockstep) and sends it, with the
  env steps taken since the last one; a receiver thread takes the weights the trainer pushes
  into the serving GMI's own `WeightStore`.
- `BridgeServer` (in the trainer): one reader thread per serving GMI writes each transfer
  straight from the socket into the claimed slots of its channel (``recv_into``, no copy in
  between); a pusher thread sends every new weight version to every serving GMI.

Back-pressure crosses the bridge: a full trainer channel stops its reader, TCP's window fills,
the forwarder's ``sendall`` waits, the serving GMI's local channel fills and its dispenser
blocks. When the trainer closes the bridge (the run ended or failed), each serving GMI's fabric
is stopped, which ends its loop.

Messages: a 28-byte header ``(magic b"GMIX", kind, serving, nbytes, value)`` then ``nbytes`` of
payload; kinds: HELLO (serving id), TRANSFER (value: env steps), WEIGHTS (value: version),
CREDIT (value: transfers the serving GMI may send more; flow control, `CREDITS` in flight).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

import numpy as np

from gmi_drl.comm.channels.fabric import Fabric
from gmi_drl.comm.channels.ring import ChannelClosed
from gmi_drl.comm.weights import WeightStore

log = logging.getLogger(__name__)

HEADER = struct.Struct("!4sIIQq")
MAGIC = b"GMIX"
HELLO, TRANSFER, WEIGHTS, CREDIT = 1, 2, 3, 4
CREDITS = 2
"""transfers a serving GMI may have in flight (sent, not yet in the trainer's channel): without
a bound, the kernel's socket buffers would queue hundreds of fragments, and their policy lag"""


class BridgeError(RuntimeError):
    """The other side of the bridge sent something that is not the protocol, or could not be
    reached."""


def _recv_into(conn: socket.socket, view: memoryview) -> None:
    while len(view):
        n = conn.recv_into(view)
        if n == 0:
            raise ConnectionError("the other side closed the bridge")
        view = view[n:]


def _recv_header(conn: socket.socket) -> tuple[int, int, int, int]:
    buf = bytearray(HEADER.size)
    _recv_into(conn, memoryview(buf))
    magic, kind, serving, nbytes, value = HEADER.unpack(buf)
    if magic != MAGIC or kind not in (HELLO, TRANSFER, WEIGHTS, CREDIT):
        raise BridgeError(f"not a gmi-drl bridge message (magic {magic!r}, kind {kind})")
    return kind, serving, nbytes, value


class BridgeServer:
    """The trainer's end: listens on ``bind``, fills ``fabric``'s channels to ``trainer`` and
    pushes ``store``'s new versions (``store_bytes`` each) to every serving GMI.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, fabric: Fabric, store: WeightStore, store_bytes: int,
                 bind: tuple[str, int], trainer: int = 0) -> None:
        self.fabric, self.store, self.trainer = fabric, store, trainer
        self._sock = socket.create_server(bind)
        self.address = self._sock.getsockname()[:2]
        self._conns: dict[int, tuple[socket.socket, threading.Lock]] = {}
        self._lock = threading.Lock()
        self._hello = threading.Condition(self._lock)
        self._greeted: set[int] = set()
        self._closed = False
        self._scratch = np.empty(store_bytes, np.uint8)
        threads = [threading.Thread(target=self._accept, daemon=True, name="bridge-accept"),
                   threading.Thread(target=self._push, daemon=True, name="bridge-push")]
        self._threads = list(threads)  # the accept thread appends a reader per connection
        for t in threads:
            t.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._read, args=(conn,), daemon=True,
                                 name="bridge-read")
            t.start()
            self._threads.append(t)

    def _read(self, conn: socket.socket) -> None:
        serving = None
        try:
            kind, serving, _, _ = _recv_header(conn)
            if kind != HELLO or not 0 <= serving < self.fabric.plan.num_serving:
                raise BridgeError(f"expected HELLO from a serving GMI, got kind {kind}, "
                                  f"serving {serving}")
            sending = threading.Lock()  # credits (here) and weights (the pusher) interleave
            with self._lock:
                self._conns[serving] = (conn, sending)
                self._greeted.add(serving)
                self._hello.notify_all()
            rings = self.fabric.rings(serving, self.trainer)
            size = sum(r.slot_bytes for r in rings)
            while True:
                kind, _, nbytes, steps = _recv_header(conn)
                if kind != TRANSFER or nbytes != size:
                    raise BridgeError(f"serving GMI {serving}: expected a transfer of {size} "
                                      f"bytes, got kind {kind} of {nbytes}")
                slots = [ring.claim() for ring in rings]  # waits while the channel is full
                for slot in slots:
                    _recv_into(conn, memoryview(slot))
                for ring in rings:  # the last field ring last: the batcher checks it
                    ring.publish()
                self.fabric.add_env_steps(serving, steps)
                with sending:  # it left the wire: the serving GMI may send one more
                    conn.sendall(HEADER.pack(MAGIC, CREDIT, serving, 0, 1))
        except (ConnectionError, OSError, ChannelClosed):
            pass  # the serving GMI ended (its launcher reports a failure) or we closed
        except BridgeError as e:
            log.error("bridge: %s; closing that connection", e)
        finally:
            with self._lock:
                if serving is not None and self._conns.get(serving, (None,))[0] is conn:
                    del self._conns[serving]
            conn.close()

    def _push(self) -> None:
        version = -1
        while not self._closed:
            got = self.store.read_into([self._scratch], newer_than=version)
            if got is None:
                time.sleep(0.001)
                continue
            version = got
            header = HEADER.pack(MAGIC, WEIGHTS, 0, self._scratch.nbytes, version)
            with self._lock:
                conns = list(self._conns.values())
            for conn, sending in conns:
                try:
                    with sending:
                        conn.sendall(header)
                        conn.sendall(memoryview(self._scratch))
                except OSError:
                    pass  # its reader notices and forgets it

    def wait_greeted(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` serving GMIs have said HELLO (at any time since the start), at
        most ``timeout_s`` seconds; whether they had. A trainer with nothing left to train (a
        run restarted from its final checkpoint) calls it before `close`, so no serving GMI is
        left knocking at a bridge that is gone."""
        with self._hello:
            return self._hello.wait_for(lambda: len(self._greeted) >= count, timeout_s)

    def close(self) -> None:
        """Stop accepting, close every connection (each serving GMI stops), join the threads."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close does not)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns = [conn for conn, _ in self._conns.values()]
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in list(self._threads):
            t.join(5)


class BridgeClient:
    """A serving GMI's end: forwards the transfers of ``fabric``'s channels from ``local``
    (default: ``serving``) to the trainer at ``address``, as serving GMI ``serving``, and takes
    its weights into ``store``.

    Raises:
        BridgeError: the trainer could not be reached within ``connect_timeout_s`` seconds.
    """

    def __init__(self, fabric: Fabric, store: WeightStore, store_bytes: int, serving: int,
                 address: tuple[str, int], trainer: int = 0,
                 connect_timeout_s: float = 60.0, local: int | None = None) -> None:
        self.fabric, self.store, self.serving, self.trainer = fabric, store, serving, trainer
        self.local = serving if local is None else local  # its channels' index in ``fabric``
        self._conn = _connect(address, connect_timeout_s)
        self._conn.sendall(HEADER.pack(MAGIC, HELLO, serving, 0, 0))
        self._scratch = np.empty(store_bytes, np.uint8)
        self._closed = False
        self._credits = threading.Semaphore(CREDITS)
        self._threads = [threading.Thread(target=self._forward, daemon=True,
                                          name="bridge-forward"),
                         threading.Thread(target=self._receive, daemon=True,
                                          name="bridge-weights")]
        for t in self._threads:
            t.start()

    def _forward(self) -> None:
        rings = self.fabric.rings(self.local, self.trainer)
        drop = self.fabric.plan.backpressure == "drop_oldest"
        sent_steps = 0
        try:
            while not self._closed and not self.fabric.stopped():
                pos = rings[-1].oldest()
                if pos is None:
                    time.sleep(0.0002)
                    continue
                for ring in rings[:-1]:  # lockstep: skip what the last field ring skipped
                    ring.oldest(rings[-1].written)
                views = [ring.slot_at(pos) for ring in rings]
                if drop:  # copy, then check that nothing overwrote it meanwhile
                    views = [v.copy() for v in views]
                    if not all(ring.valid_at(pos) for ring in rings):
                        for ring in rings:
                            ring.advance(pos)
                        rings[-1].advance(pos, dropped=True)
                        continue
                while not self._credits.acquire(timeout=0.1):  # the trainer's channel is full
                    if self._closed or self.fabric.stopped():
                        return
                steps = self.fabric.env_steps() - sent_steps
                self._conn.sendall(HEADER.pack(MAGIC, TRANSFER, self.serving,
                                               sum(v.nbytes for v in views), steps))
                for v in views:
                    self._conn.sendall(memoryview(v))
                sent_steps += steps
                for ring in rings:
                    ring.advance(pos)
        except OSError:
            pass
        finally:
            self.fabric.stop()  # the trainer is gone: this serving GMI's loop ends

    def _receive(self) -> None:
        try:
            while True:
                kind, _, nbytes, version = _recv_header(self._conn)
                if kind == CREDIT:
                    self._credits.release()
                    continue
                if kind != WEIGHTS or nbytes != self._scratch.nbytes:
                    raise BridgeError(f"expected weights of {self._scratch.nbytes} bytes, got "
                                      f"kind {kind} of {nbytes}")
                _recv_into(self._conn, memoryview(self._scratch))
                self.store.publish([self._scratch], version)
        except (ConnectionError, OSError):
            pass
        except BridgeError as e:
            log.error("bridge: %s", e)
        finally:
            self.fabric.stop()

    def close(self) -> None:
        self._closed = True
        try:
            self._conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()
        for t in self._threads:
            t.join(5)


def _connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
    """Connect, retrying while the trainer is not listening yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection(address, timeout=timeout_s)
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn
        except OSError as e:
            if time.monotonic() > deadline:
                raise BridgeError(f"the trainer's bridge at {address[0]}:{address[1]} did not "
                                  f"answer within {timeout_s} s: {e}") from None
            time.sleep(0.1)
