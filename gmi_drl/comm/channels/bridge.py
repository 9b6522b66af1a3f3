"""Experience channels across hosts: a TCP bridge between the fabric of each serving GMI and
the fabric of each trainer GMI (GMI-DRL §4.2: the migrator's "other device: gather, then
distribute").

Each side keeps the same shared-memory channels as on one host (`Fabric`, `Dispenser`,
`Batcher` are unchanged); the bridge moves published transfers between them:

- `BridgeServer` (in each trainer GMI): one reader thread per serving GMI writes each transfer
  straight from the socket into the claimed slots of its channel (``recv_into``, no copy in
  between); the publishing trainer's pusher thread sends every new weight version to every
  serving GMI and to every following trainer.
- `BridgeClient` (in a serving GMI): gathers its transfers in one local channel; a forwarder
  thread reads each one (the slots of every field ring at one position, in lockstep) and
  distributes it to the trainer with the least queued work, as the trainers last reported it
  plus what is in flight to each (the migrator across sockets, `choose_trainer`'s rule); one
  receiver thread per trainer takes credits and weights.
- `WeightFollower` (in a trainer other than the publishing one): takes the weights the
  publishing trainer pushes into its own store, for the observation statistics.
- `BridgeDirectory`: where every trainer's bridge listens, in a ``torch.distributed.TCPStore``
  that GMI 0 hosts at the launcher's rendezvous address; the trainers' gradient group uses the
  same store.

Back-pressure crosses the bridge: a full trainer channel stops its reader, the serving GMI's
credits for that trainer run out, the forwarder picks another trainer or waits, the serving
GMI's local channel fills and its dispenser blocks. When a trainer closes its bridge (the run
ended or failed), each serving GMI's fabric is stopped, which ends its loop.

Messages: a 28-byte header ``(magic b"GMIX", kind, serving, nbytes, value)`` then ``nbytes`` of
payload; kinds: HELLO (serving id), TRANSFER (value: env steps since the last report),
WEIGHTS (value: version), CREDIT (one more transfer may be sent; value: transfers queued at that
trainer over every serving GMI), FOLLOW (a trainer that only takes weights; serving: its rank),
STEPS (value: env steps, sent to trainer 0 when a transfer went to another trainer), QUEUED
(value: transfers queued at that trainer, sent whenever it changed, so a serving GMI that sends
elsewhere still sees the queue drain).
"""

from __future__ import annotations

import datetime
import logging
import socket
import struct
import threading
import time
from typing import Sequence

import numpy as np

from gmi_drl.comm.channels.fabric import Fabric
from gmi_drl.comm.channels.ring import ChannelClosed
from gmi_drl.comm.weights import WeightStore

log = logging.getLogger(__name__)

HEADER = struct.Struct("!4sIIQq")
MAGIC = b"GMIX"
HELLO, TRANSFER, WEIGHTS, CREDIT, FOLLOW, STEPS, QUEUED = 1, 2, 3, 4, 5, 6, 7
KINDS = (HELLO, TRANSFER, WEIGHTS, CREDIT, FOLLOW, STEPS, QUEUED)
CREDITS = 2
"""transfers a serving GMI may have in flight to one trainer (sent, not yet in the trainer's
channel): without a bound, the kernel's socket buffers would queue hundreds of fragments, and
their policy lag"""


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
    if magic != MAGIC or kind not in KINDS:
        raise BridgeError(f"not a gmi-drl bridge message (magic {magic!r}, kind {kind})")
    return kind, serving, nbytes, value


def _send(conn: socket.socket, kind: int, serving: int = 0, nbytes: int = 0,
          value: int = 0) -> None:
    conn.sendall(HEADER.pack(MAGIC, kind, serving, nbytes, value))


def _take_weights(conn: socket.socket, kind: int, nbytes: int, version: int,
                  scratch: np.ndarray, store: WeightStore) -> None:
    """After a header ``(kind, nbytes, version)``: receive a WEIGHTS payload into ``scratch``
    and publish it in ``store`` unless ``store`` already holds a newer version (a late joiner's
    first copy can cross an older push).

    Raises:
        BridgeError: the message is not weights of ``scratch.nbytes`` bytes.
    """
    if kind != WEIGHTS or nbytes != scratch.nbytes:
        raise BridgeError(f"expected weights of {scratch.nbytes} bytes, got kind {kind} of "
                          f"{nbytes}")
    _recv_into(conn, memoryview(scratch))
    if store.version is None or version > store.version:  # a late joiner's first copy can
        store.publish([scratch], version)  # cross an older push: never step back


