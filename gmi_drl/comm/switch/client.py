"""`SwitchReducer`: a worker of an iSwitch group (iSwitch §3.2-3.3, the worker's side).

``allreduce_`` flattens the tensors into one float32 vector, cuts it into segments of
``seg_floats`` elements (the switch's path-MTU size), numbers them with the next consecutive
``seq`` values, and keeps at most ``window`` segments in flight beyond the oldest one still
without a result. Each result packet holds the sum over ``count`` workers of one segment; it is
divided by ``count`` into place, so the call returns the mean. Loss recovery lives here (§3.3):
every segment has a retransmit timer (adaptive, doubled on each retry); a result lost on the
way down is answered by the switch from its kept copy. The switch's Help requests (a segment it
misses after a loss or its own restart) are answered from the current or the previous round's
input, which is kept for that purpose. A restarted switch answers ``NOT_MEMBER``; the reducer
then rejoins and resends what is pending. A heartbeat thread keeps the membership alive while
the trainer computes.
"""

from __future__ import annotations

import logging
import math
import select
import socket
import threading
import time
from typing import Sequence

import numpy as np
import torch

from gmi_drl.comm.reducer import GradReducer, flatten_into, unflatten_from
from gmi_drl.comm.switch import protocol as P
from gmi_drl.comm.switch.daemon import parse_addr
from gmi_drl.comm.switch.protocol import Action, MemberType

log = logging.getLogger(__name__)


