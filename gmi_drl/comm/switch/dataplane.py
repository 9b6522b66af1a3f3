"""The switch daemon's data plane (iSwitch §3.3): slots, per-packet aggregation, results.

Two implementations of one interface, chosen by `make_data_plane`:

- `PyDataPlane` (here): the reference, one ``recvmsg`` per packet and NumPy for the rows;
- ``NativePlane`` (``csrc/switch_plane.cpp``, module ``gmi_drl.comm.switch._plane``): the same
  state machine in C++, ``recvmmsg``/``sendmmsg`` batches of 64 datagrams and sends that point
  into the slot pool. Built by ``pip install`` where a C++17 compiler is present.

Both read every datagram on the daemon's socket. Data packets stay here; control packets go back
to the daemon (`drain` returns them), which runs the control plane and tells the data plane
what it needs: the member table (`set_member`/`remove_member`), readiness and the aggregation
threshold H (`set_state`), and the control requests that touch slots (Reset, FBcast, Help).

The slot pool: the payload of member row ``r`` for segment ``seq`` lands in row ``r`` of slot
``seq % slots`` (one vector copy per packet); when the H-th member's packet arrives the rows are
summed in ascending member id into the slot's partial, which goes to every member (or up the
tree), and the slot keeps that result until a later ``seq`` reuses it. Why rows and not a
running sum: float addition is not associative and packets arrive in any order; summing the
kept rows in member-id order makes the float32 result bit-identical to
``((g_0 + g_1) + g_2) + ...`` whatever the arrival order, loss or retransmission. Memory:
``slots * max_members * seg_floats * 4`` bytes (touched lazily).

Threshold mode (iSwitch §3.3 "segment counter ... until the aggregation threshold H", §4.1
Fig. 11; `PyDataPlane.set_threshold_mode`, the native plane alike): packets flagged
`protocol.FLAG_ASYNC` name a segment ``offset`` of the job's parameter layout, not a round. Each
offset collects the gradient segments of any workers, several of one worker included, until
their counts reach H; their sum (in ascending member id, then arrival: each gradient comes once,
in its sender's push order) goes to every member with that count and the offset's aggregate
number, which then advances. A segment computed on a weight version more than S aggregates
behind the offset's current one is dropped and counted (``staleness_dropped``, per segment), so
no applied gradient is staler than S. The first segment of a gradient to arrive decides for all
its segments (a gradient is taken whole or not at all, so every offset of a vector counts the
same gradients and the offsets' aggregate numbers advance together; a vector's first offset,
which every gradient reaches first, is the furthest along). The last `KEPT_AGGREGATES` results
of each offset are kept for members that lost one (Help). A worker's lost gradient segment is
not resent: the aggregate completes with the gradients that came, at the latest when a worker
that waits for it asks (FBcast of that offset and number: broadcast as it is, a zero sum where
nothing came); every worker applies the same.

Threshold mode in a tree (a plane with a ``parent``; iSwitch §3.4's hierarchical aggregation):
a child switch sums its members' gradients into per-rack partials and sends each partial up with
the count of gradients it holds (a member switch's partial adds its count). Gradients are
assigned whole to a *batch* on the first segment of theirs the child sees: the open batch of
that segment's offset (the first offset of the sender's region, as segments go out in order),
so every gradient in a batch has the same offsets. A batch carries its oldest gradient's
version, which the root checks S against, so no gradient in it is staler than S. The child
knows each offset's aggregates that came down through it, and no version is ahead of them
(every result reaches a worker, or a member switch, through it): it reads a gradient's version
byte against them (a lag, mod 256, as the root does), drops and counts (``staleness_dropped``)
one staler than S already (the root is at least as far along), closes an open batch whose
oldest has become staler than S, and adds the others to the offset's open batch (a new one
where none is open with room); so every version in a batch lies within S of the aggregates
that came down when it joined. A batch's gradients are fixed when its first partial goes up: one that
became staler than S while the batch waited (the aggregates moved on) is left out then, with
its later segments (counted), and the rest keep their oldest version. So a stale gradient
never takes a fresher one down with it as far as the child can tell (the root, further along,
may still drop a batch the child sent as fresh, as it drops a gradient); and while the root's
open aggregate is N, a batch holding a gradient of version N holds none older than N - S, is
fresh at the root, and the S + 1 gradients each worker may compute on N complete the
aggregate, as with batches of one version. A batch closes to new gradients once it holds as
many gradients as there are workers below the child, or after ``help_after_s`` (so a slow
worker holds its rack-mates' gradients back that long at most); a closed batch sends each
offset's partial, in ascending offset, as soon as every gradient of the batch gave its segment
there (after ``help_after_s`` without, as it is: a
segment lost on the way up). A synchronous round (a barrier's) and the flush send the open batches as they are first
(every worker stopped sending), so what reached the child before them reaches the parent
before them; a worker's FBcast of one aggregate sends the whole ones only. The root takes a
member switch's partial as one *contribution* (a worker's gradient is one too): it keys it (for
duplicates and staleness) by that switch and its batch number, and completes an aggregate once
it holds ``ceil(H * members / workers below)`` contributions (H where every member is a
worker), broadcasting the sum with its gradient count, so the mean is over gradients. Why
count contributions and not gradients: each offset cuts its aggregates on its own, in the order
its packets came; with a unit per contribution every offset cuts after the same numbers of
contributions, so the offsets' aggregate numbers stay in step and a vector's first offset
(every contribution reaches it first) stays the furthest along, where S is checked, as with
single gradients; with the counts of partials as weights the cuts would depend on the order.
Why batches of whole gradients and not a running sum per offset: a partial taking segments as
they come could split one gradient's segments over partials, and mix versions with no one
version to check S by. Why not one batch per version: the workers compute on different
versions (with H of the whole tree's gradients to an aggregate, the version moves more than
once between two gradients of one worker), so per-version partials held about 2 gradients in
racks of 3 (DDPG, 12 workers: 1.6x the aggregates, each of about 8 gradients where H was 12).
A batch, and an aggregate, never holds more than `protocol.MAX_COUNT` gradients (the header's
count field): one that would is closed first. The results come down as before: the child keeps each result
from its parent (the last `KEPT_AGGREGATES` per offset) as it passes it to every member once.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque

import numpy as np

from gmi_drl.comm.switch import protocol as P

log = logging.getLogger(__name__)

FREE, FILLING, UP, DONE = 0, 1, 2, 3
PLANES = ("auto", "native", "python")
"""``--data-plane`` choices: ``auto`` takes the native plane where it is built."""
COUNTERS = ("packets_in", "packets_out", "bytes_aggregated", "segments_completed", "duplicates",
            "retransmissions_served", "malformed_dropped", "non_member_dropped",
            "not_ready_dropped", "stale_dropped", "busy_dropped", "injected_drops",
            "staleness_dropped", "aggregates_completed")
"""The counters a data plane keeps (`counters`); the daemon adds its control-plane ones.
Threshold mode's: ``staleness_dropped``, gradient segments older than S; ``aggregates_completed``,
aggregates broadcast (one per segment offset and aggregate)."""
KEPT_AGGREGATES = 64
"""Threshold mode: results kept per segment offset for members that lost one (Help)."""


def native_plane_error() -> str | None:
    """Why the native data plane cannot be used here, or ``None`` when it can."""
    try:
        from gmi_drl.comm.switch import _plane  # noqa: F401
    except ImportError as e:
        return (f"the native data plane is not built ({e}): reinstall gmi-drl with a C++17 "
                "compiler present (`pip install -e .` compiles csrc/switch_plane.cpp), or run "
                "the switch with --data-plane python")
    return None


def make_data_plane(kind: str, sock, *, seg_floats: int, slots: int, max_members: int,
                    switch_id: int, member_id: int, parent: tuple[str, int] | None,
                    drop_rate: float, dup_rate: float, delay_ms: float, help_after_s: float,
                    seed: int | None):
    """The data plane ``kind`` (one of `PLANES`) over the non-blocking UDP socket ``sock``.

    Returns:
        ``(plane, name)`` with ``name`` ``"native"`` or ``"python"``.

    Raises:
        ValueError: an unknown ``kind``, or ``"native"`` where the extension is not built (the
            message says how to build it).
    """
    if kind not in PLANES:
        raise ValueError(f"data plane {kind!r}: choose one of {', '.join(PLANES)}")
    why = native_plane_error() if kind != "python" else "asked for"
    if kind == "native" and why:
        raise ValueError(why)
    args = dict(seg_floats=seg_floats, slots=slots, max_members=max_members, switch_id=switch_id,
                member_id=member_id, parent=parent, drop_rate=drop_rate, dup_rate=dup_rate,
                delay_ms=delay_ms, help_after_s=help_after_s, seed=seed)
    if why is None:
        from gmi_drl.comm.switch._plane import NativePlane

        return NativePlane(sock.fileno(), P.native_layout(), **args, counters=list(COUNTERS)), \
            "native"
    if kind == "auto":
        log.warning("switch runs the Python data plane: %s", why)
    return PyDataPlane(sock, **args), "python"


def _absolute(tag: int, number: int) -> int:
    """The aggregate number whose `protocol.async_seq` tag is ``tag``, nearest to ``number``."""
    ahead = (tag - number) % P.ASYNC_TAG_MOD
    return number + ahead if ahead < P.ASYNC_TAG_MOD // 2 else number + ahead - P.ASYNC_TAG_MOD


class _Slot:
    __slots__ = ("seq", "state", "length", "round", "mask", "contrib", "count", "result_count",
                 "helped")

    def __init__(self) -> None:
        self.seq = self.length = self.round = self.mask = self.count = self.result_count = 0
        self.state = FREE
        self.contrib: list = []  # (member id, row)
        self.helped = 0.0

    def clear(self) -> None:
        self.state, self.mask, self.contrib, self.count = FREE, 0, [], 0


class _Offset:
    """Threshold mode: one segment offset's open aggregate and kept results."""

    __slots__ = ("number", "length", "contrib", "count", "units", "last_push", "taken", "kept")

    def __init__(self, length: int) -> None:
        self.number = 0              # aggregates broadcast so far (the open one's number)
        self.length = length
        self.contrib: list = []      # (member id, arrival, payload copy)
        self.count = 0               # gradients in the open aggregate (the divisor)
        self.units = 0               # contributions in it: a gradient, or a switch's partial
        self.last_push: dict[int, int] = {}  # worker id -> its newest push tag taken
        self.taken: dict[tuple[int, int], None] = {}  # (switch key, batch) taken, the last 1024
        self.kept: dict[int, tuple[np.ndarray, int]] = {}  # number -> (sum, count)


