"""Async iSwitch: threshold aggregation with a staleness bound (iSwitch §3.3, §4.1, Algorithm 1,
Fig. 11), the workers' side.

The switch, in threshold mode (`protocol.ThresholdValue`, `dataplane` module docstring), sums
the gradient segments of *any* workers at each segment offset until H gradients are in, then
broadcasts the sum with its count ``c``. Every worker applies ``sum / c`` per segment, aggregate
after aggregate in the switch's order, so ``θ`` is bit-identical on every worker at every
version, although each worker reaches a version at its own moment. A fast worker may put several
gradients into one aggregate; a slow one contributes less and never holds the others up.

- `ThresholdReducer`: a `SwitchReducer` that asks its switch for threshold mode (H, S) after it
  joins (and again after a switch restart), sends whole gradient vectors tagged with the weight
  version they were computed on, and assembles each parameter region's aggregates in order,
  asking the switch again (Help) for a result it lost.
- `ThresholdPipeline`: the three-stage pipeline (LGC / GA / LWU) on it, the same interface as
  `gmi_drl.comm.switch.pipeline.StaleSyncPipeline`.

Staleness (Algorithm 1): a gradient computed on version ``v`` that would join aggregate ``a``
has staleness ``a - v``. The worker checks it before it sends, after reading the results that
have come (the newest aggregate it knows of is a lower bound ``V`` of ``a``: ``V - v > S`` is
dropped and counted, ``staleness_dropped``), and the switch checks it when the gradient's first
segment arrives, for all its segments (its ``staleness_dropped`` counter; the header carries
``v`` mod 256, so the worker's check is the one that holds for gradients 256 or more behind).
A segment that comes after its offset's aggregate was broadcast short (FBcast, below) joins the
next one, one version staler. LGC computes at most ``S + 1`` gradients on one version: a
further one could only join a later aggregate, which the bound would refuse sooner or later.

Loss recovery: a result lost on the way down is asked for again (Help; the switch keeps the last
`dataplane.KEPT_AGGREGATES` per segment). A worker's gradient segment lost on the way up: where
it leaves an aggregate short of H while later ones came, the worker asks the switch to
broadcast it as it is (FBcast; a zero sum where nothing came), and every worker applies the
same, smaller, sum; where no result came at all since the worker's last gradient (every worker
may be waiting for that aggregate: H = N with S = 0), the worker resends its last gradient of
each region, after 4 retransmit timeouts and then at doubling intervals (the switch drops the
segments it holds already as duplicates), and raises `SwitchError` once ``timeout_s`` passed
without an aggregate. A drain's flush is answered with every offset's aggregates
completed (`protocol.Action.FLUSHED`), so a worker that lost every packet of one learns of it.

A tree of switches (iSwitch §3.4): a worker may join a ToR switch (one started with
``--parent``); the ToR sums its workers' gradients into per-rack partials (`dataplane` module
docstring) and sends each up with its count and its oldest gradient's version. The root
completes an aggregate at ``ceil(H * members / workers below)`` contributions (a ToR's partial
or a worker's gradient is one), which is H gradients where the racks' partials are full and
fewer where a rack's batch went up without a slow worker's gradient (after the ToR's
``help_after_s``): through a tree, H = N with S = 0 is not the exact synchronous mode. It
checks S against each partial's oldest gradient (the ToR drops the ones it already knows to be
staler), and each ToR uplink carries about one vector per rack size of gradients; the root's results go down through the ToRs, which keep the last
`dataplane.KEPT_AGGREGATES` per offset for their workers' Help (one they lack they ask the
root for); FBcast and the flush go up to the root, its answers down.
Not covered (yet): a switch restarted after the first gradient (the worker raises
`SwitchError`, or, for a restarted root under ToRs, the root drops the gradients: the aggregate
numbering is lost; the run resumes from its checkpoint); flow control: between a drain and its
next push a worker reads nothing, so where the others make more than
`dataplane.KEPT_AGGREGATES` aggregates meanwhile and the socket's receive buffer overflows, the
worker raises `SwitchError` (aggregate ... lost for good) instead of catching up.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from gmi_drl.comm.switch import protocol as P
from gmi_drl.comm.switch.client import SwitchError, SwitchReducer
from gmi_drl.comm.switch.dataplane import KEPT_AGGREGATES
from gmi_drl.comm.switch.pipeline import LwuEngine, LwuPipeline
from gmi_drl.comm.switch.protocol import Action


@dataclass(eq=False)
class _Aggregate:
    """One aggregate of a region being assembled: the means per segment as they come."""

    mean: np.ndarray
    got: np.ndarray
    first: float
    n: int = 0


@dataclass(eq=False)
class _Region:
    """A vector size's place in the parameter layout: segment offsets ``[base, base + nseg)``."""

    index: int
    base: int
    size: int
    nseg: int
    next: int = 0
    """the next aggregate number to hand out (the region's version)"""
    open: dict = field(default_factory=dict)
    """aggregate number -> `_Aggregate` not yet handed out"""
    limit: int | None = None
    """in a barrier, once the flush is answered: the version the region stops at"""
    helped: float = 0.0
    last: tuple | None = None
    """``(tag, vector, version)`` of the last gradient sent, for a resend"""

    def known(self) -> int:
        """The newest aggregate number known to exist here, plus one: a lower bound of the
        aggregate a gradient sent now would join."""
        return max(self.next, max(self.open, default=-1) + 1)