def _shutdown(sock: socket.socket) -> None:
    """Wake whatever waits on ``sock`` (close alone does not)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class BridgeServer:
    """A trainer's end: listens on ``bind``, fills ``fabric``'s channels to ``trainer`` (its
    index in ``fabric``) and, with ``push``, sends ``store``'s new versions (``store_bytes``
    each) to every serving GMI and follower.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, fabric: Fabric, store: WeightStore, store_bytes: int,
                 bind: tuple[str, int], trainer: int = 0, push: bool = True) -> None:
        self.fabric, self.store, self.trainer = fabric, store, trainer
        self._sock = socket.create_server(bind)
        self.address = self._sock.getsockname()[:2]
        self._conns: dict[int, tuple[socket.socket, threading.Lock]] = {}
        self._followers: dict[int, tuple[socket.socket, threading.Lock]] = {}
        self._lock = threading.Lock()
        self._hello = threading.Condition(self._lock)
        self._greeted: set[int] = set()
        self._closed = False
        self._scratch = np.empty(store_bytes, np.uint8)
        for serving in range(fabric.plan.num_serving):  # made once, before any thread reads
            fabric.rings(serving, trainer)
        threads = [threading.Thread(target=self._accept, daemon=True, name="bridge-accept"),
                   threading.Thread(target=self._report, daemon=True, name="bridge-report")]
        if push:
            threads.append(threading.Thread(target=self._push, daemon=True, name="bridge-push"))
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
        serving, table = None, self._conns
        try:
            kind, serving, _, _ = _recv_header(conn)
            if kind == FOLLOW:
                table = self._followers
            elif kind != HELLO or not 0 <= serving < self.fabric.plan.num_serving:
                raise BridgeError(f"expected HELLO from a serving GMI, got kind {kind}, "
                                  f"serving {serving}")
            sending = threading.Lock()  # credits (here) and weights (the pusher) interleave
            with sending:
                with self._lock:
                    table[serving] = (conn, sending)
                    if table is self._conns:
                        self._greeted.add(serving)
                        self._hello.notify_all()
                # the pusher sends only versions published from now on: hand over the
                # current one (a serving GMI that joined late would act, and stamp its
                # fragments, with its initial weights until the next update)
                self._send_current(conn)
            if table is self._followers:
                while conn.recv(1):  # a follower only listens; wait until it leaves
                    pass
                return
            self._receive_transfers(conn, serving, sending)
        except (ConnectionError, OSError, ChannelClosed):
            pass  # the serving GMI ended (its launcher reports a failure) or we closed
        except BridgeError as e:
            log.error("bridge: %s; closing that connection", e)
        finally:
            with self._lock:
                if serving is not None and table.get(serving, (None,))[0] is conn:
                    del table[serving]
            conn.close()

    def _receive_transfers(self, conn: socket.socket, serving: int,
                           sending: threading.Lock) -> None:
        rings = self.fabric.rings(serving, self.trainer)
        size = sum(r.slot_bytes for r in rings)
        while True:
            kind, _, nbytes, steps = _recv_header(conn)
            if kind == STEPS and nbytes == 0:
                self.fabric.add_env_steps(serving, steps)
                continue
            if kind != TRANSFER or nbytes != size:
                raise BridgeError(f"serving GMI {serving}: expected a transfer of {size} "
                                  f"bytes, got kind {kind} of {nbytes}")
            slots = [ring.claim() for ring in rings]  # waits while the channel is full
            for slot in slots:
                _recv_into(conn, memoryview(slot))
            for ring in rings:  # the last field ring last: the batcher checks it
                ring.publish()
            self.fabric.add_env_steps(serving, steps)
            queued = self.fabric.queued(self.trainer)
            with sending:  # it left the wire: the serving GMI may send one more
                _send(conn, CREDIT, serving, 0, queued)

    def _report(self, period_s: float = 0.005) -> None:
        """Tell every serving GMI this trainer's queued transfers whenever they changed."""
        last = -1
        while not self._closed:
            time.sleep(period_s)
            queued = self.fabric.queued(self.trainer)
            if queued == last:
                continue
            last = queued
            self._broadcast(HEADER.pack(MAGIC, QUEUED, 0, 0, queued))

    def _send_current(self, conn: socket.socket) -> None:
        """Send ``conn`` the store's newest weights, if any were published (the caller holds
        its ``sending`` lock)."""
        scratch = np.empty_like(self._scratch)
        version = self.store.read_into([scratch])
        if version is not None:
            conn.sendall(HEADER.pack(MAGIC, WEIGHTS, 0, scratch.nbytes, version))
            conn.sendall(memoryview(scratch))

    def _push(self) -> None:
        version = -1
        while not self._closed:
            got = self.store.read_into([self._scratch], newer_than=version)
            if got is None:
                time.sleep(0.001)
                continue
            version = got
            self._broadcast(HEADER.pack(MAGIC, WEIGHTS, 0, self._scratch.nbytes, version),
                            memoryview(self._scratch), followers=True)

    def _broadcast(self, *pieces, followers: bool = False) -> None:
        """Send ``pieces`` to every serving GMI (and ``followers``); a connection that fails
        is left to its reader, which notices and forgets it."""
        with self._lock:
            conns = [*self._conns.values(), *(self._followers.values() if followers else ())]
        for conn, sending in conns:
            try:
                with sending:
                    for piece in pieces:
                        conn.sendall(piece)
            except OSError:
                pass

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
        _shutdown(self._sock)  # wakes the accepting thread
        self._sock.close()
        with self._lock:
            conns = [conn for conn, _ in [*self._conns.values(), *self._followers.values()]]
        for conn in conns:
            _shutdown(conn)
        for t in list(self._threads):
            t.join(5)


