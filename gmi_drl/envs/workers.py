"""The generic path: sub-environments in worker processes, results in shared memory.

EnvPool's ActionBufferQueue / StateBufferQueue (the EnvPool paper) in process form.
Each of ``num_workers`` processes owns a contiguous shard of env ids and a `Stepper` over its own
`BatchedEnv`; actions and every per-env result live in one shared-memory block, so nothing is
pickled per step. The pool wakes a worker through a per-worker semaphore and is woken through one
shared semaphore; both block in the kernel (no busy spin that would starve the pool's own process
on a machine with few cores).

Cost per `send`: one semaphore post per worker touched; per completion: one semaphore wait and a
scan of the busy workers (O(num_workers)).
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import signal
import traceback
from multiprocessing import shared_memory
from typing import Callable

import cloudpickle
import gymnasium as gym
import numpy as np

from gmi_drl import blocks
from gmi_drl.envs.engine import Engine, EnvWorkerError  # (its home: pools raise it too)
from gmi_drl.envs.batched import BatchedEnv
from gmi_drl.envs.spec import AutoresetMode
from gmi_drl.errors import exception_line
from gmi_drl.envs.stepper import Slots, Stepper

_STEP, _RESET, _CLOSE = 1, 2, 3
_CMD, _COUNT, _SEQ, _STATUS = range(4)
_OK, _ERROR = 0, 1
_POLL_S = 0.2  # how often a blocked pool checks that its workers are alive


def _layout(num_envs: int, num_workers: int, obs_space: gym.spaces.Space,
            act_space: gym.spaces.Space) -> list[tuple[str, tuple, np.dtype]]:
    obs_shape, obs_dtype = obs_space.shape, obs_space.dtype
    return [
        ("obs", (num_envs, *obs_shape), obs_dtype),
        ("final_obs", (num_envs, *obs_shape), obs_dtype),
        ("reward", (num_envs,), np.dtype(np.float64)),
        ("episode_return", (num_envs,), np.dtype(np.float64)),
        ("episode_length", (num_envs,), np.dtype(np.int64)),
        ("terminated", (num_envs,), np.dtype(bool)),
        ("truncated", (num_envs,), np.dtype(bool)),
        ("actions", (num_envs, *act_space.shape), act_space.dtype),
        ("cmd_ids", (num_envs,), np.dtype(np.int64)),
        ("ctrl", (num_workers, 4), np.dtype(np.int64)),
    ]


def _views(buf, layout) -> dict[str, np.ndarray]:
    # np.frombuffer holds a buffer export on the mapping, so the mapping cannot be unmapped
    # while any view (e.g. an observation batch the user kept) is alive: no dangling memory.
    base = np.frombuffer(buf, np.uint8)
    arrays, offset = {}, 0
    for name, shape, dtype in layout:
        offset = -(-offset // 64) * 64  # cache-line aligned, so workers never share a line
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        arrays[name] = base[offset:offset + n].view(dtype).reshape(shape)
        offset += n
    return arrays


def _nbytes(layout) -> int:
    total = 0
    for _, shape, dtype in layout:
        total = -(-total // 64) * 64 + int(np.prod(shape)) * np.dtype(dtype).itemsize
    return max(total, 1)


def _slots(a: dict[str, np.ndarray], lo: int, hi: int) -> Slots:
    return Slots(**{k: a[k][lo:hi] for k in ("obs", "reward", "terminated", "truncated",
                                             "episode_return", "episode_length", "final_obs")})


def _worker_main(w: int, lo: int, hi: int, shm_name: str, layout, factory_bytes: bytes,
                 mode: str, max_episode_steps: int | None, seeds: np.ndarray, go, done,
                 err_conn, err_read, parent_pid: int) -> None:
    # the read end came with the fork: were it held here, a send into a full pipe would block
    # for good once the pool's process is gone (no EPIPE while a reader exists)
    err_read.close()
    # Ctrl-C reaches the whole process group: the pool's process stops and closes its workers,
    # which must not die first (or print tracebacks) on the same signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # (a hangup too: the controller's to handle)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a handler the forking process set
    # attaching registers the name with the resource tracker the pool's process shares with its
    # workers (a set, so no double entry); the pool's process unlinks the block in close()
    shm = shared_memory.SharedMemory(name=shm_name)
    a = _views(shm.buf, layout)
    ctrl, cmd_ids, actions = a["ctrl"], a["cmd_ids"], a["actions"]
    try:
        env: BatchedEnv = cloudpickle.loads(factory_bytes)(list(range(lo, hi)))
        stepper = Stepper(env, _slots(a, lo, hi), AutoresetMode(mode), max_episode_steps, seeds)
    except BaseException:
        _report(w, ctrl, done, err_conn, list(range(lo, hi)))
        return
    ctrl[w, _SEQ] += 1
    done.release()
    while True:
        if not go.acquire(timeout=1.0):
            if os.getppid() != parent_pid:  # the pool's process is gone: do not linger
                break
            continue
        cmd, n = ctrl[w, _CMD], ctrl[w, _COUNT]
        if cmd == _CLOSE:
            break
        ids = cmd_ids[lo:lo + n] - lo
        try:
            if cmd == _STEP:
                stepper.step(ids, actions[lo:hi][ids])
            else:
                stepper.reset(ids)
        except BaseException:
            _report(w, ctrl, done, err_conn, (ids + lo).tolist())
            continue
        ctrl[w, _SEQ] += 1
        done.release()
    env.close()
    del stepper, a, ctrl, cmd_ids, actions
    shm.close()


def _report(w: int, ctrl: np.ndarray, done, err_conn, env_ids: list[int]) -> None:
    """A worker's failure, from its ``except`` block: mark the command done with an error,
    then send ``(env_ids, traceback)``. The pool reads the pipe once it sees the command done,
    so a traceback larger than the pipe's buffer (64 KiB) cannot block the send."""
    tb = traceback.format_exc()
    ctrl[w, _STATUS] = _ERROR
    ctrl[w, _SEQ] += 1
    done.release()
    err_conn.send((env_ids, tb))