class ThresholdReducer(SwitchReducer):
    """A worker of a threshold-mode (asynchronous) iSwitch job; see the module docstring.

    Args:
        as `SwitchReducer`, and
        threshold: H, gradient vectors per aggregate, ``1 <= H <= num_workers``.
        staleness: S, ``0 <= S < 128``, in aggregates.

    Raises:
        ValueError: H or S out of range (and as `SwitchReducer`).
        SwitchError: as `SwitchReducer`; or the switch (in a tree: the root, through this
            worker's switch) did not take threshold mode within ``join_timeout_s``, or refused
            it: the job aggregates with another (H, S) (this worker then leaves the group).

    Attributes:
        staleness_dropped: gradients this worker dropped before sending (older than S).
        threshold, staleness: H and S.
    """

    def __init__(self, switch_addr: str, worker_id: int, num_workers: int, threshold: int,
                 staleness: int, job_id: str = "gmi-drl", token: str = "", *,
                 join_timeout_s: float = 60.0, **kw) -> None:
        if not 1 <= threshold <= min(num_workers, 255):
            raise ValueError(f"threshold H={threshold} must be in [1, num_workers={num_workers}]")
        if not 0 <= staleness < 128:
            raise ValueError(f"staleness S={staleness} must be in [0, 127]")
        self.threshold, self.staleness = threshold, staleness
        self._mode = P.ThresholdValue(threshold, staleness)
        self._mode_acked = False
        self._refused: str | None = None  # the switch's refusal of this threshold mode
        self._next_mode = 0.0
        self._regions: list[_Region] = []
        self._offsets = 0
        self._pushes = 0
        self._aggregates: list[tuple[int, np.ndarray]] = []  # complete, not yet returned
        self._flush_acked = False
        self._asked_where = 0.0
        self._queries_out = 0  # idle queries whose FLUSHED answer has not come (or was lost)
        self._in_barrier = False
        self._synced: list[np.ndarray] = []  # results of `barrier`'s rounds
        self.staleness_dropped = 0
        self._short: str | None = None  # why the workers left cannot complete an aggregate
        self._last_send = 0.0
        self._resend_at, self._resend_every, self._resent = 0.0, 0.0, 0
        super().__init__(switch_addr, worker_id, num_workers, job_id, token,
                         join_timeout_s=join_timeout_s, partial_results=True, **kw)
        try:
            self._await_mode(join_timeout_s)
        except BaseException:
            self.close()
            raise

    # ---- threshold mode at the switch -------------------------------------------------------

    def _send_mode(self, now: float) -> None:
        if now >= self._next_mode:
            self._next_mode = now + 0.2
            P.send_control(self._sock, self._switch, Action.SETH, self._mode)

    def _await_mode(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._mode_acked:
            if self._refused is not None:
                raise SwitchError(f"switch {self._where} refused worker {self.rank}'s threshold "
                                  f"mode (H={self.threshold}, S={self.staleness}): "
                                  f"{self._refused}")
            now = time.monotonic()
            if now > deadline:
                raise SwitchError(
                    f"worker {self.rank}: switch {self._where} did not take threshold mode "
                    f"(H={self.threshold}, S={self.staleness}) within {timeout_s} s (in a tree, "
                    "its root must take it too: is the root up and every switch's --mtu the "
                    "same?)")
            self._send_mode(now)
            self._poll(min(0.05, deadline - now))

    def _on_control(self, action: Action, value) -> None:
        if action == Action.ACK and value in (Action.SETH, Action.FBCAST):
            self._mode_acked = self._mode_acked or value == Action.SETH
            return
        if action == Action.SETH_NACK:  # (raised by `_await_mode`, which leaves the group)
            if not self._mode_acked and (value.threshold, value.staleness) == self._mode:
                self._refused = value.text
            return
        if action == Action.FLUSHED:
            # An answer may be an idle query's sent before the barrier (it cannot tell): taken
            # as that while queries are out. A flush's answer taken so is harmless: the flush
            # is sent again until answered, and a lost query's answer costs one such resend.
            flush = self._in_barrier and not self._flush_acked and not self._queries_out
            self._queries_out = max(0, self._queries_out - 1)
            self._learn(value, time.monotonic(), flush)
            self._flush_acked = self._flush_acked or flush
            return
        was = self._joined
        super()._on_control(action, value)
        if action == Action.READY and value.ready:
            self._short = self._shortfall(value.active_workers)
        if action == Action.JOIN_ACK and not was:
            if self._pushes:
                raise SwitchError(
                    f"worker {self.rank}: switch {self._where} restarted during Async iSwitch "
                    "training: the aggregates it numbered are gone, so the workers can no longer "
                    "apply them in one order; restart the run from its last checkpoint")
            self._mode_acked = False  # (a switch restarted while joining: ask again)
            self._next_mode = 0.0
            self._send_mode(time.monotonic())

    def _shortfall(self, active: int) -> str | None:
        """Why the ``active`` workers left in the group (members that left or timed out are
        dropped from it) can no longer complete an aggregate, or ``None``: each computes at most
        ``S + 1`` gradients on one version, so fewer than H of them would wait for the next
        version forever. (A worker that leaves at the end of a run drops out too: `take`
        raises it only to a worker still waiting for an aggregate of its gradients.)"""
        if active * (self.staleness + 1) >= self.threshold:
            return None
        return (f"worker {self.rank}: {self.world_size - active} worker(s) left the group: the "
                f"{active} left give at most {active * (self.staleness + 1)} gradients to an "
                f"aggregate of H={self.threshold} (S={self.staleness}), so none would "
                "complete; resume the run from its last checkpoint")

    # ---- layout and sending ------------------------------------------------------------------

    def region(self, size: int) -> int:
        """Reserve segment offsets for vectors of ``size`` float32; returns the region's index.
        Every worker must reserve the same sizes in the same order.

        Raises:
            ValueError: ``size < 1``, or the layout would exceed `protocol.ASYNC_OFFSETS`."""
        if size < 1:
            raise ValueError(f"a region holds >= 1 float32, not {size}")
        nseg = -(-size // self._seg_floats)
        if self._offsets + nseg > P.ASYNC_OFFSETS:
            raise ValueError(f"{self._offsets + nseg} segments exceed the threshold-mode layout "
                             f"of {P.ASYNC_OFFSETS} (raise the switch's --mtu)")
        self._regions.append(_Region(len(self._regions), self._offsets, size, nseg))
        self._offsets += nseg
        return len(self._regions) - 1

    def send(self, region: int, vec: np.ndarray, version: int) -> bool:
        """Send gradient ``vec`` (``(size,) float32`` of region ``region``) computed on weight
        version ``version``, after reading the results that have come (they are `take`'s).
        Returns False, sending nothing, where it is older than S already against the newest
        aggregate known (counted in ``staleness_dropped``). Non-blocking; ``vec`` is kept,
        unchanged by the caller, until the region's next result (a resend: module docstring)."""
        if self._joined:
            self._synced += self.pump(0.0)  # (the newest aggregates first: the bound's check)
        r = self._regions[region]
        if r.known() - version > self.staleness:
            self.staleness_dropped += 1
            return False
        tag = self._pushes
        self._pushes += 1
        vec = np.ascontiguousarray(vec, np.float32)
        self._send_seg(r, tag, vec, version)
        now = self._last_send = time.monotonic()
        r.last = (tag, vec, version)
        self._resend_every = 4 * self._rto
        self._resend_at = now + self._resend_every
        return True

    def _send_seg(self, r: _Region, tag: int, vec: np.ndarray, version: int) -> None:
        # (a region's offsets are consecutive in the low 16 bits of seq: `region`)
        self._send_segments(vec, 0, r.nseg, P.async_seq(tag, r.base), version, P.FLAG_ASYNC)

    # ---- receiving ---------------------------------------------------------------------------

    def _on_result(self, off: int, nbytes: int) -> None:
        seq, _rnd, _member, count, flags, k = P.decode_data(
            memoryview(self._rx)[off:off + nbytes], nbytes, P.RX_BUFFER_BYTES)
        if not flags & P.FLAG_ASYNC:  # a synchronous round's (`barrier`)
            super()._on_result(off, nbytes)
            return
        if not flags & P.FLAG_RESULT:
            return
        tag, o = P.async_split(seq)
        r = self._region_of(o)
        if r is None:
            return
        ahead = (tag - r.next) % P.ASYNC_TAG_MOD
        if ahead >= P.ASYNC_TAG_MOD // 2:
            return  # an aggregate already applied
        number, i = r.next + ahead, o - r.base
        f = self._seg_floats
        if k != min(f, r.size - i * f):
            return
        a = self._aggregate(r, number)
        if a.got[i]:
            return
        at = off // P.FLOAT_BYTES
        np.divide(self._rx_f32[at:at + k], np.float32(count), out=a.mean[i * f:i * f + k])
        a.got[i] = True
        a.n += 1
        self._last_progress = time.monotonic()
        r.last = None
        self._advance(r)

    def _on_results(self, nbytes: int, seg: int) -> int:
        """Threshold-mode results coalesced by GRO in ``self._rx[:nbytes]``, ``seg`` bytes each:
        where the full datagrams are consecutive segments of one aggregate of one region (the
        usual case: a ToR or the root sends an aggregate's segments back to back), take them
        with one division, as `_on_result` takes each. Returns the bytes taken (0: none; the
        caller handles the rest one by one)."""
        head = self._coalesced(nbytes, seg)
        if head is None:
            return 0
        seq, m, count, rows = head
        if not (P.data_field(rows, "flags") & P.FLAG_ASYNC).all():
            return 0  # (a barrier's synchronous results: one by one)
        tag, o = P.async_split(seq)
        r, f = self._region_of(o), self._seg_floats
        if r is None or o + m > r.base + r.nseg or (o - r.base + m) * f > r.size:
            return 0  # (seq's offsets run on past the region: one by one)
        ahead = (tag - r.next) % P.ASYNC_TAG_MOD
        if ahead >= P.ASYNC_TAG_MOD // 2:
            return m * seg  # an aggregate already applied
        i, a = o - r.base, self._aggregate(r, r.next + ahead)
        if a.got[i:i + m].any():
            return 0  # (duplicates of segments already in: one by one)
        np.divide(rows[:, P.HEADER_BYTES:].view("<f4"), np.float32(count),
                  out=a.mean[i * f:(i + m) * f].reshape(m, f))
        a.got[i:i + m] = True
        a.n += m
        self._last_progress = time.monotonic()
        r.last = None
        self._advance(r)
        return m * seg

    def _aggregate(self, r: _Region, number: int) -> _Aggregate:
        """Region ``r``'s aggregate ``number`` being assembled (begun here where it is not)."""
        a = r.open.get(number)
        if a is None:
            a = r.open[number] = _Aggregate(np.empty(r.size, np.float32),
                                            np.zeros(r.nseg, bool), time.monotonic())
        return a

    def _advance(self, r: _Region) -> None:
        """Hand out region ``r``'s complete aggregates in order, up to its ``limit``."""
        while (a := r.open.get(r.next)) is not None and a.n == r.nseg \
                and (r.limit is None or r.next < r.limit):
            del r.open[r.next]
            r.next += 1
            self._aggregates.append((r.index, a.mean))

    def _learn(self, runs, now: float, barrier: bool) -> None:
        """`Action.FLUSHED`'s runs: where the switch completed aggregates of a region that this
        worker has not seen (every result packet of one lost), wait for the last of them as
        for one begun (so `_ask_again` asks for each in turn). In a ``barrier``, that last one
        is the region's ``limit``: no later aggregate is handed out before the barrier ends
        (the first answer's: a late answer to a repeated flush may count aggregates that the
        others made after they left)."""
        for r in self._regions:
            last = r.next
            for first, n, number in runs:
                ahead = (number - r.next) % P.ASYNC_TAG_MOD
                if first < r.base + r.nseg and r.base < first + n \
                        and ahead < P.ASYNC_TAG_MOD // 2:
                    last = max(last, r.next + ahead)
            if last > r.next:
                r.open.setdefault(last - 1, _Aggregate(
                    np.empty(r.size, np.float32), np.zeros(r.nseg, bool), now))
            if barrier:
                r.limit = last

    def _region_of(self, offset: int) -> _Region | None:
        for r in self._regions:
            if r.base <= offset < r.base + r.nseg:
                return r
        return None

    def _ask_again(self, now: float) -> None:
        """Loss recovery for each region's next aggregate, once a later result (or part of this
        one) waited past the retransmit timeout: Help for its missing segments (a result lost
        on the way down: the switch resends its kept copy), and from the second try on FBcast
        them too (a gradient segment lost on the way up left the switch one short of H: it
        broadcasts what it holds). Where nothing is open and no result came for a while, ask
        the switch which aggregates it completed (Help of `protocol.ASYNC_FLUSH`, answered
        `Action.FLUSHED` without a flush): every result of the last ones may have come before
        this worker reserved its regions, or been lost; and where none came since this worker's
        last gradient, resend it (`_resend_unanswered`)."""
        idle = self._pushes and not self._in_barrier and not any(r.open for r in self._regions)
        if idle and now - max(self._last_progress, self._asked_where) > 4 * self._rto:
            self._asked_where = now  # (results may have come before this worker's regions)
            self._queries_out += 1
            P.send_control(self._sock, self._switch, Action.HELP, P.ASYNC_FLUSH)
        if idle and self._last_send > self._last_progress:
            self._resend_unanswered(now)
        for r in self._regions:
            if not r.open or now - r.helped < self._rto:
                continue
            first = min(a.first for a in r.open.values())
            if now - first < self._rto:
                continue
            r.helped = now
            a = r.open.get(r.next)
            missing = range(r.nseg) if a is None else np.flatnonzero(~a.got)
            actions = (Action.HELP,) if now - first < 3 * self._rto else (Action.HELP,
                                                                           Action.FBCAST)
            for i in missing:
                for action in actions:
                    P.send_control(self._sock, self._switch, action,
                                   P.async_seq(r.next, r.base + int(i)))
            if now - first > self.timeout_s:
                raise SwitchError(
                    f"worker {self.rank}: aggregate {r.next} of region {r.index} incomplete for "
                    f"{self.timeout_s} s while later ones came: its result is lost for good "
                    f"(the switch keeps the last {KEPT_AGGREGATES} per segment)")

    def _resend_unanswered(self, now: float) -> None:
        """No result came since this worker's last gradient: resend each region's last one, at
        doubling intervals (the switch drops the segments it holds as duplicates: a worker's
        pushes are taken in order, so a lost one is taken only while none after it came).

        Raises:
            SwitchError: no aggregate for ``timeout_s`` since the last gradient."""
        if now - self._last_send > self.timeout_s:
            raise SwitchError(
                f"worker {self.rank}: no aggregate from switch {self._where} for "
                f"{self.timeout_s} s since this worker's last gradient (resent {self._resent} "
                "times): the other workers stopped sending, or the switch lost the gradients; "
                "resume the run from its last checkpoint")
        if now < self._resend_at:
            return
        for r in self._regions:
            if r.last is not None:
                self._send_seg(r, *r.last)
                self._resent += 1
        self._resend_every *= 2
        self._resend_at = now + self._resend_every

    def take(self, timeout_s: float, wake=None) -> list[tuple[int, np.ndarray]]:
        """Wait up to ``timeout_s`` for results (at once if ``wake`` becomes readable), recover
        lost ones; returns the aggregates completed since the last call as ``(region, mean)``
        (``mean``: ``(size,) float32``, per segment ``sum / count``), in the switch's order per
        region.

        Raises:
            SwitchError: the switch refused this worker, a result stayed lost, a gradient sent
                waits for an aggregate that the workers left cannot complete, or none came for
                ``timeout_s`` since this worker's last gradient."""
        now = time.monotonic()
        if self._joined and not self._mode_acked:
            self._send_mode(now)
        if not self._aggregates:
            wait = min(timeout_s, self._rto) if any(r.open for r in self._regions) else timeout_s
            self._synced += self.pump(wait, wake)  # (`barrier`'s rounds)
        now = time.monotonic()
        self._ask_again(now)
        out, self._aggregates = self._aggregates, []
        if (self._short is not None and not out and not self._in_barrier
                and self._last_send > self._last_progress
                and now - self._last_send > max(4 * self._rto, 1.0)):
            raise SwitchError(self._short)  # (a gradient of ours waits for an aggregate)
        return out

    def barrier(self, deliver: Callable[[list], None], timeout_s: float = 60.0) -> None:
        """Bring every worker to the same last aggregate, once it stopped sending (collective:
        every worker calls it). A synchronous round (after it, every worker's gradients are at
        the switch), a flush of the switch's open aggregates (`protocol.ASYNC_FLUSH`, sent
        until acknowledged), a second round (every flush's results precede its result), then
        the aggregates still missing (lost ones asked for again). ``deliver(aggregates)`` gets
        every aggregate that comes meanwhile, as `take` returns them.

        The flush's answer (`protocol.Action.FLUSHED`) names each offset's aggregates
        completed at the switch: the last aggregate of the phase, the same for every worker (the
        first flush completes every open aggregate; no gradient comes before every worker
        passed the second round). A worker that lost every result packet of an aggregate
        learns from it that the aggregate exists and asks for it again; a worker that is late
        (its second round's result lost, or it was not scheduled) holds back the aggregates
        that the others made after they left, for its next `take`. So every worker leaves the
        barrier at the same version.

        Raises:
            SwitchError: the group broke, or not settled within ``timeout_s``."""
        end = time.monotonic() + timeout_s
        self._in_barrier = True  # (no query from here on: a FLUSHED now is the flush's)
        for r in self._regions:  # (a resend after the flush would join the next phase)
            r.last = None
        self._round_trip(deliver)
        self._flush_acked = False
        while not self._flush_acked:
            if time.monotonic() > end:
                raise SwitchError(f"worker {self.rank}: switch {self._where} did not acknowledge "
                                  f"the flush of its open aggregates within {timeout_s} s")
            P.send_control(self._sock, self._switch, Action.FBCAST, P.ASYNC_FLUSH)
            deliver(self.take(0.05))
        self._round_trip(deliver)
        while any(r.limit is not None and r.next < r.limit for r in self._regions):
            if time.monotonic() > end:
                raise SwitchError(f"worker {self.rank}: aggregates still missing after "
                                  f"{timeout_s} s at the end of a phase")
            deliver(self.take(0.05))
        deliver(self.take(0.0))
        for r in self._regions:  # (what the others made since: the next take's)
            r.limit = None
            self._advance(r)
        self._in_barrier = False

    def _round_trip(self, deliver: Callable[[list], None]) -> None:
        """One synchronous round of one float (a barrier), delivering aggregates meanwhile."""
        self.begin(np.zeros(1, np.float32))
        while not self._synced:
            deliver(self.take(0.05))
        self._synced.clear()


class _Engine(LwuEngine):
    """The LWU thread of one `ThresholdReducer`, shared by its pipelines (one per optimised
    module): sends the gradients LGC hands over (``pending``: ``(pipeline, vector, version)``),
    applies each region's aggregates in order."""

    def __init__(self, reducer: ThresholdReducer) -> None:
        super().__init__(reducer, "switch-async-lwu")
        self.by_region: dict[int, ThresholdPipeline] = {}

    def deliver(self, results) -> None:
        for region, mean in results:
            with self.cond:
                pipe = self.by_region[region]
                pipe._apply(mean)
                pipe.version += 1
                self.cond.notify_all()

    def _run(self) -> None:
        red = self.reducer
        while True:
            self._woken()
            with self.cond:
                new, self.pending = self.pending, deque()
                stop = self.abandon or (self.stop and not new)
            if stop:
                return
            for pipe, vec, version in new:
                staleness = pipe.version - version  # (only the LWU thread changes it)
                sent = red.send(pipe.region, vec, version)
                with self.cond:
                    if sent:
                        pipe.staleness_counts[staleness] += 1
                    else:
                        pipe.staleness_dropped += 1
            with self.cond:
                for pipe, _, _ in new:
                    pipe._sent += 1
                self.cond.notify_all()
            self.deliver(red.take(0.5, self._wake_r))


_ENGINES: "weakref.WeakKeyDictionary[ThresholdReducer, _Engine]" = weakref.WeakKeyDictionary()


class ThresholdPipeline(LwuPipeline):
    """One worker's LGC/GA/LWU pipeline of Async iSwitch (H, S); see the module docstring.

    The interface of `gmi_drl.comm.switch.pipeline.StaleSyncPipeline`: per gradient, `fetch`
    (copy ``θ`` into the weights LGC computes on; waits only while ``S + 1`` gradients were
    computed on the current version), compute, `push` (returns at once). `drain` before the
    weights are read as a whole (a rollout, a checkpoint): it brings every worker to the same
    last aggregate, so ``θ`` is the same everywhere after it.

    Args:
        reducer: the `ThresholdReducer`; the LWU thread owns it between the first `push` and
            the last `drain`.
        apply: the local weight update ``apply(mean)``, ``mean`` ``(P,) float32`` (valid during
            the call), called on the LWU thread in the switch's order, holding the lock.

    Raises:
        ValueError: ``reducer`` is not a `ThresholdReducer`.

    Attributes:
        version: aggregates applied to ``θ``.
        pushed: gradients handed over.
        staleness_counts: ``{V - v: gradients sent}``, ``V`` the version when sent, ``v`` the
            one computed on (at most S; a lower bound of the staleness at the switch).
        staleness_dropped: gradients this worker dropped before sending (older than S).
    """

    KIND = "Async iSwitch pipeline"

    def __init__(self, reducer: ThresholdReducer, apply: Callable[[np.ndarray], None]) -> None:
        if not isinstance(reducer, ThresholdReducer):
            raise ValueError("Async iSwitch training needs a ThresholdReducer, got "
                             f"{type(reducer).__name__}")
        self.reducer, self.staleness_bound, self._apply = reducer, reducer.staleness, apply
        engine = _ENGINES.get(reducer)
        if engine is None:
            engine = _ENGINES[reducer] = _Engine(reducer)
        self._engine, self._cond = engine, engine.cond
        self.region: int | None = None
        self.version = self.pushed = self._sent = 0
        self.staleness_dropped = 0
        self.staleness_counts: Counter[int] = Counter()
        self._copied = -1
        self._computing: int | None = None
        self._on_version = (0, 0)  # (version, gradients computed on it)

    # ---- the trainer's thread (LGC) ------------------------------------------------------------

    def fetch(self, copy: Callable[[], None]) -> int:
        """Wait while ``S + 1`` gradients were computed on the current ``θ``, then run
        ``copy()`` (``θ_local ← θ``, skipped when unchanged) under the lock. Returns the version
        copied. Blocking.

        Raises:
            RuntimeError: the LWU thread failed (its error chained; `SwitchError` for the
                switch's)."""
        with self._cond:
            while (self._on_version[0] == self.version
                   and self._on_version[1] > self.staleness_bound
                   and self._engine.error is None):
                self._cond.wait()
            self._raise()
            self._copy(copy)
            self._computing = self.version
        return self._computing

    def push(self, grad: torch.Tensor) -> None:
        """Hand over the gradient computed since `fetch` (``(P,) float32``, any device; copied).
        Non-blocking.

        Raises:
            RuntimeError: no `fetch` since the last push, or the LWU thread failed."""
        if self._computing is None:
            raise RuntimeError("push without fetch: call fetch before computing each gradient")
        vec = np.empty(grad.numel(), np.float32)
        torch.from_numpy(vec).copy_(grad.reshape(-1))
        v = self._computing
        with self._cond:
            self._raise()
            if self.region is None:  # the first push: every worker's pipelines in one order
                self.region = self.reducer.region(vec.size)
                self._engine.by_region[self.region] = self
            n = self._on_version[1] + 1 if self._on_version[0] == v else 1
            self._on_version = (v, n)
            self._engine.pending.append((self, vec, v))
            self.pushed += 1
            self._engine.wake()
        self._computing = None

    def drain(self, copy: Callable[[], None]) -> None:
        """Wait until every gradient pushed to the reducer (by any of its pipelines) is sent,
        stop the LWU thread and bring every worker to the same last aggregate
        (`ThresholdReducer.barrier`: collective, so every worker drains as often, as the
        synchronous path reduces as often); then run ``copy()`` where ``θ`` changed. Blocking;
        the reducer is the caller's until the next `push`.

        Raises:
            RuntimeError: the LWU thread failed; `SwitchError`: the group broke."""
        engine = self._engine
        with self._cond:
            while (any(p._sent < p.pushed for p in engine.by_region.values())
                   and engine.error is None):
                self._cond.wait()
            engine.stop = True
        engine.join()
        self._raise()
        self.reducer.barrier(engine.deliver)
        with self._cond:
            self._copy(copy)