class _Batch:
    """Threshold mode at a child switch: gradients of one region, summed per offset into one
    partial each, with the oldest one's version (see the module docstring)."""

    __slots__ = ("number", "key", "oldest", "versions", "sealed", "grads", "count", "closed",
                 "parts", "sent", "length", "opened", "last", "gone")

    def __init__(self, number: int, key: int, oldest: int, now: float) -> None:
        self.number, self.key = number, key  # key: first offset
        self.oldest = oldest         # its gradients' oldest version (absolute)
        self.versions: dict[tuple[int, int], tuple[int, int]] = {}  # (key, push) -> (version, count)
        self.sealed = False          # its gradients fixed (`PyDataPlane._seal`)
        self.grads = 0               # gradients assigned
        self.count = 0               # the gradients they stand for (partials count theirs)
        self.closed = False
        self.parts: dict[int, list] = {}  # offset -> [(sender key, push, count, payload)]
        self.sent: set[int] = set()  # offsets whose partial went up
        self.length: dict[int, int] = {}  # offset -> floats
        self.opened = self.last = now
        self.gone = False            # retired: later segments of its gradients are dropped


class _Member:
    __slots__ = ("id", "type", "addr", "workers_below")

    def __init__(self, id_: int, type_: int, addr: tuple[str, int], workers_below: int) -> None:
        self.id, self.type, self.addr, self.workers_below = id_, type_, addr, workers_below


