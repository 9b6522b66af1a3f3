"""Stale-sync training through the switch: a staleness bound S (iSwitch §4.1, Algorithm 1,
Fig. 11).

What the paper prescribes, and how this module does it:

- **Decentralised weights.** No parameter server holds the weights. Every worker starts from the
  same weights, the switch broadcasts the same aggregated gradient to every worker, and every
  worker applies the aggregated gradients in the same order with the same update rule. So the
  weights after update ``k`` are bit-identical on all workers, although workers reach update
  ``k`` at different moments (§4.1 "decentralised weight storage"; §4.2 treats them as one
  virtual parameter server).
- **Three-stage pipeline.** (1) Local gradient computation (LGC) runs on the trainer's thread;
  (2) gradient aggregation (GA) runs in the switch; (3) local weight update (LWU) runs on a
  second thread of the worker (§5.1: "dual-thread training", Algorithm 1). Here the second
  thread also owns the switch socket: it begins one reducer round per gradient LGC hands over
  (`SwitchReducer.begin`, several rounds in flight), receives the aggregated results in round
  order, and applies each to the shared weights ``θ``, taking the version ``v`` to ``v + 1``.
  LGC never waits for an aggregation unless the staleness bound says so.
- **LGC computes on a copy.** Algorithm 1's ``θ_local ← θ`` happens under the lock LWU holds
  while it applies an update, so a gradient never sees a half-applied update.
- **Staleness bound S.** Gradient ``t`` (this worker's ``t``-th, from 0) is aggregated in round
  ``t`` and applied to ``θ`` at version ``t``. Computed on ``θ`` at version ``v``, its staleness
  is ``t - v``. The paper checks the staleness on the worker and commits only gradients within
  the bound; here the check comes before the computation: LGC waits until ``v >= t - S`` before
  it copies ``θ``, so every gradient's staleness is at most ``S`` and none is computed in vain.
  (Dropping a computed gradient is not an option in this mode: a round completes with one
  vector from every worker.) ``S = 0`` is synchronous training: gradient ``t`` is computed on the
  weights after all ``t`` earlier updates, and the result is bit-identical to
  `SwitchReducer.allreduce_` followed by the same update.
- **Aggregation threshold H = N.** Every aggregate here holds exactly one gradient of every
  worker (summed in member order, hence bit-exact), and a fast worker runs up to ``S`` rounds
  ahead: the stale-synchronous model the paper's convergence argument (§4.2) reduces to. The
  paper's switch broadcasts once H vectors of *any* workers arrived, a fast worker's several
  among them: that is `gmi_drl.comm.switch.threshold` (Async iSwitch, ``gmi.threshold``).
"""

from __future__ import annotations

import socket
import threading
import weakref
from collections import Counter, deque
from typing import Callable

import numpy as np
import torch

from gmi_drl.comm.switch.client import SwitchError, SwitchReducer


class LwuEngine:
    """The LWU thread of one reducer, started on demand and woken through a socket pair that
    the reducer's wait selects on (`SwitchReducer.pump`'s ``wake``); shared by every pipeline
    on that reducer. Subclasses implement `_run` (the thread's loop); an exception there is
    kept in ``error`` (the trainer's thread raises it) and every waiter on ``cond`` woken.

    Attributes:
        cond: the lock of the pipelines' shared state, notified on every change.
        pending: what the trainer's thread handed over, not yet taken by the thread.
        stop: the thread returns once its work is done; abandon: it returns now.
    """

    def __init__(self, reducer: SwitchReducer, name: str) -> None:
        self.reducer = reducer
        self.cond = threading.Condition()
        self.pending: deque = deque()
        self.error: BaseException | None = None
        self.stop = self.abandon = False
        self.thread: threading.Thread | None = None
        self._name = name
        self._wake_r = self._wake_w = None  # a socket pair that wakes the thread

    def wake(self) -> None:
        """Start the thread if it is not running, and wake it."""
        if self.thread is None:
            self.stop = self.abandon = False
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self.thread = threading.Thread(target=self._main, daemon=True,
                                           name=f"{self._name}-{self.reducer.rank}")
            self.thread.start()
        self._wake_w.send(b"\0")

    def join(self) -> None:
        """Wake the thread and wait for it to return (set ``stop`` or ``abandon`` first)."""
        if self.thread is None:
            return
        self._wake_w.send(b"\0")
        self.thread.join()
        self.thread = None
        self._wake_r.close()
        self._wake_w.close()
        self._wake_r = self._wake_w = None

    def _woken(self) -> None:
        """Consume the wake-ups sent so far (the thread's loop calls it first)."""
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as e:  # handed to the trainer's thread, which raises it
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _run(self) -> None:
        raise NotImplementedError