class BridgeClient:
    """A serving GMI's end: forwards the transfers of ``fabric``'s channel ``(local, 0)``
    (``local`` defaults to ``serving``) to the trainers at ``addresses`` (one per trainer, in
    rank order), as serving GMI ``serving``, and takes their weights into ``store``.

    Raises:
        BridgeError: a trainer could not be reached within ``connect_timeout_s`` seconds.
    """

    def __init__(self, fabric: Fabric, store: WeightStore, store_bytes: int, serving: int,
                 addresses: Sequence[tuple[str, int]], connect_timeout_s: float = 60.0,
                 local: int | None = None) -> None:
        self.fabric, self.store, self.serving = fabric, store, serving
        self.local = serving if local is None else local  # its channel's index in ``fabric``
        if not addresses or isinstance(addresses[0], str):
            raise TypeError(f"addresses={addresses!r} must be a list of (host, port), one per "
                            "trainer GMI")
        self._conns: list[socket.socket] = []
        try:
            for address in addresses:
                self._conns.append(_connect(address, connect_timeout_s))
                _send(self._conns[-1], HELLO, serving)
        except BaseException:
            for conn in self._conns:
                conn.close()
            raise
        k_all = len(self._conns)
        self._order = [(serving + i) % k_all for i in range(k_all)]  # ties spread the GMIs
        self._credits = [CREDITS] * k_all
        self._queued = [0] * k_all  # what each trainer last reported
        self._routing = threading.Condition()
        self._store_lock = threading.Lock()
        self._store_bytes = store_bytes
        self.sent = [0] * k_all
        """transfers sent to each trainer"""
        self._closed = False
        self._threads = [threading.Thread(target=self._forward, daemon=True,
                                          name="bridge-forward")]
        self._threads += [threading.Thread(target=self._receive, args=(k,), daemon=True,
                                           name=f"bridge-receive-{k}") for k in range(k_all)]
        for t in self._threads:
            t.start()

    def _route(self) -> int | None:
        """The migrator: a trainer with a credit left and the least queued work (its last
        report plus this GMI's transfers in flight to it); waits while no trainer has a
        credit; ``None`` once closed."""
        with self._routing:
            while True:
                if self._closed or self.fabric.stopped():
                    return None
                ready = [k for k in self._order if self._credits[k] > 0]
                if ready:
                    k = min(ready, key=lambda k: self._queued[k] + CREDITS - self._credits[k])
                    self._credits[k] -= 1
                    return k
                self._routing.wait(0.1)

    def _forward(self) -> None:
        rings = self.fabric.rings(self.local, 0)
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
                k = self._route()
                if k is None:
                    return
                steps = self.fabric.env_steps() - sent_steps
                conn = self._conns[k]
                _send(conn, TRANSFER, self.serving, sum(v.nbytes for v in views),
                      steps if k == 0 else 0)
                for v in views:
                    conn.sendall(memoryview(v))
                if k != 0 and steps:  # trainer 0 logs every serving GMI's env steps
                    _send(self._conns[0], STEPS, self.serving, 0, steps)
                sent_steps += steps
                self.sent[k] += 1
                for ring in rings:
                    ring.advance(pos)
        except OSError:
            pass
        finally:
            self.fabric.stop()  # a trainer is gone: this serving GMI's loop ends

    def _receive(self, k: int) -> None:
        conn, scratch = self._conns[k], None
        try:
            while True:
                kind, _, nbytes, value = _recv_header(conn)
                if kind in (CREDIT, QUEUED):
                    with self._routing:
                        self._credits[k] += kind == CREDIT
                        self._queued[k] = value
                        self._routing.notify()
                    continue
                if scratch is None:
                    scratch = np.empty(self._store_bytes, np.uint8)
                with self._store_lock:  # the store has one writer at a time
                    _take_weights(conn, kind, nbytes, value, scratch, self.store)
        except (ConnectionError, OSError):
            pass
        except BridgeError as e:
            log.error("bridge: %s", e)
        finally:
            self.fabric.stop()

    def close(self) -> None:
        self._closed = True
        for conn in self._conns:
            _shutdown(conn)
            conn.close()
        for t in self._threads:
            t.join(5)


