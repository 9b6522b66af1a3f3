"""The experience channels of an asynchronous run, in one shared-memory block (GMI-DRL §4.2).

Serving GMI ``s`` and trainer GMI ``k`` are joined by their own channels (one writer, one reader
each; `gmi_drl.comm.channels.ring.SlotRing`), so no two processes ever write one counter:

- ``multi`` (MCC, the paper's multi-channel): one ring per field of a fragment (obs, actions,
  rewards, ...); a slot holds ``fragments_per_transfer`` fragments of that field (the
  compressor's transfer) and the collector writes a fragment straight into it.
- ``uni`` (UCC, Fig. 5(b)): one ring whose slot is one env step's whole experience tuple of the
  serving GMI's envs, every field packed after the other: each step travels as one message.

A control area holds the stop flag and, per serving GMI, its env steps.
`ChannelPlan` is picklable: the placement creates the block (`Fabric.create`), every GMI attaches
to it by name (`Fabric.attach`), and the creator unlinks it (`Fabric.destroy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Literal

import numpy as np

from gmi_drl import blocks
from gmi_drl.comm.channels.ring import SlotRing, ring_bytes

MODES = ("multi", "uni")


@dataclass(frozen=True)
class FieldSpec:
    """One field of a fragment: its name, its shape within one fragment, its dtype, and
    whether it is time-major (shape ``(T, B, ...)``: a row per step) or one per fragment."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    time_major: bool = True

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ChannelPlan:
    """Everything that sizes and names a run's channels (picklable).

    Attributes:
        fields: the fields of one fragment; time-major fields have shape ``(T, B, ...)``.
        num_steps: T, steps per fragment. num_envs: B, envs of one serving GMI.
        num_serving, num_trainers: GMIs on each side.
        mode: ``multi`` (MCC) or ``uni`` (UCC), module docstring.
        fragments_per_transfer: fragments the compressor joins into one transfer (MCC).
        num_slots: transfers each channel holds (UCC: ``num_slots * fragments_per_transfer *
            T`` step messages, the same bytes).
        backpressure: ``block`` or ``drop_oldest`` (`SlotRing`).
        name: the shared-memory block, once created.
    """

    fields: tuple[FieldSpec, ...]
    num_steps: int
    num_envs: int
    num_serving: int
    num_trainers: int
    mode: Literal["multi", "uni"] = "multi"
    fragments_per_transfer: int = 1
    num_slots: int = 4
    backpressure: str = "block"
    name: str = ""

    def step_fields(self) -> tuple[FieldSpec, ...]:
        """The fields a step message of UCC carries: one time row of each time-major field,
        and every per-fragment field (each step repeats them)."""
        return tuple(FieldSpec(f.name, f.shape[1:], f.dtype, False) if f.time_major else f
                     for f in self.fields)

    def rings(self) -> list[tuple[int, int]]:
        """``(slot_bytes, num_slots)`` of the rings of one (serving, trainer) pair, in order."""
        if self.mode == "multi":
            return [(self.fragments_per_transfer * f.nbytes, self.num_slots)
                    for f in self.fields]
        step = sum(f.nbytes for f in self.step_fields())
        return [(step, self.num_slots * self.fragments_per_transfer * self.num_steps)]

    @property
    def control_bytes(self) -> int:
        return 64 + 128 * self.num_serving

    def pair_bytes(self) -> int:
        return sum(ring_bytes(*r) for r in self.rings())

    @property
    def nbytes(self) -> int:
        """The whole block's size in bytes."""
        return self.control_bytes + self.num_serving * self.num_trainers * self.pair_bytes()

    def validate(self) -> list[str]:
        """Every broken rule, one message each."""
        errors = channel_rules(self.mode, self.fragments_per_transfer, self.num_slots,
                               self.backpressure)
        bad = [f.name for f in self.fields
               if f.time_major and f.shape[:2] != (self.num_steps, self.num_envs)]
        if bad:
            errors.append(f"time-major fields {bad} must have shape (T={self.num_steps}, "
                          f"B={self.num_envs}, ...)")
        return errors


def channel_rules(mode: str, fragments_per_transfer: int, num_slots: int,
                  backpressure: str) -> list[str]:
    """Every broken rule of the channel settings (the ``async.*`` flags), one message each:
    what `ChannelPlan.validate` and the run's config check both apply."""
    errors = []
    if mode not in MODES:
        errors.append(f"async.channel={mode!r} must be one of {MODES}")
    if fragments_per_transfer < 1:
        errors.append(f"async.fragments_per_transfer={fragments_per_transfer} must be >= 1")
    elif mode == "uni" and fragments_per_transfer != 1:
        errors.append(f"async.fragments_per_transfer={fragments_per_transfer} with "
                      "async.channel uni: the uni-channel sends each env step as one message; "
                      "the compressor joins fragments of the multi-channel only")
    if num_slots < 1:
        errors.append(f"async.channel_slots={num_slots} must be >= 1")
    elif num_slots < 2 and backpressure == "drop_oldest":
        errors.append(f"async.backpressure='drop_oldest' with async.channel_slots={num_slots}: "
                      "a serving GMI that never waits overwrites the one slot the trainer is "
                      "reading, so no fragment would ever arrive whole; give "
                      "async.channel_slots >= 2")
    if mode == "uni" and backpressure != "block":
        errors.append(f"async.backpressure={backpressure!r} with async.channel uni: a dropped "
                      "step message would split a fragment; use block")
    return errors