class _Engine(LwuEngine):
    """The LWU thread of one reducer, shared by every pipeline on it (a learner with several
    optimised modules, e.g. DDPG's actor and critics, has one pipeline per module): it begins
    rounds in push order across the pipelines, which is the same on every worker, and hands each
    result to the pipeline that pushed it."""

    def __init__(self, reducer: SwitchReducer) -> None:
        super().__init__(reducer, "switch-lwu")
        self.pipes: list[StaleSyncPipeline] = []
        self.owners: deque[StaleSyncPipeline] = deque()  # of the rounds begun, in order

    def applied_all(self) -> bool:
        return all(p.version == p.pushed for p in self.pipes)

    def _run(self) -> None:
        red = self.reducer
        while True:
            self._woken()
            with self.cond:
                new, self.pending = self.pending, deque()
                stop = self.abandon or (self.stop and self.applied_all())
            if stop:
                return
            for pipe, vec in new:
                red.begin(vec)
                self.owners.append(pipe)
            for mean in red.pump(0.5, self._wake_r):
                with self.cond:
                    pipe = self.owners.popleft()
                    pipe._apply(mean)
                    pipe.version += 1
                    self.cond.notify_all()


_ENGINES: "weakref.WeakKeyDictionary[SwitchReducer, _Engine]" = weakref.WeakKeyDictionary()


class LwuPipeline:
    """What the switch pipelines (`StaleSyncPipeline`, `threshold.ThresholdPipeline`) share
    around their `LwuEngine`: the copy of ``θ`` for LGC, stopping the thread, and its error
    raised on the trainer's thread. A subclass sets ``_engine``, ``_cond``, ``reducer``,
    ``version`` and ``_copied`` (``-1`` before the first copy)."""

    KIND = "switch pipeline"
    """what `_raise` calls it"""

    def _copy(self, copy: Callable[[], None]) -> None:
        """``copy()`` (``θ_local ← θ``) where ``θ`` changed since the last; the lock held."""
        if self._copied != self.version:
            copy()
            self._copied = self.version

    def close(self) -> None:
        """Stop the LWU thread now, abandoning gradients still in flight. Idempotent; the
        reducer stays open (its owner closes it)."""
        with self._cond:
            self._engine.abandon = True
        self._engine.join()

    def _raise(self) -> None:
        error = self._engine.error
        if error is not None:
            cls = SwitchError if isinstance(error, SwitchError) else RuntimeError
            raise cls(f"the {self.KIND} of worker {self.reducer.rank} failed: "
                      f"{error}") from error