class PyDataPlane:
    """The reference data plane: see the module docstring. Arguments as `make_data_plane`'s."""

    def __init__(self, sock, *, seg_floats: int, slots: int, max_members: int, switch_id: int,
                 member_id: int, parent: tuple[str, int] | None, drop_rate: float,
                 dup_rate: float, delay_ms: float, help_after_s: float,
                 seed: int | None) -> None:
        self._sock = sock
        self.seg_floats = seg_floats
        self._mask = slots - 1
        self._switch_id, self._member_id, self._parent = switch_id, member_id, parent
        self._drop, self._dup, self._delay_s = drop_rate, dup_rate, delay_ms / 1000
        self._help_after = help_after_s
        self._rng = random.Random(seed)
        self._rows = np.zeros((slots, max_members, seg_floats), "<f4")
        self._partial = np.zeros((slots, seg_floats), "<f4")
        self._result = self._partial if parent is None else np.zeros_like(self._partial)
        self._slots = [_Slot() for _ in range(slots)]
        self._active: set[int] = set()
        self._members: dict[int, _Member] = {}  # by row
        self._by_addr: dict[tuple[str, int], int] = {}
        self._last_seen = [0.0] * max_members
        self._ready, self._h = False, 0
        self._delayed: deque = deque()
        self._rx = bytearray(P.RX_BUFFER_BYTES)
        self._rx_f32 = np.frombuffer(self._rx, "<f4", (P.RX_BUFFER_BYTES - P.HEADER_BYTES) // 4,
                                     P.HEADER_BYTES)
        self._c = dict.fromkeys(COUNTERS, 0)
        self._thr: tuple[int, int] | None = None  # threshold mode's (H, S)
        self._offsets: dict[int, _Offset] = {}
        self._fresh: dict[tuple[int, int], bool] = {}  # (sender key, push) -> within S
        self._arrivals = 0
        self._batches: list[_Batch] = []  # a child's, open or sending, in batch order
        self._assigned: dict[tuple[int, int], _Batch] = {}  # (sender key, push) -> its batch
        self._batch_number = 0
        self._units = 1  # threshold mode at a root: contributions per aggregate (`_set_units`)

    # ---- the member table and group state -------------------------------------------------------

    def set_member(self, row: int, id_: int, type_: int, ip: str, port: int,
                   workers_below: int) -> None:
        """Row ``row`` is member ``id_`` (`protocol.MemberType` ``type_``) at ``(ip, port)``."""
        self.remove_member(row)
        self._members[row] = _Member(id_, type_, (ip, port), workers_below)
        self._by_addr[(ip, port)] = row
        self._set_units()

    def remove_member(self, row: int) -> None:
        """Row ``row`` is free (a member left or was dropped); its contributions stay."""
        m = self._members.pop(row, None)
        if m is not None:
            self._by_addr.pop(m.addr, None)
        self._set_units()

    def _set_units(self) -> None:
        """Threshold mode: the contributions that complete an aggregate, H scaled by members
        over the workers below them (H itself where every member is a worker)."""
        h = self._thr[0] if self._thr is not None else 1
        below = sum(max(1, m.workers_below) for m in self._members.values())
        self._units = max(1, min(h, -(-h * len(self._members) // max(1, below))))

    def set_state(self, ready: bool, threshold: int) -> None:
        """Whether the group is complete, and H (0: no members). Slots already holding H
        contributions complete now."""
        self._ready, self._h = ready, threshold
        if threshold >= 1:
            for idx in list(self._active):
                s = self._slots[idx]
                if s.state == FILLING and len(s.contrib) >= threshold:
                    self._complete(idx, s, time.monotonic())

    def set_threshold_mode(self, threshold: int, staleness: int) -> None:
        """Threshold mode with H = ``threshold`` gradient vectors per aggregate and staleness
        bound S = ``staleness`` (see the module docstring); open aggregates that already hold
        H complete now. ``threshold = 0`` ends it (the job ended)."""
        if threshold == 0:
            self._thr = None
            self._offsets.clear()
            self._fresh.clear()
            self._batches.clear()
            self._assigned.clear()
            return
        self._thr = (threshold, staleness)
        self._set_units()
        for o, a in list(self._offsets.items()):
            if a.units >= self._units:
                self._complete_offset(o, a)

    @property
    def threshold_mode(self) -> tuple[int, int] | None:
        """``(H, S)`` of threshold mode, or ``None`` (the synchronous rounds only)."""
        return self._thr

    def last_seen(self, row: int) -> float:
        """`time.monotonic` of the last data packet from row ``row`` (0.0: none)."""
        return self._last_seen[row]

    # ---- receive ------------------------------------------------------------------------------

    def drain(self, max_packets: int) -> tuple[list, list]:
        """Handle what the socket holds now, at most ``max_packets`` datagrams, never blocking.

        Returns:
            ``(controls, strangers)``: ``[(bytes, (ip, port))]`` of the control packets, and
            the addresses of non-members that sent data.
        """
        sock, buf, c = self._sock, self._rx, self._c
        controls, strangers = [], []
        for _ in range(max_packets):
            try:
                nbytes, tos, addr = P.recv_packet(sock, buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. ICMP port unreachable reported on a UDP socket
                continue
            c["packets_in"] += 1
            if self._drop and self._rng.random() < self._drop \
                    and not (tos == P.TOS_CONTROL and nbytes == 1 and buf[0] == P.Action.STATS):
                c["injected_drops"] += 1
                continue
            times = 2 if self._dup and self._rng.random() < self._dup else 1
            for _ in range(times):
                if tos == P.TOS_DATA:
                    try:
                        self._on_data(nbytes, addr, strangers)
                    except P.ProtocolError:
                        c["malformed_dropped"] += 1
                    except Exception:  # a bug must not take the switch down: logged, counted
                        log.exception("data packet from %s dropped by an internal error", addr)
                        c["malformed_dropped"] += 1
                elif tos == P.TOS_CONTROL:
                    controls.append((bytes(buf[:nbytes]), addr))
                else:
                    c["malformed_dropped"] += 1
        return controls, strangers

    def _on_data(self, nbytes: int, addr, strangers: list) -> None:
        c = self._c
        row = self._by_addr.get(addr)
        is_parent = self._parent is not None and addr == self._parent
        if row is None and not is_parent:
            c["non_member_dropped"] += 1
            strangers.append(addr)
            return
        seq, rnd, mid, count, flags, k = P.decode_data(self._rx, nbytes, self.seg_floats)
        now = time.monotonic()
        if is_parent:
            if not flags & P.FLAG_RESULT:
                raise P.ProtocolError("data from the parent that is not a result")
            if flags & P.FLAG_ASYNC:  # (before this switch's own workers asked for the mode)
                self._on_parent_async(seq, count, k)
                return
            self._on_result(seq, count, k)
            return
        m = self._members[row]
        self._last_seen[row] = now
        if flags & P.FLAG_ASYNC:
            self._on_async(m, seq, rnd, mid, count, flags, k)
            return
        if flags & P.FLAG_RESULT or mid != m.id:
            raise P.ProtocolError(f"member {m.id} sent flags {flags:#x} / member field {mid}")
        if count > max(1, m.workers_below) or (m.type == P.MemberType.WORKER and count != 1):
            raise P.ProtocolError(f"member {m.id} claims {count} gradients")
        if not self._ready:
            c["not_ready_dropped"] += 1
            return
        idx = seq & self._mask
        s = self._slots[idx]
        if s.state == FREE or s.seq != seq:
            if s.state == FREE or (s.state == DONE and P.seq_newer(seq, s.seq)):
                s.clear()
                s.seq, s.state, s.length, s.round = seq, FILLING, k, rnd
                s.helped = now
                self._active.add(idx)
            elif P.seq_newer(seq, s.seq):
                c["busy_dropped"] += 1
                return
            else:
                c["stale_dropped"] += 1
                return
        if k != s.length:
            raise P.ProtocolError(f"segment {seq}: {k} floats, the slot holds {s.length}")
        bit = 1 << row
        if s.state == DONE:
            if s.mask & bit:
                c["duplicates"] += 1
            self._send_result(idx, s, m.addr, P.FLAG_RESULT | P.FLAG_FBCAST)
            c["retransmissions_served"] += 1
            return
        if s.mask & bit:
            c["duplicates"] += 1
            if s.state == UP and now - s.helped > self._help_after / 4:
                s.helped = now
                self._send_up(idx, s)
            return
        self._rows[idx, row, :k] = self._rx_f32[:k]
        c["bytes_aggregated"] += k * P.FLOAT_BYTES
        s.mask |= bit
        s.contrib.append((m.id, row))
        s.count += count
        if s.state == FILLING and len(s.contrib) >= self._h:
            self._complete(idx, s, now)

    def _on_async(self, m: _Member, seq: int, rnd: int, mid: int, count: int, flags: int,
                  k: int) -> None:
        """A threshold-mode gradient segment (see the module docstring): a worker's own
        (``count`` 1), or a member switch's partial of ``count`` gradients. A child switch adds
        it to a batch; the root to its offset's open aggregate."""
        c = self._c
        if self._thr is None or flags & P.FLAG_RESULT or mid != m.id \
                or (m.type == P.MemberType.WORKER and count != 1):
            raise P.ProtocolError(f"threshold-mode packet from member {m.id}: flags "
                                  f"{flags:#x}, member field {mid}, count {count}")
        if not self._ready:
            c["not_ready_dropped"] += 1
            return
        key = mid if m.type == P.MemberType.WORKER else 256 + mid  # (ids of either kind)
        push, o = P.async_split(seq)
        if self._parent is not None:
            self._batch_segment(key, push, o, rnd, count, k)
            return
        a = self._offsets.get(o)
        if a is None:
            a = self._offsets[o] = _Offset(k)
        if k != a.length:
            raise P.ProtocolError(f"offset {o}: {k} floats, it holds {a.length}")
        if key < 256:  # a worker's pushes come in order; a switch's batches in any
            last = a.last_push.get(key)
            if last is not None and not P.tag_newer(push, last):
                c["duplicates"] += 1
                return
            a.last_push[key] = push
        else:
            if (key, push) in a.taken:
                c["duplicates"] += 1
                return
            a.taken[(key, push)] = None
            if len(a.taken) > 1024:
                del a.taken[next(iter(a.taken))]
        fresh = self._fresh.get((key, push))
        if fresh is None:  # the first segment of this gradient decides for all of it
            fresh = self._fresh[(key, push)] = (a.number - rnd) % 256 <= self._thr[1]
            if len(self._fresh) > 4096:
                del self._fresh[next(iter(self._fresh))]
        if not fresh:
            c["staleness_dropped"] += 1
            return
        if a.contrib and a.count + count > P.MAX_COUNT:  # (the header's count field)
            self._complete_offset(o, a)
        self._arrivals += 1
        a.contrib.append((key, self._arrivals, self._rx_f32[:k].copy()))
        a.count += count
        a.units += 1
        c["bytes_aggregated"] += k * P.FLOAT_BYTES
        if a.units >= self._units:
            self._complete_offset(o, a)

    # ---- a child switch's batches (threshold mode in a tree) ---------------------------------

    def _batch_segment(self, key: int, push: int, o: int, rnd: int, count: int, k: int) -> None:
        """Add a gradient segment (or a member switch's partial) to its batch; send what is
        complete. A gradient already staler than S here is dropped and counted."""
        c, now = self._c, time.monotonic()
        g = (key, push)
        if g not in self._assigned:
            b = self._assigned[g] = self._batch_for(g, o, rnd, count, now)
            if len(self._assigned) > 4096:
                del self._assigned[next(iter(self._assigned))]
            if b is not None:
                b.grads += 1
                b.count += count
                if b.count >= max(1, sum(max(1, x.workers_below)
                                         for x in self._members.values())):
                    b.closed = True
        b = self._assigned[g]
        if b is None:
            c["staleness_dropped"] += 1
            return
        if g not in b.versions:  # (left out when it was sealed)
            c["staleness_dropped"] += 1
            return
        if b.gone or o in b.sent:
            c["stale_dropped"] += 1
            return
        parts = b.parts.setdefault(o, [])
        if b.length.setdefault(o, k) != k:
            raise P.ProtocolError(f"offset {o}: {k} floats, its batch holds {b.length[o]}")
        if any(p[0] == key and p[1] == push for p in parts):
            c["duplicates"] += 1
            return
        parts.append((key, push, count, self._rx_f32[:k].copy()))
        c["bytes_aggregated"] += k * P.FLOAT_BYTES
        b.last = now
        if b.closed:
            self._send_complete(b)

    def _batch_for(self, g: tuple[int, int], o: int, rnd: int, count: int,
                   now: float) -> _Batch | None:
        """The batch at first offset ``o`` for gradient ``g`` (or a member switch's partial) of
        version ``rnd``, or ``None`` where it is staler than S already against the aggregates
        of ``o`` that came down here (the root is at least as far along): the offset's open
        batch, a new one where none is open with room. An open batch whose oldest is staler
        than S closes first, so the versions of a batch it joins lie within S of each other."""
        s = self._thr[1]
        a = self._offsets.get(o)
        top = a.number if a is not None else 0  # o's aggregates that came down here
        lag = (top - rnd) % 256  # (no version is ahead of them: results reach workers here)
        if lag > s:
            return None
        version = top - lag
        found = None
        for b in self._batches:
            if b.key != o or b.closed:
                continue
            if b.count + count > P.MAX_COUNT or top - b.oldest > s:
                b.closed = True
                self._send_complete(b)
            else:
                found = b  # (the offset's one open batch)
        if found is None:
            found = _Batch(self._batch_number, o, version, now)
            self._batch_number = (self._batch_number + 1) % P.ASYNC_TAG_MOD
            self._batches.append(found)
        found.oldest = min(found.oldest, version)
        found.versions[g] = (version, count)
        return found

    def _seal(self, b: _Batch) -> None:
        """Before batch ``b``'s first partial goes up: leave out its gradients that became
        staler than S while it waited (the root moved on; counted ``staleness_dropped``, with
        their later segments), so none takes a fresher one down with it; the rest, and the
        oldest of their versions, are fixed for every offset."""
        b.sealed = True
        a = self._offsets.get(b.key)
        top, s = (a.number if a is not None else 0), self._thr[1]
        stale = [g for g, (v, _) in b.versions.items() if top - v > s]
        if not stale:
            return
        for g in stale:
            b.grads -= 1
            b.count -= b.versions.pop(g)[1]
        for o, parts in b.parts.items():
            keep = [p for p in parts if (p[0], p[1]) in b.versions]
            self._c["staleness_dropped"] += len(parts) - len(keep)
            b.parts[o] = keep
        if b.versions:
            b.oldest = min(v for v, _ in b.versions.values())
        else:
            b.gone = True

    def _send_complete(self, b: _Batch) -> None:
        """A closed batch: send each offset's partial that every gradient gave its segment."""
        if not b.sealed:
            self._seal(b)
        for o in sorted(b.parts):  # (ascending: a vector's first offset leads at the root)
            if o not in b.sent and len(b.parts[o]) == b.grads:
                self._send_partial(b, o)

    def _send_partial(self, b: _Batch, o: int) -> None:
        """Send batch ``b``'s partial at offset ``o`` as it is (ascending sender, then push)."""
        if not b.sealed:
            self._seal(b)
        if not b.parts[o]:
            return
        parts = sorted(b.parts[o], key=lambda p: p[:2])
        total = parts[0][3].copy()
        for p in parts[1:]:
            total += p[3]
        n = sum(p[2] for p in parts)
        b.sent.add(o)
        b.parts[o] = []
        self._c["segments_completed"] += 1
        self._send(self._parent, P.data_header(P.async_seq(b.number, o), b.oldest % 256,
                                               self._member_id, n, P.FLAG_ASYNC), total)

    def _flush_batches(self, whole: bool = False) -> None:
        """Close every batch and send every partial it holds as it is (a barrier's round, its
        flush: every worker stopped sending); ``whole``: only those every gradient of the
        batch gave (a worker's FBcast of one aggregate, while the others may still send)."""
        for b in self._batches:
            b.closed = True
            if whole:
                self._send_complete(b)
                continue
            for o in sorted(b.parts):
                if b.parts[o] and o not in b.sent:
                    self._send_partial(b, o)

    def _tick_batches(self, now: float) -> None:
        """Close batches open ``help_after_s``; send the partials of closed ones that waited
        that long for a segment (lost on the way up) as they are; retire the finished ones."""
        keep = []
        for b in self._batches:
            if not b.closed and now - b.opened >= self._help_after:
                b.closed = True
                self._send_complete(b)
            if b.closed and now - b.last >= self._help_after:
                for o in sorted(b.parts):
                    if b.parts[o] and o not in b.sent:
                        self._send_partial(b, o)
                if now - b.last >= 2 * self._help_after:
                    b.gone = True
                    continue
            keep.append(b)
        self._batches = keep

    def _on_parent_async(self, seq: int, count: int, k: int) -> None:
        """A child switch's threshold-mode result from its parent: keep it (the last
        `KEPT_AGGREGATES` per offset, for Help) and send it to every member, once."""
        tag, o = P.async_split(seq)
        a = self._offsets.get(o)
        if a is None:
            a = self._offsets[o] = _Offset(k)
        number = _absolute(tag, a.number)
        if k != a.length or number in a.kept or number <= max(a.number - KEPT_AGGREGATES, -1):
            self._c["duplicates" if k == a.length else "malformed_dropped"] += 1
            return
        a.kept[number] = (self._rx_f32[:k].copy(), count)
        a.number = max(a.number, number + 1)
        while len(a.kept) > KEPT_AGGREGATES:
            del a.kept[min(a.kept)]
        for m in self._members.values():
            self._send_kept(o, a, number, m.addr, P.FLAG_RESULT | P.FLAG_ASYNC)

    def _complete_offset(self, o: int, a: _Offset) -> None:
        """Sum offset ``o``'s open aggregate (ascending member id, then arrival), keep it and
        send it to every member; the next aggregate opens."""
        parts = [p for _, _, p in sorted(a.contrib, key=lambda x: x[:2])]
        total = parts[0].copy() if parts else np.zeros(a.length, "<f4")
        for p in parts[1:]:
            total += p
        a.kept[a.number] = (total, max(a.count, 1))
        a.kept.pop(a.number - KEPT_AGGREGATES, None)
        self._c["segments_completed"] += 1
        self._c["aggregates_completed"] += 1
        for m in self._members.values():
            self._send_kept(o, a, a.number, m.addr, P.FLAG_RESULT | P.FLAG_ASYNC)
        a.number += 1
        a.contrib, a.count, a.units = [], 0, 0

    def _send_kept(self, o: int, a: _Offset, number: int, addr, flags: int) -> None:
        total, count = a.kept[number]
        self._send(addr, P.data_header(P.async_seq(number, o), number, self._switch_id, count,
                                       flags), total)

    def _async_help(self, seq: int, addr) -> bool:
        """A member lost threshold-mode result ``seq`` (`protocol.async_seq`): resend it.
        Returns whether it was kept here."""
        tag, o = P.async_split(seq)
        a = self._offsets.get(o)
        if a is None:
            return False
        number = a.number - (a.number - tag) % P.ASYNC_TAG_MOD
        if number not in a.kept:
            return False
        self._send_kept(o, a, number, addr, P.FLAG_RESULT | P.FLAG_ASYNC | P.FLAG_FBCAST)
        self._c["retransmissions_served"] += 1
        return True

    def async_numbers(self) -> list[tuple[int, int]]:
        """Threshold mode: ``(offset, aggregates completed)`` of every offset that holds one
        (a root switch's; `protocol.flushed_runs`), in ascending offset."""
        return sorted((o, a.number) for o, a in self._offsets.items())

    def _on_result(self, seq: int, count: int, k: int) -> None:
        c = self._c
        idx = seq & self._mask
        s = self._slots[idx]
        if s.seq != seq or s.state not in (UP, DONE):
            c["stale_dropped"] += 1
            return
        if s.state == DONE:
            c["duplicates"] += 1
            return
        if k != s.length:
            raise P.ProtocolError(f"result {seq}: {k} floats, the slot holds {s.length}")
        self._result[idx, :k] = self._rx_f32[:k]
        s.result_count = count
        s.state = DONE
        self._active.discard(idx)
        for m in self._members.values():
            self._send_result(idx, s, m.addr, P.FLAG_RESULT)

    # ---- aggregation ----------------------------------------------------------------------------

    def _complete(self, idx: int, s: _Slot, now: float) -> None:
        """Sum the slot's rows in ascending member id into its partial; send it on."""
        k = s.length
        rows = [r for _, r in sorted(s.contrib)]
        out = self._partial[idx, :k]
        block = self._rows[idx]
        if len(rows) == 1:
            out[:] = block[rows[0], :k]
        else:
            np.add(block[rows[0], :k], block[rows[1], :k], out=out)
            for r in rows[2:]:
                out += block[r, :k]
        self._c["segments_completed"] += 1
        if self._parent is not None:
            if self._batches:  # (a barrier's round: the gradients that came before it go first)
                self._flush_batches()
            s.state, s.helped = UP, now
            self._send_up(idx, s)
        else:
            s.state, s.result_count = DONE, s.count
            self._active.discard(idx)
            for m in self._members.values():
                self._send_result(idx, s, m.addr, P.FLAG_RESULT)

    def _send_up(self, idx: int, s: _Slot) -> None:
        hdr = P.data_header(s.seq, s.round, self._member_id, s.count, 0)
        self._send(self._parent, hdr, self._partial[idx, :s.length])

    def _send_result(self, idx: int, s: _Slot, addr, flags: int) -> None:
        hdr = P.data_header(s.seq, s.round, self._switch_id, s.result_count, flags)
        self._send(addr, hdr, self._result[idx, :s.length])

    def _send(self, addr, hdr: bytes, payload) -> None:
        c = self._c
        if self._drop and self._rng.random() < self._drop:
            c["injected_drops"] += 1
            return
        times = 2 if self._dup and self._rng.random() < self._dup else 1
        for _ in range(times):
            c["packets_out"] += 1
            if self._delay_s:
                self._delayed.append((time.monotonic() + self._delay_s, addr, hdr,
                                      bytes(payload)))
            else:
                P.send_data(self._sock, addr, hdr, payload)

    # ---- control-plane requests that touch slots ------------------------------------------------

    def reset_slots(self) -> None:
        """Clear every slot (Action.RESET, or the job ended)."""
        for s in self._slots:
            s.clear()
        self._active.clear()
        self._offsets.clear()
        self._fresh.clear()
        self._batches.clear()
        self._assigned.clear()

    def fbcast(self, seq: int) -> None:
        """Complete slot ``seq`` now with what it holds (Action.FBCAST). In threshold mode
        ``seq`` is a `protocol.async_seq`: that offset's open aggregate if it is the one named,
        even empty (a zero sum of count 1: its gradient segments were lost, and the workers
        wait for it); `protocol.ASYNC_FLUSH`: every open aggregate that holds a gradient. A
        child switch in threshold mode sends its batches' partials as they are (the daemon
        passes the FBcast up)."""
        if self._thr is not None:
            if self._parent is not None:
                self._flush_batches(whole=seq != P.ASYNC_FLUSH)
                return
            if seq == P.ASYNC_FLUSH:
                for o, a in list(self._offsets.items()):
                    if a.contrib:
                        self._complete_offset(o, a)
                return
            tag, o = P.async_split(seq)
            a = self._offsets.get(o)
            if a is not None and a.number % P.ASYNC_TAG_MOD == tag:
                self._complete_offset(o, a)
            return
        idx = seq & self._mask
        s = self._slots[idx]
        if s.seq == seq and s.state == FILLING and s.contrib:
            self._complete(idx, s, time.monotonic())

    def help_from_member(self, seq: int, ip: str, port: int) -> bool:
        """A member lost the result of ``seq``: resend the kept result, or the partial sent up
        (in threshold mode: ``seq`` is a `protocol.async_seq`). Returns False where a
        threshold-mode result is not kept here (a child switch asks its parent)."""
        if self._thr is not None:
            return self._async_help(seq, (ip, port))
        idx = seq & self._mask
        s = self._slots[idx]
        if s.seq == seq and s.state == DONE:
            self._send_result(idx, s, (ip, port), P.FLAG_RESULT | P.FLAG_FBCAST)
            self._c["retransmissions_served"] += 1
        elif s.seq == seq and s.state == UP:
            self._send_up(idx, s)
        return True

    def help_from_parent(self, seq: int) -> tuple | None:
        """The parent misses ``seq``: resend the partial; for a slot still filling, return the
        rows that contributed (the daemon asks the others)."""
        idx = seq & self._mask
        s = self._slots[idx]
        if s.seq == seq and s.state in (UP, DONE):
            self._send_up(idx, s)
        elif s.seq == seq and s.state == FILLING:
            s.helped = time.monotonic()
            return tuple(r for _, r in s.contrib)
        return None

    def tick(self, now: float) -> list[tuple[int, tuple]]:
        """Per slot waiting ``help_after_s``: resend a partial that went up; return
        ``(seq, contributed rows)`` of each filling one (the daemon sends Help). Threshold mode
        at a child switch: its batches' timers (`_tick_batches`)."""
        if self._batches:
            self._tick_batches(now)
        help_ = []
        for idx in list(self._active):
            s = self._slots[idx]
            if now - s.helped < self._help_after:
                continue
            s.helped = now
            if s.state == FILLING:
                help_.append((s.seq, tuple(r for _, r in s.contrib)))
            elif s.state == UP:
                self._send_up(idx, s)
        return help_

    # ---- sending control messages, delayed packets, counters ------------------------------------

    def send_control(self, ip: str, port: int, raw: bytes, faults: bool) -> None:
        """Send encoded control bytes; with ``faults`` subject to the drop rate and delay."""
        if faults and self._drop and self._rng.random() < self._drop:
            self._c["injected_drops"] += 1
            return
        self._c["packets_out"] += 1
        if faults and self._delay_s:
            self._delayed.append((time.monotonic() + self._delay_s, (ip, port), None, raw))
        else:
            P.send_raw_control(self._sock, (ip, port), raw)

    def next_due(self) -> float:
        """`time.monotonic` at which the next delayed packet leaves (inf: none)."""
        return self._delayed[0][0] if self._delayed else float("inf")

    def flush_delayed(self, now: float) -> None:
        """Send the delayed packets due by ``now`` (`time.monotonic`)."""
        while self._delayed and self._delayed[0][0] <= now:
            _, addr, hdr, payload = self._delayed.popleft()
            if hdr is None:
                P.send_raw_control(self._sock, addr, payload)
            else:
                P.send_data(self._sock, addr, hdr, payload)

    def counters(self) -> dict[str, int]:
        """`COUNTERS` now."""
        return dict(self._c)
