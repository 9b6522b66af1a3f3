"""A single-producer single-consumer ring of fixed-size slots in shared memory.

One writer fills slot ``w % num_slots`` in place and publishes it; one reader reads the oldest
published slot and releases it. Counters live in a 3-cache-line header (the writer's count, the
reader's count, the statistics) and a sequence number per slot: the writer makes it odd before
it writes a slot and even (``2 * (generation + 1)``) when the slot is published, so a reader can
tell a slot that was overwritten while it read (x86's store order makes the data visible before
the counter, as in `gmi_drl.comm.shm`; a weakly ordered CPU such as aarch64 would need fences
that Python cannot issue).

Back-pressure, chosen per ring:

- ``block``: a writer waits while every slot is unread (the reader's views stay valid until
  `SlotRing.release`; zero copy). The wait is counted (seconds).
- ``drop_oldest``: a writer never waits; it overwrites the oldest slot. The reader copies a slot
  out (`SlotRing.read_into`) and checks the slot's sequence number afterwards; a slot
  overwritten before or while it was read is skipped and counted as dropped.

Memory is allocated once: ``num_slots * slot_bytes`` plus the header.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

HEADER_BYTES = 192
"""write count (line 0), read count (line 1), statistics (line 2: dropped, blocked ns)"""

BACKPRESSURE = ("block", "drop_oldest")


class ChannelClosed(RuntimeError):
    """The channels were stopped (the run ended or failed) while a writer or reader waited."""


def ring_bytes(slot_bytes: int, num_slots: int) -> int:
    """Bytes one ring takes: header, one int64 sequence number per slot, the slots (each
    aligned to 64 bytes)."""
    return HEADER_BYTES + _seq_bytes(num_slots) + num_slots * _aligned(slot_bytes)


def _aligned(n: int) -> int:
    return (n + 63) // 64 * 64


def _seq_bytes(num_slots: int) -> int:
    return _aligned(8 * num_slots)


class SlotRing:
    """One ring over ``buf[offset : offset + ring_bytes(slot_bytes, num_slots)]``.

    Args:
        buf: the shared block (``uint8`` array; the header must start zeroed).
        offset: where this ring starts (a multiple of 64).
        slot_bytes: bytes of one slot. num_slots: slots.
        backpressure: ``block`` or ``drop_oldest`` (module docstring).
        stopped: called while waiting; ``True`` makes the wait raise `ChannelClosed`.

    Raises:
        ValueError: a bad ``backpressure`` or ``num_slots < 1``.
    """

    def __init__(self, buf: np.ndarray, offset: int, slot_bytes: int, num_slots: int,
                 backpressure: str = "block",
                 stopped: Callable[[], bool] = lambda: False) -> None:
        if backpressure not in BACKPRESSURE:
            raise ValueError(f"backpressure={backpressure!r} must be one of {BACKPRESSURE}")
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.slot_bytes, self.num_slots, self.backpressure = slot_bytes, num_slots, backpressure
        self._stopped = stopped
        head = buf[offset:offset + HEADER_BYTES].view(np.int64)
        self._write, self._read, self._stats = head[0:1], head[8:9], head[16:18]
        seq_at = offset + HEADER_BYTES
        self._seq = buf[seq_at:seq_at + 8 * num_slots].view(np.int64)
        start, step = seq_at + _seq_bytes(num_slots), _aligned(slot_bytes)
        self._slots = [buf[start + i * step:start + i * step + slot_bytes]
                       for i in range(num_slots)]
        self._claimed: int | None = None

    # --- writer -----------------------------------------------------------------------------

    def claim(self, timeout_s: float | None = None) -> np.ndarray:
        """The next slot to fill (``(slot_bytes,) uint8``, a view); under ``block``, waits while
        the ring is full. Call `publish` when it is filled.

        Raises:
            ChannelClosed: stopped while waiting. TimeoutError: full for ``timeout_s``.
        """
        w = int(self._write[0])
        if self.backpressure == "block" and w - int(self._read[0]) >= self.num_slots:
            t0 = time.perf_counter()
            _wait(lambda: w - int(self._read[0]) < self.num_slots, self._stopped, timeout_s,
                  "the ring stayed full")
            self._stats[1] += int((time.perf_counter() - t0) * 1e9)
        i = w % self.num_slots
        self._seq[i] = 2 * (w // self.num_slots) + 1  # odd: being written
        self._claimed = w
        return self._slots[i]

    def publish(self) -> None:
        """Make the claimed slot readable."""
        w = self._claimed
        self._seq[w % self.num_slots] = 2 * (w // self.num_slots + 1)
        self._write[0] = w + 1
        self._claimed = None

    # --- reader -----------------------------------------------------------------------------
    # Position-based, so that a reader can take the slots of several rings written in
    # lockstep (one per field) as one unit: `oldest` gives the position to read, `slot_at` its
    # data, `valid_at` whether it still holds that position's data, `advance` releases it.

    def oldest(self, write_pos: int | None = None) -> int | None:
        """The position of the oldest slot still readable, or ``None`` when none is published.
        Under ``drop_oldest`` positions the writer overwrote are skipped (counted as dropped).
        ``write_pos``: the writer's count to judge by (default: this ring's)."""
        w = self.written if write_pos is None else write_pos
        r = int(self._read[0])
        if self.backpressure == "drop_oldest" and w - r > self.num_slots:
            self._stats[0] += w - r - self.num_slots
            r = w - self.num_slots
            self._read[0] = r
        return None if w == r else r

    def slot_at(self, pos: int) -> np.ndarray:
        """The slot of position ``pos`` (``(slot_bytes,) uint8``, a view)."""
        return self._slots[pos % self.num_slots]

    def valid_at(self, pos: int) -> bool:
        """Whether the slot still holds position ``pos``'s published data (check after
        copying it under ``drop_oldest``; always true under ``block`` until `advance`)."""
        return int(self._seq[pos % self.num_slots]) == 2 * (pos // self.num_slots + 1)

    def advance(self, pos: int, dropped: bool = False) -> None:
        """Release every position up to ``pos`` (the writer may reuse its slot); ``dropped``
        counts it as dropped (overwritten while read)."""
        self._read[0] = pos + 1
        if dropped:
            self._stats[0] += 1

    def read_into(self, out: np.ndarray) -> bool:
        """Copy the oldest readable slot into ``out`` and release it; ``False`` when none is
        ready. A slot overwritten while it was copied is skipped (counted) and the next one
        tried."""
        while (pos := self.oldest()) is not None:
            np.copyto(out, self.slot_at(pos))
            ok = self.valid_at(pos)
            self.advance(pos, dropped=not ok)
            if ok:
                return True
        return False

    # --- both ---------------------------------------------------------------------------------

    @property
    def written(self) -> int:
        """Slots published since the ring was made."""
        return int(self._write[0])

    @property
    def dropped(self) -> int:
        """Slots overwritten before they were read (``drop_oldest``)."""
        return int(self._stats[0])

    @property
    def blocked_s(self) -> float:
        """Seconds writers waited on a full ring (``block``)."""
        return int(self._stats[1]) / 1e9

    def queued(self) -> int:
        """Published, unread slots (bounded by ``num_slots`` for what can still be read)."""
        return min(int(self._write[0]) - int(self._read[0]), self.num_slots)


def _wait(ready: Callable[[], bool], stopped: Callable[[], bool], timeout_s: float | None,
          what: str) -> None:
    """Spin, then sleep, until ``ready()``; raise `ChannelClosed` when ``stopped()``."""
    spins, deadline = 0, None if timeout_s is None else time.monotonic() + timeout_s
    while not ready():
        spins += 1
        if spins < 100:
            os.sched_yield()
            continue
        if stopped():
            raise ChannelClosed(f"channels stopped while waiting ({what})")
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{what} for {timeout_s} s")
        time.sleep(min(1e-3, 1e-5 * spins))