class SwitchReducer(GradReducer):
    """One worker of a group whose gradients are summed by an aggregation switch.

    Args:
        switch_addr: ``"HOST:PORT"`` of the switch this worker is cabled to (a ToR in a tree).
        worker_id: this worker's id, ``0 <= worker_id < num_workers`` and < 256; the switch sums
            in ascending worker id, so the result does not depend on packet arrival order.
        num_workers: workers in the whole job (all switches of the tree).
        job_id: the job's name; a switch serves one job at a time.
        token: shared secret, if the switch was started with one.
        timeout_s: a call that makes no progress for this long raises (group broken).
        join_timeout_s: how long the constructor waits for the whole group to join.
        rto_s: initial retransmit timeout, seconds (then adapted to the measured round trip).
        heartbeat_s: heartbeat period, seconds (the switch drops members silent for longer than
            its ``member_timeout_s``).
        bind: local ``(ip, port)``; the default lets the routing table choose.

    Raises:
        ValueError: ids out of range, or a bad address.
        RuntimeError: the switch refused the Join (foreign job, bad token, full, different
            group size) or the group did not form within ``join_timeout_s``.
    """

    def __init__(self, switch_addr: str, worker_id: int, num_workers: int,
                 job_id: str = "gmi-drl", token: str = "", *, timeout_s: float = 60.0,
                 join_timeout_s: float = 60.0, rto_s: float = 0.2, heartbeat_s: float = 1.0,
                 bind: tuple[str, int] = ("0.0.0.0", 0)) -> None:
        if not 0 <= worker_id < min(num_workers, 256):
            raise ValueError(f"{worker_id=} must be in [0, min({num_workers=}, 256))")
        host, port = parse_addr(switch_addr)
        self.rank, self.world_size = worker_id, num_workers
        self.timeout_s = timeout_s
        self._switch = (socket.gethostbyname(host), port)
        self._join_value = P.JoinValue(worker_id, MemberType.WORKER, num_workers, 1, 0,
                                       job_id, token)
        self._sock = P.open_socket(bind)
        self._rx = bytearray(P.RX_BUFFER_BYTES)
        self._rx_f32 = np.frombuffer(self._rx, "<f4", (P.RX_BUFFER_BYTES - P.HEADER_BYTES) // 4,
                                     P.HEADER_BYTES)
        self._joined = self._ready = False
        self._seg_floats = self._window = 0
        self._active_workers = num_workers
        self._next_join = 0.0
        self._seq = 0
        self._round = 0
        self._srtt: float | None = None
        self._rto = rto_s
        self._in = self._prev_in = self._out = np.zeros(0, "<f4")
        self._prev = (0, 0, 0)          # base seq, segments, elements of the previous round
        self._cur = None                # per-round state while allreduce_ runs
        self.retransmits = 0
        self._closed = False
        self._hb_stop = threading.Event()
        try:
            self._wait_joined(join_timeout_s)
        except BaseException:
            self._sock.close()
            raise
        self._hb = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True,
                                    name=f"switch-heartbeat-{worker_id}")
        self._hb.start()

    # ---- membership --------------------------------------------------------------------------

    def _send_join(self, now: float) -> None:
        if now >= self._next_join:
            self._next_join = now + 0.2
            P.send_control(self._sock, self._switch, Action.JOIN, self._join_value)

    def _wait_joined(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not (self._joined and self._ready):
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(
                    f"worker {self.rank}: no complete group at switch {self._switch} within "
                    f"{timeout_s} s (joined={self._joined}; are all {self.world_size} workers "
                    f"and the switches up?)")
            self._send_join(now)
            self._poll(min(0.1, deadline - now))

    def _heartbeat(self, period_s: float) -> None:
        while not self._hb_stop.wait(period_s):
            try:
                P.send_control(self._sock, self._switch, Action.HEARTBEAT)
            except OSError:
                return

    # ---- receive -------------------------------------------------------------------------------

    def _poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for packets, handle every one queued. True if any came."""
        sock = self._sock
        if timeout > 0:
            r, _, _ = select.select([sock], [], [], timeout)
            if not r:
                return False
        got = False
        while True:
            try:
                nbytes, tos, addr = P.recv_packet(sock, self._rx, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return got
            except OSError:  # ICMP unreachable while the switch restarts
                continue
            got = True
            if addr != self._switch:
                continue
            try:
                if tos == P.TOS_DATA:
                    self._on_result(nbytes)
                elif tos == P.TOS_CONTROL:
                    self._on_control(*P.decode_control(self._rx[:nbytes]))
            except P.ProtocolError as e:
                log.debug("worker %d: malformed packet from the switch: %s", self.rank, e)

    def _on_control(self, action: Action, value) -> None:
        now = time.monotonic()
        if action == Action.JOIN_ACK:
            if self._joined and value.seg_floats != self._seg_floats and self._cur is not None:
                raise RuntimeError(f"the switch came back with segment size {value.seg_floats}"
                                   f" != {self._seg_floats} in the middle of a round")
            self._joined = True
            self._seg_floats, self._window = value.seg_floats, value.window
        elif action == Action.JOIN_NACK:
            raise RuntimeError(f"switch {self._switch} refused worker {self.rank}: "
                               f"{value.reason.name}: {value.text}")
        elif action == Action.READY:
            was = self._ready
            self._ready, self._active_workers = value.ready, value.active_workers
            if value.ready and not was and self._cur is not None:
                self._cur["next_check"] = 0.0
                self._cur["sent_at"][:] = -math.inf   # resend everything pending now
        elif action == Action.NOT_MEMBER:
            if self._joined:
                log.warning("worker %d: switch %s forgot us (restarted?): rejoining", self.rank,
                            self._switch)
            self._joined = self._ready = False
            self._send_join(now)
        elif action == Action.HELP:
            self._on_help(value, now)

    def _on_help(self, seq: int, now: float) -> None:
        cur = self._cur
        if cur is not None:
            i = (seq - cur["base"]) % P.SEQ_MOD
            if i < cur["next"]:
                if now - cur["sent_at"][i] > self._rto:
                    cur["sent_at"][i] = now
                    self._send_segment(self._in, cur["base"], i, cur["n"], self._round, P.FLAG_RETX)
                return
        base, nseg, n = self._prev
        i = (seq - base) % P.SEQ_MOD
        if i < nseg:
            self._send_segment(self._prev_in, base, i, n, self._round - 1, P.FLAG_RETX)

    def _on_result(self, nbytes: int) -> None:
        cur = self._cur
        seq, _rnd, _member, count, flags, k = P.decode_data(self._rx, nbytes, P.RX_BUFFER_BYTES)
        if cur is None or not flags & P.FLAG_RESULT:
            return
        i = (seq - cur["base"]) % P.SEQ_MOD
        if i >= cur["nseg"] or cur["done"][i]:
            return
        f = self._seg_floats
        lo = i * f
        if k != min(f, cur["n"] - lo):
            return
        np.divide(self._rx_f32[:k], count, out=self._out[lo:lo + k])
        cur["done"][i] = True
        cur["ndone"] += 1
        cur["hi_done"] = max(cur["hi_done"], i)
        cur["last_result"] = time.monotonic()
        first = cur["first_sent"][i]
        if first > 0:
            # measured from the first send, retransmitted or not: an over-estimate is safe, and
            # Karn's rule (skip retransmitted samples) would starve the estimate under queueing
            rtt = time.monotonic() - first
            self._srtt = rtt if self._srtt is None else 0.875 * self._srtt + 0.125 * rtt
            self._rto = min(2.0, max(0.02, 2.0 * self._srtt))

    # ---- send ----------------------------------------------------------------------------------

    def _send_segment(self, vec: np.ndarray, base: int, i: int, n: int, round_: int,
                      flags: int) -> None:
        f = self._seg_floats
        lo = i * f
        hdr = P.data_header(base + i, round_, self.rank, 1, flags)
        P.send_data(self._sock, self._switch, hdr, vec[lo:min(n, lo + f)])

    # ---- the collective ------------------------------------------------------------------------

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each float32 tensor by its mean over the group, in place. Blocking, collective.

        Raises:
            RuntimeError: no progress for ``timeout_s`` (a switch or the group is gone), or the
                switch refused this worker.
        """
        if self._closed:
            raise RuntimeError("allreduce_ on a closed SwitchReducer")
        n = sum(t.numel() for t in tensors)
        if n == 0:
            return
        if self._in.size < n:
            self._in, self._prev_in, self._out = (np.zeros(n, "<f4") for _ in range(3))
        flatten_into(tensors, torch.from_numpy(self._in[:n]))
        f, w = self._seg_floats, self._window
        nseg = -(-n // f)
        base = self._seq
        cur = self._cur = {
            "base": base, "nseg": nseg, "n": n, "next": 0, "ndone": 0, "next_check": 0.0,
            "done": np.zeros(nseg, bool), "sent_at": np.zeros(nseg), "tries": np.zeros(nseg, int),
            "first_sent": np.zeros(nseg), "hi_done": -1, "last_result": 0.0,
        }
        done, sent_at = cur["done"], cur["sent_at"]
        low = 0
        last_progress = time.monotonic()
        try:
            while cur["ndone"] < nseg:
                now = time.monotonic()
                if self._ready:
                    lim = min(nseg, low + w)
                    while cur["next"] < lim:
                        i = cur["next"]
                        sent_at[i] = cur["first_sent"][i] = now
                        self._send_segment(self._in, base, i, n, self._round, 0)
                        cur["next"] = i + 1
                elif self._joined is False:
                    self._send_join(now)
                before = cur["ndone"]
                self._poll(max(0.0, min(cur["next_check"] - now, 0.05)))
                now = time.monotonic()
                if cur["ndone"] != before:
                    last_progress = now
                    while low < nseg and done[low]:
                        low += 1
                elif now - last_progress > self.timeout_s:
                    raise RuntimeError(
                        f"worker {self.rank}: no result from switch {self._switch} for "
                        f"{self.timeout_s} s ({cur['ndone']}/{nseg} segments of round "
                        f"{self._round}); the group is broken")
                if now >= cur["next_check"]:
                    cur["next_check"] = now + min(self._rto / 2, 0.02)
                    if self._ready:
                        self._retransmit(cur, low, now)
        finally:
            self._cur = None
        self._seq = (base + nseg) % P.SEQ_MOD
        self._round += 1
        self._prev = (base, nseg, n)
        self._in, self._prev_in = self._prev_in, self._in
        unflatten_from(torch.from_numpy(self._out[:n]), tensors)

    def _retransmit(self, cur: dict, low: int, now: float) -> None:
        """Resend what is overdue. A segment below the highest one with a result is a hole: all
        packets travel in order, so it was lost and is resent after a short guard; above it,
        only the retransmit timeout (doubling per try) says so, and only while results have
        stopped coming (results still arriving mean the pipeline moves, just queued)."""
        hi = cur["next"]
        if hi <= low:
            return
        done, sent_at, tries = cur["done"][low:hi], cur["sent_at"][low:hi], cur["tries"][low:hi]
        backoff = np.exp2(np.minimum(tries, 5))
        wait = np.full(hi - low, self._rto)
        holes = cur["hi_done"] - low
        if holes > 0:
            wait[:holes] = max(0.005, 0.25 * (self._srtt or self._rto))
        if now - cur["last_result"] < self._rto:
            wait[max(holes, 0):] = np.inf
        due = np.flatnonzero(~done & (sent_at + wait * backoff <= now))
        for j in due:
            i = low + int(j)
            sent_at[j] = now
            tries[j] += 1
            self.retransmits += 1
            self._send_segment(self._in, cur["base"], i, cur["n"], self._round, P.FLAG_RETX)

    def close(self) -> None:
        """Leave the group (Leave to the switch), stop the heartbeat, close the socket.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._hb_stop.set()
        self._hb.join(timeout=5)
        try:
            for _ in range(5):  # Leave until acknowledged (it may be lost like any packet)
                P.send_control(self._sock, self._switch, Action.LEAVE)
                if self._await_ack(Action.LEAVE, 0.2):
                    break
        except OSError:
            pass
        self._sock.close()

    def _await_ack(self, action: Action, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            r, _, _ = select.select([self._sock], [], [], left)
            if not r:
                return False
            nbytes, tos, addr = P.recv_packet(self._sock, self._rx)
            if addr == self._switch and tos == P.TOS_CONTROL:
                try:
                    got, value = P.decode_control(self._rx[:nbytes])
                except P.ProtocolError:
                    continue
                if got == Action.ACK and value == action:
                    return True
        return False