class WeightFollower:
    """A trainer GMI that does not publish: takes the publishing trainer's weights (from its
    `BridgeServer` at ``address``) into its own ``store``, as serving GMIs do, so it normalises
    observations with the same statistics (`gmi_drl.runner.roles.TrainerRole`).

    Raises:
        BridgeError: the publishing trainer could not be reached within ``connect_timeout_s``.
    """

    def __init__(self, store: WeightStore, store_bytes: int, address: tuple[str, int],
                 rank: int, connect_timeout_s: float = 60.0) -> None:
        self.store = store
        self._conn = _connect(address, connect_timeout_s)
        _send(self._conn, FOLLOW, rank)
        self._scratch = np.empty(store_bytes, np.uint8)
        self._thread = threading.Thread(target=self._receive, daemon=True,
                                        name="bridge-follow")
        self._thread.start()

    def _receive(self) -> None:
        try:
            while True:
                kind, _, nbytes, version = _recv_header(self._conn)
                _take_weights(self._conn, kind, nbytes, version, self._scratch, self.store)
        except (ConnectionError, OSError):
            pass
        except BridgeError as e:
            log.error("bridge: %s", e)

    def close(self) -> None:
        _shutdown(self._conn)
        self._conn.close()
        self._thread.join(5)


class BridgeDirectory:
    """Where every trainer GMI's bridge listens, shared by the GMIs of one run: a
    ``torch.distributed.TCPStore`` that GMI 0 hosts (``is_host``) at ``init_method``
    (``tcp://HOST:PORT``, the launcher's rendezvous) and every other GMI reaches.

    Raises:
        BridgeError: the store could not be reached, or a trainer did not publish its address,
            within ``timeout_s`` seconds.
    """

    def __init__(self, init_method: str, is_host: bool, timeout_s: float = 60.0) -> None:
        from torch.distributed import TCPStore

        host, _, port = init_method.removeprefix("tcp://").rpartition(":")
        self.host, self.timeout_s = host, timeout_s
        try:
            self.store = TCPStore(host, int(port), is_master=is_host, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=timeout_s))
        except (RuntimeError, OSError) as e:
            raise BridgeError(f"the run's rendezvous store at {host}:{port} could not be "
                              f"{'opened' if is_host else 'reached'} within {timeout_s} s: "
                              f"{e}") from None

    def local_ip(self) -> str:
        """This host's address on the route to GMI 0's host (what the others can reach)."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((self.host, 9))  # no packet is sent: it only picks the route
            return s.getsockname()[0]

    def publish(self, trainer: int, address: tuple[str, int]) -> None:
        """Trainer ``trainer``'s bridge listens at ``address``."""
        self.store.set(f"bridge/{trainer}", f"{address[0]}:{address[1]}")

    def lookup(self, num_trainers: int) -> list[tuple[str, int]]:
        """The bridges of trainers ``0 .. num_trainers - 1``, waiting for them to publish."""
        keys = [f"bridge/{k}" for k in range(num_trainers)]
        try:
            self.store.wait(keys)
        except RuntimeError as e:
            raise BridgeError(f"trainer GMIs did not publish their bridges within "
                              f"{self.timeout_s} s: {e}") from None
        found = []
        for key in keys:
            host, _, port = self.store.get(key).decode().rpartition(":")
            found.append((host, int(port)))
        return found

    def group_store(self):
        """The store of the trainers' gradient group (`gmi_drl.comm.ring.RingReducer`)."""
        from torch.distributed import PrefixStore

        return PrefixStore("trainers/", self.store)


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
