"""The four components of channel-based experience sharing (GMI-DRL §4.2, Fig. 5(b)).

- `Dispenser` (DP, one per serving GMI): hands the collector a fragment ``[T, B, ...]`` to fill,
  field by field. Under MCC the fragment's fields are views of the per-field channels' slots
  (the collector writes in place, zero copy); under UCC it is a local buffer whose rows are
  packed into one message per env step.
- the compressor (CP, inside the dispenser): joins ``fragments_per_transfer`` consecutive
  fragments of each field into one transfer (one slot), so small fields do not travel as many
  small messages.
- `choose_trainer` (MG, the migrator): each transfer goes to the trainer with the least queued
  work over every serving GMI (ties: the next trainer after the serving GMI's own index). On one
  host every channel is shared memory, so "forward directly" and "gather, then distribute" are
  the same copy into the chosen trainer's channel.
- `Batcher` (BT, one per trainer): takes fragments from its channels, round robin over the
  serving GMIs, and stacks ``fragments_per_batch`` of them along the env axis into the
  trainer's batch tensors ``[T, F * B, ...]``.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from gmi_drl.comm.channels.fabric import Fabric, FieldSpec
from gmi_drl.comm.channels.ring import ChannelClosed, SlotRing


def _typed(slot: np.ndarray, f: FieldSpec, lead: tuple[int, ...] = (), offset: int = 0):
    n = f.nbytes * (int(np.prod(lead)) if lead else 1)
    return slot[offset:offset + n].view(np.dtype(f.dtype)).reshape(*lead, *f.shape)


def choose_trainer(fabric: Fabric, serving: int) -> int:
    """The migrator: the trainer with the least queued work; ties go to the first trainer at
    or after ``serving % num_trainers`` (so serving GMIs spread when all queues are empty)."""
    k_all = fabric.plan.num_trainers
    if k_all == 1:
        return 0
    order = [(serving + i) % k_all for i in range(k_all)]
    return min(order, key=fabric.queued)


class Dispenser:
    """The dispenser and compressor of serving GMI ``serving`` (module docstring).

    Use: ``frag = begin(version)``; for each step ``t`` the collector fills row ``t`` of every
    time-major field and calls ``step_done(t, next_obs)``; ``end()`` completes the fragment.

    Raises (from `begin` / `step_done`):
        ChannelClosed: the run stopped while a full channel blocked the dispenser.
    """

    def __init__(self, fabric: Fabric, serving: int) -> None:
        self.fabric, self.serving, self.plan = fabric, serving, fabric.plan
        p = self.plan
        self._uni = p.mode == "uni"
        self._local = {f.name: np.zeros(f.shape, f.dtype) for f in p.fields}
        self._trainer: int | None = None
        self._filled = 0  # fragments in the open transfer
        self._views: dict[str, np.ndarray] | None = None
        self.fragments = 0

    def begin(self, policy_version: int) -> dict[str, np.ndarray]:
        """The fragment to fill: ``{field: array of its FieldSpec shape}``; its
        ``policy_version`` field is set."""
        p = self.plan
        if self._uni:
            frag = self._local
            self._trainer = choose_trainer(self.fabric, self.serving)
        else:
            if self._trainer is None:  # open a transfer
                self._trainer = choose_trainer(self.fabric, self.serving)
                rings = self.fabric.rings(self.serving, self._trainer)
                self._views = {f.name: _typed(r.claim(), f, (p.fragments_per_transfer,))
                               for f, r in zip(p.fields, rings)}
                self._filled = 0
            frag = {name: v[self._filled] for name, v in self._views.items()}
        frag["policy_version"][...] = policy_version
        self._frag = frag
        return frag

    def step_done(self, t: int, next_obs: np.ndarray) -> None:
        """Row ``t`` of the fragment is filled; ``next_obs (B, *obs_shape)`` is the observation
        after it (the fragment's ``last_obs`` after its last step). UCC sends the step now."""
        if not self._uni:
            if t == self.plan.num_steps - 1:
                self._frag["last_obs"][...] = next_obs
            return
        ring = self.fabric.rings(self.serving, self._trainer)[0]
        slot, offset = ring.claim(), 0
        for whole, f in zip(self.plan.fields, self.plan.step_fields()):
            view = _typed(slot, f, offset=offset)
            if f.name == "last_obs":
                view[...] = next_obs
            elif whole.time_major:
                view[...] = self._local[f.name][t]
            else:
                view[...] = self._local[f.name]
            offset += f.nbytes
        ring.publish()

    def end(self) -> None:
        """The fragment is complete; a full transfer is published (MCC)."""
        self.fragments += 1
        if self._uni:
            return
        self._filled += 1
        if self._filled == self.plan.fragments_per_transfer:
            for ring in self.fabric.rings(self.serving, self._trainer):  # last field last
                ring.publish()
            self._trainer, self._views = None, None



class Batcher:
    """The batcher of trainer ``trainer``: ``next()`` fills ``batch`` with
    ``fragments_per_batch`` fragments.

    Args:
        fabric: the run's channels. trainer: this trainer's index.
        fragments_per_batch: F.
        device: where the batch tensors live.

    Attributes:
        batch: ``{field: tensor}``; time-major fields ``(T, F * B, ...)``, ``last_obs``
            ``(F * B, *obs_shape)``, ``policy_version`` ``(F * B,) int64`` (each env column's
            fragment's version).
    """

    def __init__(self, fabric: Fabric, trainer: int, fragments_per_batch: int,
                 device: torch.device | str = "cpu") -> None:
        self.fabric, self.trainer, self.plan = fabric, trainer, fabric.plan
        p, F = self.plan, fragments_per_batch
        self.fragments_per_batch = F
        self.batch: dict[str, torch.Tensor] = {}
        for f in p.fields:
            dtype = torch.from_numpy(np.zeros(0, f.dtype)).dtype
            if f.time_major:
                shape = (p.num_steps, F * p.num_envs, *f.shape[2:])
            elif f.name == "policy_version":
                shape = (F * p.num_envs,)
            else:
                shape = (F * p.num_envs, *f.shape[1:])
            self.batch[f.name] = torch.zeros(shape, dtype=dtype, device=device)
        self._next_source = 0
        self._filled = 0  # fragments in the batch being stacked
        self._open: tuple[int, int, dict[str, np.ndarray], int] | None = None  # MCC transfer
        self._scratch = ({f.name: np.zeros((p.fragments_per_transfer, *f.shape), f.dtype)
                          for f in p.fields} if p.backpressure == "drop_oldest" else None)
        self.fragments = 0
        self.min_version = -(1 << 62)
        """fragments of an older ``policy_version`` are dropped, not batched"""
        self.stale_dropped = 0
        """fragments dropped for their age (`min_version`)"""
        self._stale_at_deadline = 0

    def next(self, block: bool = True, timeout_s: float | None = None) -> bool:
        """Fill `batch` with the next F fragments; ``False`` when ``block`` is false and they
        are not all there yet (what was taken stays for the next call).

        Raises:
            ChannelClosed: the run stopped while waiting. TimeoutError: no fragment was batched
            for ``timeout_s`` seconds (none arrived, or all that did were older than
            `min_version`).
        """
        # the deadline runs from the last fragment batched: a ready slot overwritten while it
        # is read counts as none, and so does a fragment dropped as stale (`min_version`)
        deadline, self._stale_at_deadline = None, self.stale_dropped
        while self._filled < self.fragments_per_batch:
            filled = self._filled
            took = self._take_one()
            if self._filled > filled:
                deadline, self._stale_at_deadline = None, self.stale_dropped
                continue
            if not took and not block:
                return False
            if timeout_s is not None:
                deadline = deadline or time.monotonic() + timeout_s
            if took:
                self._check_deadline(deadline, timeout_s)
            else:
                self._wait(deadline, timeout_s)
        self._filled = 0
        return True

    def _wait(self, deadline: float | None, timeout_s: float | None) -> None:
        """Until some slot looks ready (a take may still find it overwritten), the run stops,
        or ``deadline`` (monotonic seconds) passes."""
        self._check_deadline(deadline, timeout_s)
        spins = 0
        while not self._any_ready():
            spins += 1
            if spins < 100:
                os.sched_yield()
                continue
            if self.fabric.stopped():
                raise ChannelClosed("channels stopped while the batcher waited")
            self._check_deadline(deadline, timeout_s)
            time.sleep(min(1e-3, 1e-5 * spins))

    def _check_deadline(self, deadline: float | None, timeout_s: float | None) -> None:
        if deadline is not None and time.monotonic() > deadline:
            stale = self.stale_dropped - self._stale_at_deadline
            if stale:
                raise TimeoutError(
                    f"trainer {self.trainer} batched nothing for {timeout_s} s: the {stale} "
                    f"fragments that arrived were all older than policy version "
                    f"{self.min_version} (--async.max-policy-lag) and were dropped; the "
                    "serving GMIs are not receiving this trainer's weights")
            dropped = (" (fragments may have kept arriving but been overwritten before they "
                       "could be read: raise --async.channel-slots)"
                       if self.plan.backpressure == "drop_oldest" else "")
            raise TimeoutError(f"no experience arrived at trainer {self.trainer} for "
                               f"{timeout_s} s{dropped}")

    def _any_ready(self) -> bool:
        if self._open is not None:
            return True
        return any(self._ready(s) for s in range(self.plan.num_serving))

    def _ready(self, s: int) -> bool:
        rings = self.fabric.rings(s, self.trainer)
        if self.plan.mode == "uni":
            pos = rings[0].oldest()
            return pos is not None and rings[0].written - pos >= self.plan.num_steps
        return rings[-1].oldest() is not None

    def _take_one(self) -> bool:
        """Copy one fragment into the batch's next column block; ``False`` when none is
        ready."""
        if self.plan.mode == "uni":
            return self._take_uni()
        if self._open is None and not self._open_transfer():
            return False
        s, pos, views, j = self._open
        frag = {name: v[j] for name, v in views.items()}
        self._copy_fragment(frag)
        j += 1
        if j == self.plan.fragments_per_transfer:
            if self.plan.backpressure == "block":
                for ring in self.fabric.rings(s, self.trainer):
                    ring.advance(pos)
            self._open = None
        else:
            self._open = (s, pos, views, j)
        return True

    def _open_transfer(self) -> bool:
        p, n = self.plan, self.plan.num_serving
        for i in range(n):
            s = (self._next_source + i) % n
            rings = self.fabric.rings(s, self.trainer)
            while (pos := rings[-1].oldest()) is not None:
                for ring in rings[:-1]:  # lockstep: skip what the last field ring skipped
                    ring.oldest(rings[-1].written)
                views = {f.name: _typed(r.slot_at(pos), f, (p.fragments_per_transfer,))
                         for f, r in zip(p.fields, rings)}
                if p.backpressure == "drop_oldest":  # copy, then check nothing overwrote it
                    for name, v in views.items():
                        np.copyto(self._scratch[name], v)
                    ok = all(r.valid_at(pos) for r in rings)
                    for ring in rings:
                        ring.advance(pos)
                    if not ok:
                        rings[-1].advance(pos, dropped=True)
                        continue
                    views = self._scratch
                self._open = (s, pos, views, 0)
                self._next_source = (s + 1) % n
                return True
        return False

    def _take_uni(self) -> bool:
        p, n = self.plan, self.plan.num_serving
        for i in range(n):
            s = (self._next_source + i) % n
            if not self._ready(s):
                continue
            ring = self.fabric.rings(s, self.trainer)[0]
            pos = ring.oldest()
            self._copy_fragment(self._unpack(ring, pos))
            ring.advance(pos + p.num_steps - 1)  # after the copy: the views are the slots
            self._next_source = (s + 1) % n
            return True
        return False

    def _unpack(self, ring: SlotRing, pos: int) -> dict[str, np.ndarray]:
        p = self.plan
        out: dict[str, list] = {f.name: [] for f in p.fields}
        for t in range(p.num_steps):
            slot, offset = ring.slot_at(pos + t), 0
            for f in p.step_fields():
                out[f.name].append(_typed(slot, f, offset=offset))
                offset += f.nbytes
        frag = {}
        for f in p.fields:
            rows = out[f.name]
            frag[f.name] = np.stack(rows) if f.time_major else (
                rows[-1] if f.name == "last_obs" else rows[0])
        return frag

    def _copy_fragment(self, frag: dict[str, np.ndarray]) -> None:
        """Copy ``frag`` into the batch's next column block, unless it is older than
        `min_version` (then it is counted in `stale_dropped` and left out)."""
        if int(frag["policy_version"].reshape(-1)[0]) < self.min_version:
            self.stale_dropped += 1
            return
        p, B = self.plan, self.plan.num_envs
        lo, hi = self._filled * B, (self._filled + 1) * B
        for f in p.fields:
            src, dst = torch.from_numpy(np.ascontiguousarray(frag[f.name])), self.batch[f.name]
            if f.time_major:
                dst[:, lo:hi].copy_(src)
            elif f.name == "policy_version":
                dst[lo:hi] = int(src.reshape(-1)[0])
            else:
                dst[lo:hi].copy_(src)
        self._filled += 1
        self.fragments += 1
