"""Where a pool's environments run: the `Engine` contract and the in-process engine.

An engine owns the per-env state slots (`Slots`) and steps envs when actions are sent; the pool
front end (`gmi_drl.envs.pool.EnvPool`) validates input and assembles batches from the slots.
"""

from __future__ import annotations

import abc
import collections

import numpy as np

from gmi_drl.envs.stepper import Slots, Stepper


class EnvWorkerError(RuntimeError):
    """An env raised, or its worker process died; the pool cannot continue and must be closed."""


class Engine(abc.ABC):
    """Runs the sub-environments of one pool.

    Attributes:
        slots: per-env results, ``num_envs`` rows; a row is valid once its env id was returned by
            `wait` (or `reset` returned), until that env is sent again.
    """

    slots: Slots
    episode_end: np.ndarray | None = None
    """``(num_envs,) bool`` where the episode counted by ``episode_return`` ended, for engines
    where that differs from ``terminated | truncated`` (Atari's episodic life); ``None``: same."""
    extra_info: dict[str, np.ndarray] = {}
    """more per-env ``(num_envs, ...)`` arrays the pool returns in ``info`` (e.g. ``lives``)"""
    concurrent_send: bool = False
    """`send` may run in one thread while `wait` blocks in another (for envs not in flight):
    the pool then waits without its lock, so one thread sends while another receives (EnvPool's
    threading contract); otherwise the pool's lock serialises them."""

    @abc.abstractmethod
    def send(self, ids: np.ndarray, actions: np.ndarray) -> None:
        """Start stepping ``ids (n,) int64`` with validated ``actions (n, *action_shape)``.

        Does not block on the environments. ``actions`` may be reused by the caller on return.
        """

    @abc.abstractmethod
    def wait(self, min_count: int = 1) -> np.ndarray:
        """Block until at least one sent env finishes; return finished ids in completion order.

        ``min_count`` is how many the pool still needs for its batch: an engine may wait for that
        many before returning (fewer wake-ups), or return earlier.

        Raises:
            RuntimeError: a worker failed (message names the env ids and the original error).
        """

    @abc.abstractmethod
    def reset(self, ids: np.ndarray) -> None:
        """Reset ``ids`` (none in flight) and block until their slots hold the first observation."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every worker and free every buffer. Idempotent."""


class LocalEngine(Engine):
    """Steps a `Stepper` synchronously in the caller's process, at `send` time.

    For native batched environments (NumPy classic control, MuJoCo on its own thread pool), where
    one vectorised call is cheaper than any hand-off to another process.
    """

    concurrent_send = True  # wait only pops the deque send appends to (atomic in CPython)

    def __init__(self, stepper: Stepper) -> None:
        self.stepper = stepper
        self.slots = stepper.slots
        self._done: collections.deque[np.ndarray] = collections.deque()

    def send(self, ids: np.ndarray, actions: np.ndarray) -> None:
        self.stepper.step(ids, actions)
        self._done.append(ids)

    def wait(self, min_count: int = 1) -> np.ndarray:
        if not self._done:
            raise RuntimeError("wait() with nothing in flight")
        return self._done.popleft()

    def reset(self, ids: np.ndarray) -> None:
        self.stepper.reset(ids)

    def close(self) -> None:
        if self.stepper is not None:
            self.stepper.env.close()
            self.stepper = None


def queue_workers(num_threads: int) -> int:
    """Worker threads for a native core on ``csrc/work_queue.h`` that is to use ``num_threads``.

    The queue's `wait` runs queued envs in the calling thread instead of sleeping, so the caller
    is one of the pool's threads and the core starts ``num_threads - 1`` workers (at least one):
    more runnable threads than cores only preempt each other, and a caller that steps envs needs
    no wake-up per batch. While the caller computes (inference between ``recv`` and ``send``)
    the workers alone step envs.
    """
    return max(1, num_threads - 1)