class Fabric:
    """One GMI's view of the block: the rings of every pair and the control area.

    Attributes:
        plan: the `ChannelPlan` (with the block's name).
    """

    def __init__(self, plan: ChannelPlan, shm: shared_memory.SharedMemory,
                 owner: bool = False) -> None:
        self.plan, self._shm, self._owner = plan, shm, owner
        buf = np.frombuffer(shm.buf, np.uint8, count=plan.nbytes)
        self._buf = buf
        control = buf[:plan.control_bytes].view(np.int64)
        self._stop = control[0:1]
        per = control[8:].reshape(plan.num_serving, 16)
        self._env_steps = per[:, 0]
        self._pairs: dict[tuple[int, int], list[SlotRing]] = {}

    @classmethod
    def create(cls, plan: ChannelPlan) -> "Fabric":
        """Allocate and zero the block; the returned fabric owns it (`destroy`).

        Raises:
            ValueError: the plan breaks a rule of `ChannelPlan.validate`.
        """
        errors = plan.validate()
        if errors:
            raise ValueError("; ".join(errors))
        shm = blocks.create(plan.nbytes)
        np.frombuffer(shm.buf, np.uint8, count=plan.nbytes)[:] = 0
        from dataclasses import replace

        return cls(replace(plan, name=shm.name), shm, owner=True)

    @classmethod
    def attach(cls, plan: ChannelPlan) -> "Fabric":
        """Open the block ``plan.name`` made by `create` (in another process)."""
        shm = shared_memory.SharedMemory(name=plan.name)  # children share the creator's tracker
        return cls(plan, shm)

    def rings(self, serving: int, trainer: int) -> list[SlotRing]:
        """The rings from serving GMI ``serving`` to trainer GMI ``trainer`` (made once)."""
        key = (serving, trainer)
        if key not in self._pairs:
            p = self.plan
            offset = p.control_bytes + (serving * p.num_trainers + trainer) * p.pair_bytes()
            rings = []
            for slot_bytes, num_slots in p.rings():
                rings.append(SlotRing(self._buf, offset, slot_bytes, num_slots, p.backpressure,
                                      self.stopped))
                offset += ring_bytes(slot_bytes, num_slots)
            self._pairs[key] = rings
        return self._pairs[key]

    # --- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Tell every GMI to stop: waits on a channel raise `ChannelClosed`."""
        self._stop[0] = 1

    def stopped(self) -> bool:
        return bool(self._stop[0])

    def add_env_steps(self, serving: int, steps: int) -> None:
        """Count env steps of serving GMI ``serving``."""
        self._env_steps[serving] += steps

    def env_steps(self) -> int:
        """Env steps of every serving GMI so far."""
        return int(self._env_steps.sum())

    def queued(self, trainer: int) -> int:
        """Transfers (MCC) or step messages (UCC) waiting for trainer ``trainer``, over every
        serving GMI (what the migrator balances)."""
        return sum(self.rings(s, trainer)[-1].queued() for s in range(self.plan.num_serving))

    def stats(self) -> dict[str, float]:
        """Channel statistics over every pair: fragments dropped (``drop_oldest``; UCC: step
        messages), seconds writers blocked."""
        rings = [r for s in range(self.plan.num_serving) for k in range(self.plan.num_trainers)
                 for r in self.rings(s, k)]
        last = [self.rings(s, k)[-1] for s in range(self.plan.num_serving)
                for k in range(self.plan.num_trainers)]  # rings in lockstep drop together
        per = self.plan.fragments_per_transfer if self.plan.mode == "multi" else 1
        return {"channels/dropped": float(per * sum(r.dropped for r in last)),
                "channels/blocked_s": float(sum(r.blocked_s for r in rings))}

    def close(self) -> None:
        """Drop the views and close the mapping (the owner also unlinks it: `destroy`)."""
        if self._shm is None:
            return
        self._pairs.clear()
        self._buf = self._stop = self._env_steps = None
        try:
            self._shm.close()
        except BufferError:  # a caller still holds a view; the mapping goes with it
            self._shm.close = lambda: None
        if self._owner:
            self._shm.unlink()
        self._shm = None

    destroy = close