class ProcessEngine(Engine):
    """``num_workers`` processes, each stepping a contiguous shard of the ``num_envs`` envs.

    Args:
        make_env: ``make_env(global_env_ids: list[int]) -> BatchedEnv`` for one shard; pickled
            with cloudpickle, so closures work.
        num_envs, num_workers: pool size and process count (``1 <= num_workers <= num_envs``).
        observation_space, action_space: single-env spaces (sizes the shared buffers).
        mode, max_episode_steps: see `Stepper`.
        seeds: ``(num_envs,)`` first-reset seed of each env.

    Raises:
        EnvWorkerError: a worker could not build its envs (carries the worker's traceback).
    """

    def __init__(self, make_env: Callable[[list[int]], BatchedEnv], num_envs: int,
                 num_workers: int, observation_space: gym.spaces.Space,
                 action_space: gym.spaces.Space, mode: AutoresetMode,
                 max_episode_steps: int | None, seeds: np.ndarray) -> None:
        self._closed = False
        self._error: str | None = None
        self._owner = os.getpid()  # the workers are this process's children
        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
        self._lo, self._hi = bounds[:-1], bounds[1:]
        self._worker_of = np.repeat(np.arange(num_workers), np.diff(bounds))
        self.num_workers = num_workers
        layout = _layout(num_envs, num_workers, observation_space, action_space)
        self._shm = blocks.create(_nbytes(layout))
        a = _views(self._shm.buf, layout)
        self._arrays = a
        self.slots = _slots(a, 0, num_envs)
        self._actions, self._cmd_ids, self._ctrl = a["actions"], a["cmd_ids"], a["ctrl"]
        # fork: workers start in milliseconds and need no `if __name__ == "__main__"` guard in
        # the user's script; a worker runs only env code, never the parent's threads (torch).
        ctx = mp.get_context("fork")
        self._done = ctx.Semaphore(0)
        self._go = [ctx.Semaphore(0) for _ in range(num_workers)]
        self._seq = np.zeros(num_workers, np.int64)
        self._busy = np.zeros(num_workers, bool)
        self._running: list[tuple[int, np.ndarray] | None] = [None] * num_workers
        self._pending: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(num_workers)]
        self._completed: collections.deque[np.ndarray] = collections.deque()
        self._resets_running = 0
        self._procs, self._err = [], []
        try:
            self._start_workers(make_env, layout, mode, max_episode_steps, seeds)
        except BaseException:  # a factory that does not pickle, a fork that fails, a worker
            self.close()  # whose envs do not build: no block or worker is left behind
            raise

    def _start_workers(self, make_env, layout, mode, max_episode_steps, seeds) -> None:
        num_workers = self.num_workers
        ctx = mp.get_context("fork")
        factory = cloudpickle.dumps(make_env)
        for w in range(num_workers):
            recv_conn, send_conn = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_worker_main, name=f"gmi-drl-env-worker-{w}", daemon=True,
                args=(w, int(self._lo[w]), int(self._hi[w]), self._shm.name, layout, factory,
                      AutoresetMode(mode).value, max_episode_steps,
                      np.asarray(seeds[self._lo[w]:self._hi[w]]), self._go[w], self._done,
                      send_conn, recv_conn, os.getpid()))
            self._err.append(recv_conn)
            try:
                p.start()
            finally:
                send_conn.close()
            self._procs.append(p)
        self._busy[:] = True
        self._running = [(_RESET, np.zeros(0, np.int64))] * num_workers  # the start-up
        self._resets_running = num_workers
        while self._resets_running:
            self._collect(block=True)

    # --- Engine API ----------------------------------------------------------------------------
    def send(self, ids: np.ndarray, actions: np.ndarray) -> None:
        self._raise_if_failed()
        self._actions[ids] = actions
        if self.num_workers == 1:
            self._submit(0, _STEP, ids)
            return
        owners = self._worker_of[ids]
        first, last = owners[0], owners[-1]
        if first == last and (owners == first).all():
            self._submit(int(first), _STEP, ids)
            return
        for w in np.unique(owners):
            self._submit(int(w), _STEP, ids[owners == w])

    def wait(self, min_count: int = 1) -> np.ndarray:
        self._raise_if_failed()
        while not self._completed:
            self._collect(block=True)
        return self._completed.popleft()

    def reset(self, ids: np.ndarray) -> None:
        self._raise_if_failed()
        owners = self._worker_of[ids]
        for w in np.unique(owners):
            self._submit(int(w), _RESET, ids[owners == w])
            self._resets_running += 1
        while self._resets_running:
            self._collect(block=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner:  # a forked child's copy: the workers are not its own
            return
        for w, p in enumerate(getattr(self, "_procs", [])):
            if p.is_alive():
                self._ctrl[w, _CMD] = _CLOSE
                self._go[w].release()
        for p in getattr(self, "_procs", []):
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        for conn in getattr(self, "_err", []):
            conn.close()
        self.slots = None
        self._arrays = self._actions = self._cmd_ids = self._ctrl = None
        self._shm.unlink()  # the name goes now; the mapping when the last view is released
        self._shm.close = lambda: None  # SharedMemory.__del__ would fail on live views

    # --- internals ------------------------------------------------------------------------------
    def _submit(self, w: int, cmd: int, ids: np.ndarray) -> None:
        if self._busy[w]:
            self._pending[w].append((cmd, ids))
        else:
            self._dispatch(w, cmd, ids)

    def _dispatch(self, w: int, cmd: int, ids: np.ndarray) -> None:
        lo = self._lo[w]
        self._cmd_ids[lo:lo + len(ids)] = ids
        self._ctrl[w, _CMD] = cmd
        self._ctrl[w, _COUNT] = len(ids)
        self._busy[w] = True
        self._running[w] = (cmd, ids)
        self._go[w].release()

    def _collect(self, block: bool) -> None:
        """Take every finished command; dispatch queued ones. Raises EnvWorkerError on failure."""
        if block:
            while not self._done.acquire(timeout=_POLL_S):
                self._check_alive()
        for w in np.flatnonzero(self._busy):
            if self._ctrl[w, _SEQ] == self._seq[w]:
                continue
            self._seq[w] += 1
            self._busy[w] = False
            cmd, ids = self._running[w]
            self._running[w] = None
            if self._ctrl[w, _STATUS] == _ERROR:
                try:
                    bad, tb = self._err[w].recv()
                except EOFError:  # it died between the two
                    bad, tb = f"{self._lo[w]}..{self._hi[w] - 1}", "(no traceback: it exited)"
                self._fail(f"env_id {bad} (worker {w}) raised {exception_line(tb)}:\n{tb}")
            if cmd == _STEP:
                self._completed.append(ids)
            else:
                self._resets_running -= 1
            if self._pending[w]:
                self._dispatch_pending(w)

    def _dispatch_pending(self, w: int) -> None:
        queue = self._pending[w]
        if queue[0][0] == _RESET:
            self._dispatch(w, *queue.pop(0))
            return
        steps = []
        while queue and queue[0][0] == _STEP:
            steps.append(queue.pop(0)[1])
        self._dispatch(w, _STEP, steps[0] if len(steps) == 1 else np.concatenate(steps))

    def _check_alive(self) -> None:
        for w, p in enumerate(self._procs):
            if p.exitcode is not None:
                code = p.exitcode
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                self._fail(f"env worker {w} (env_id {self._lo[w]}..{self._hi[w] - 1}) {how}")

    def _fail(self, message: str) -> None:
        # kept as text: a raised exception would hold this engine's frames (a reference cycle
        # that outlives the last reference to a pool never closed, with its workers and memory)
        self._error = message + "\nThe pool cannot continue; close() it."
        raise EnvWorkerError(self._error)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise EnvWorkerError(self._error)
        if os.getpid() != self._owner:
            raise RuntimeError(f"this pool's env workers belong to process {self._owner}, and "
                               "a forked child of it cannot step them (it would step the "
                               "parent's envs): make a new pool in the child")