class StaleSyncPipeline(LwuPipeline):
    """One worker's LGC/GA/LWU pipeline with staleness bound ``S`` (see the module docstring).

    The trainer's thread calls, per gradient: `fetch` (wait for the bound, copy ``θ`` into the
    weights it computes on), compute the gradient, `push` (hand it over, returns at once). Before
    it reads or saves the weights as a whole (a rollout, a checkpoint) it calls `drain`. The LWU
    thread runs from the first `push` to the `drain` that finds every pipeline of the reducer
    drained. Several pipelines may share a reducer (one per optimised module): their rounds go
    to the switch in push order, each with its own versions and bound.

    Args:
        reducer: the switch client; the LWU thread owns it between the first `push` and the
            last `drain` (the caller must not use it then).
        staleness_bound: ``S >= 0``, in updates.
        apply: the local weight update, ``apply(mean)`` with ``mean`` the aggregated gradient
            ``(P,) float32`` (the mean over workers, valid during the call); it updates ``θ`` in
            place. Called on the LWU thread, in round order, holding the pipelines' lock.

    Raises:
        ValueError: ``staleness_bound < 0``, or ``reducer`` is not a `SwitchReducer` (only the
            switch client keeps rounds in flight).

    Attributes:
        version: updates applied to ``θ`` so far.
        pushed: gradients handed over so far.
        staleness_counts: ``{staleness s: gradients pushed with it}``.
    """

    def __init__(self, reducer: SwitchReducer, staleness_bound: int,
                 apply: Callable[[np.ndarray], None]) -> None:
        if staleness_bound < 0:
            raise ValueError(f"staleness_bound={staleness_bound} must be >= 0")
        if not isinstance(reducer, SwitchReducer):
            raise ValueError("stale-sync training needs the switch reducer (it keeps several "
                             f"rounds in flight); got {type(reducer).__name__}")
        self.reducer, self.staleness_bound, self._apply = reducer, staleness_bound, apply
        engine = _ENGINES.get(reducer)
        if engine is None:
            engine = _ENGINES[reducer] = _Engine(reducer)
        self._engine = engine
        self._cond = engine.cond
        with self._cond:
            engine.pipes.append(self)
        self.version = 0
        self.pushed = 0
        self.staleness_counts: Counter[int] = Counter()
        self._copied = -1        # version of θ_local
        self._computing = None   # version the gradient being computed started from

    # ---- the trainer's thread (LGC) ------------------------------------------------------------

    def fetch(self, copy: Callable[[], None]) -> int:
        """Wait until ``θ`` is at most ``S`` updates behind the next gradient, then run
        ``copy()`` (``θ_local ← θ``, skipped when ``θ`` has not changed since the last copy)
        under the lock. Returns the version copied. Blocking.

        Raises:
            RuntimeError: the LWU thread failed (the switch group broke; its error is chained).
        """
        need = self.pushed - self.staleness_bound
        with self._cond:
            while self.version < need and self._engine.error is None:
                self._cond.wait()
            self._raise()
            self._copy(copy)
            self._computing = self.version
        return self._computing

    def push(self, grad: torch.Tensor) -> None:
        """Hand over the gradient computed since `fetch` (``(P,) float32``, any device; it is
        copied). Non-blocking.

        Raises:
            RuntimeError: no `fetch` since the last push, or the LWU thread failed.
        """
        if self._computing is None:
            raise RuntimeError("push without fetch: call fetch before computing each gradient")
        vec = np.empty(grad.numel(), np.float32)
        torch.from_numpy(vec).copy_(grad.reshape(-1))
        with self._cond:
            self._raise()
            self.staleness_counts[self.pushed - self._computing] += 1
            self._engine.pending.append((self, vec))
            self.pushed += 1
            self._engine.wake()
        self._computing = None

    def drain(self, copy: Callable[[], None]) -> None:
        """Wait until every gradient this pipeline pushed is aggregated and applied, and run
        ``copy()`` (``θ_local ← θ``) if ``θ`` changed; once every pipeline of the reducer is
        drained, stop the LWU thread. Blocking; the reducer is the caller's again after the
        last pipeline's drain.

        Raises:
            RuntimeError: the LWU thread failed.
        """
        engine = self._engine
        with self._cond:
            while self.version < self.pushed and engine.error is None:
                self._cond.wait()
            last = engine.applied_all()
            engine.stop = last
        if last or engine.error is not None:
            engine.join()
        self._raise()
        with self._cond:
            self._copy(copy)
