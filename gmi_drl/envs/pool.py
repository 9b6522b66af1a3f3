"""`EnvPool`: the batched environment API (EnvPool's `send`/`recv`, full or partial batches).

Source: the EnvPool paper: actions go out with the ids of the envs they
are for (`send`), and `recv` returns the first ``env_batch_size`` envs to finish, so the caller
overlaps inference with simulation. ``env_batch_size == num_envs`` is the synchronous case.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import threading
import traceback
from typing import Any

import gymnasium as gym
import numpy as np

from gmi_drl.envs import xla as envs_xla
from gmi_drl.envs.engine import Engine, EnvWorkerError
from gmi_drl.envs.spec import AutoresetMode, EnvSpec
from gmi_drl.envs.stepper import EpisodeEndedError

StepReturn = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class EnvPool:
    """``num_envs`` sub-environments of one task behind one batched API.

    Made by `gmi_drl.envs.make`. Outputs of `recv`, `step` and `reset` are views into buffers the
    pool preallocates and reuses: they stay valid until the next `send`/`recv`/`step`/`reset`
    call on this pool (copy them to keep them longer). With ``env_batch_size == num_envs`` the
    arrays are the per-env state buffers themselves, in env id order (no copy at all), and the
    native engines write an env's next result into them as soon as it is sent: copy ``obs``
    before `send` if it must outlive it.

    Threads: one thread may `send` while another `recv`s (EnvPool's contract; the bookkeeping
    is under one lock, and engines with ``concurrent_send`` wait without it, so sends go on
    while `recv` blocks); `recv` still needs ``env_batch_size`` envs sent when it is called,
    and ``info["env_id"]`` handed to the sending thread must be copied first (it is the
    receiving thread's reused buffer). `recv` runs in one thread at a time (the native cores
    refuse a second).

    Returned by `recv`/`step`: ``obs (env_batch_size, *obs_shape)`` in the observation space's
    dtype, ``rewards (env_batch_size,) float64``, ``terminated``/``truncated (env_batch_size,)
    bool`` and ``info`` with ``env_id (env_batch_size,) int64``, ``episode_return (..,) float64``
    and ``episode_length (..,) int64`` (totals of the current episode including this step; the
    finished episode's totals where ``episode_end``), ``episode_end (..,) bool`` (the episode
    those totals count ended: ``terminated | truncated``, except for Atari with episodic life,
    where a lost life terminates the learner's episode but only game over ends the game's), in
    ``same_step`` mode ``final_obs`` (rows valid where the episode ended), and any per-env extras
    of the engine (Atari: ``lives``).
    """

    def __init__(self, spec: EnvSpec, engine: Engine, num_envs: int, env_batch_size: int,
                 autoreset: AutoresetMode) -> None:
        self.spec = spec
        self.observation_space: gym.spaces.Space = spec.observation_space
        self.action_space: gym.spaces.Space = spec.action_space
        self.num_envs = num_envs
        self.env_batch_size = env_batch_size
        self.autoreset = AutoresetMode(autoreset)
        self._engine = engine
        self._slots = engine.slots
        self._all_ids = np.arange(num_envs, dtype=np.int64)
        self._all_ids.flags.writeable = False  # handed out as info["env_id"]
        self._in_flight = np.zeros(num_envs, bool)
        self._num_in_flight = 0
        self._recv_ids_sent = True  # no recv yet
        self._ended = np.zeros(num_envs, bool)  # autoreset disabled: ended, awaiting reset()
        self._ready: collections.deque[np.ndarray] = collections.deque()
        self._num_ready = 0
        self._closed = False
        # an engine failure poisons the pool; kept and raised as copies without a traceback:
        # one would hold this pool's frames, a cycle that keeps workers and shared memory alive
        # after the last reference to a pool that was never closed
        self._failure: BaseException | None = None
        self._unreset = np.ones(num_envs, bool)  # envs never reset: no state to step yet
        self._num_unreset = num_envs
        self._init_action_checks()
        s, b = self._slots, env_batch_size
        self._out = {
            "obs": np.zeros((b, *s.obs.shape[1:]), s.obs.dtype),
            "reward": np.zeros(b, s.reward.dtype),
            "terminated": np.zeros(b, bool),
            "truncated": np.zeros(b, bool),
            "episode_return": np.zeros(b, s.episode_return.dtype),
            "episode_length": np.zeros(b, s.episode_length.dtype),
            "final_obs": np.zeros((b, *s.obs.shape[1:]), s.obs.dtype),
            "env_id": np.zeros(b, np.int64),
            "episode_end": np.zeros(b, bool),
        }
        self._extra = dict(engine.extra_info)
        self._extra_out = {k: np.zeros((b, *v.shape[1:]), v.dtype) for k, v in self._extra.items()}
        # recv hands out a read-only view of env ids; sending it back skips re-validation
        self._env_id_out = self._out["env_id"].view()
        self._env_id_out.flags.writeable = False
        self._lock = threading.Lock()
        # where the engine cannot send during its wait, recv holds the lock while it waits
        self._wait_lock = (contextlib.nullcontext() if engine.concurrent_send
                           else self._lock)

    @property
    def partial_batch(self) -> bool:
        """``env_batch_size < num_envs``: each `recv` returns the first envs to finish (EnvPool's
        "asynchronous" mode; gmi-drl keeps "async" for the decoupled training template)."""
        return self.env_batch_size < self.num_envs

    # --- public API -----------------------------------------------------------------------------
    def reset(self, env_id: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset ``env_id`` (default: all envs) and return ``(obs (n, *obs_shape), info)``.

        Blocks until every given env has its first observation. ``info["env_id"]`` lists the ids
        in the order of ``obs``.

        Raises:
            ValueError: an id is out of range, repeated, or has a step in flight.
            RuntimeError: the pool is closed. EnvWorkerError: an env raised or its worker died
                (this call or before: the pool is then unusable).
        """
        with self._lock:
            return self._reset(env_id)

    def _reset(self, env_id: Any) -> tuple[np.ndarray, dict[str, Any]]:
        self._check_open()
        ids = self._check_ids(env_id)
        if self._in_flight[ids].any():
            raise ValueError(f"env_id {ids[self._in_flight[ids]].tolist()} has a step in flight; "
                             "recv() its result before resetting it")
        self._in_process(self._engine.reset, ids, "reset")
        self._ended[ids] = False
        if self._num_unreset:
            self._unreset[ids] = False
            self._num_unreset = int(np.count_nonzero(self._unreset))
        s = self._slots
        if ids is self._all_ids:
            return s.obs, {"env_id": ids}
        return s.obs[ids], {"env_id": ids}

    def send(self, actions: np.ndarray, env_id: Any = None) -> None:
        """Send ``actions (n, *action_shape)`` to the envs ``env_id (n,)`` (default: all envs).

        Returns at once; results come from `recv`. Nothing is sent when validation fails.

        Raises:
            ValueError: wrong action shape, dtype or range; unknown, repeated or in-flight env ids;
                with autoreset ``disabled``, an env whose episode ended (`EpisodeEndedError`).
            gymnasium.error.ResetNeeded: an env never reset.
            RuntimeError: the pool is closed. EnvWorkerError: an env raised or its worker died
                (with ``num_workers=0`` the step runs in this call; the pool is then unusable).
        """
        with self._lock:
            self._send(actions, env_id)

    def _send(self, actions: np.ndarray, env_id: Any) -> None:
        self._check_open()
        if env_id is self._env_id_out and not self._recv_ids_sent:
            # ids of our last recv: valid and not in flight; copy (the buffer is reused)
            ids = self._out["env_id"].copy()
            self._recv_ids_sent = True
        else:
            self._recv_ids_sent = True  # (any other send may overlap the last recv's ids)
            ids = self._check_ids(env_id)
            if self._num_in_flight and np.count_nonzero(self._in_flight[ids]):
                raise ValueError(f"env_id {ids[self._in_flight[ids]].tolist()} already has a "
                                 "step in flight; recv() its result before sending it another "
                                 "action")
        if self._num_unreset and np.count_nonzero(self._unreset[ids]):
            raise gym.error.ResetNeeded(
                f"env_id {ids[self._unreset[ids]].tolist()} never reset: call reset() before "
                "stepping them")
        if self.autoreset is AutoresetMode.DISABLED and self._ended[ids].any():
            raise EpisodeEndedError(
                f"env_id {ids[self._ended[ids]].tolist()}: episode ended and autoreset is "
                "disabled; call reset(env_id=...) for them before stepping")
        actions = self._check_actions(actions, len(ids))
        self._in_flight[ids] = True
        self._num_in_flight += len(ids)
        self._in_process(self._engine.send, ids, "step", actions)

    def _in_process(self, call, ids: np.ndarray, what: str, *args) -> None:
        """``call(ids, *args)`` of the engine; where the envs run in this process, an env
        that raises poisons the pool as a failed worker does (its state is partly stepped)."""
        try:
            call(ids, *args)
        except EnvWorkerError as e:  # a worker's own report
            self._failure = _detached(e)
            raise
        except Exception as e:
            failure = EnvWorkerError(
                f"env_id {ids.tolist()}: an env raised in {what} (in this process): "
                f"{type(e).__name__}: {e}\n{traceback.format_exc()}The pool cannot continue; "
                "close() it.")
            self._failure = _detached(failure)
            raise failure from e

    def recv(self) -> StepReturn:
        """Return the first ``env_batch_size`` envs to finish: ``(obs, rewards, terminated,
        truncated, info)``; see the class docstring for shapes. Blocks until that many finished.

        Raises:
            RuntimeError: fewer than ``env_batch_size`` envs are in flight (would wait forever),
                or a worker failed (names the env ids and carries the original traceback).
        """
        b = self.env_batch_size
        with self._lock:
            self._check_open()
            if self._num_in_flight < b:  # finished-but-not-returned envs count as in flight
                raise RuntimeError(
                    f"recv() needs {b} envs in flight or finished, but only "
                    f"{self._num_in_flight} are; send() actions for more envs first")
        with self._wait_lock:  # (the ready queue is recv's own: one recv at a time)
            while self._num_ready < b:
                try:
                    done = self._engine.wait(b - self._num_ready)
                except RuntimeError as e:
                    self._failure = _detached(e)
                    raise
                self._ready.append(done)
                self._num_ready += len(done)
        with self._lock:
            ids = self._take_ready(b)
            self._in_flight[ids] = False
            self._num_in_flight -= b
            self._recv_ids_sent = False
            out = self._gather(ids)
            if self.autoreset is AutoresetMode.DISABLED:
                self._ended[out[4]["env_id"]] = out[2] | out[3]
            return out

    def step(self, actions: np.ndarray, env_id: Any = None) -> StepReturn:
        """`send` then `recv`. With partial batches the batch returned may hold other envs than
        sent.

        Raises:
            ValueError: what `send` refuses, or ``env_id`` too few to complete a batch of
                ``env_batch_size`` with the envs already in flight (nothing is sent).
        """
        if env_id is not None:
            n = np.size(env_id)
            if self._num_in_flight + n < self.env_batch_size:
                raise ValueError(
                    f"step() of {n} env(s) with {self._num_in_flight} in flight cannot return a "
                    f"batch of {self.env_batch_size}: pass more env ids, or use send() and "
                    "recv()")
        self.send(actions, env_id)
        return self.recv()

    def xla(self) -> envs_xla.XlaFunctions:
        """EnvPool's XLA interface: ``handle, recv, send, step``, JAX functions that step this
        pool inside ``jax.jit`` (CPU backend); see `gmi_drl.envs.xla.xla`.

        Raises:
            ImportError: jax (the ``jax`` extra) is not installed, or ``gmi_drl.envs._xla_ffi``
                is not built (the message says how to build it).
        """
        return envs_xla.xla(self, getattr(self, "_extra", {}))

    def check_limits(self) -> None:
        """Nothing to check: a CPU engine has no fixed per-env buffers that can overflow (the
        warp engine's contact limits are checked by its own `check_limits`)."""

    def close(self) -> None:
        """Stop every worker and free all shared memory. Idempotent."""
        if not self._closed:
            self._closed = True
            self._engine.close()

    def __reduce__(self):
        raise TypeError(f"{self!r} cannot be copied or pickled: its envs step in worker threads "
                        "or processes over shared memory; make another with "
                        "gmi_drl.envs.make(...)")

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"EnvPool({self.spec.task_id!r}, num_envs={self.num_envs}, "
                f"env_batch_size={self.env_batch_size}, autoreset={self.autoreset.value!r})")

    # --- internals ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._failure is not None:
            raise _detached(self._failure)

    def _take_ready(self, n: int) -> np.ndarray:
        """The next ``n`` ready ids: a whole chunk as the engine returned it, or else the
        chunks' ids written straight into the batch's ``env_id`` buffer (no temporary)."""
        ready = self._ready
        self._num_ready -= n
        if len(ready[0]) == n:
            return ready.popleft()
        out, filled = self._out["env_id"], 0
        while filled < n:
            head = ready[0]
            take = min(len(head), n - filled)
            out[filled:filled + take] = head[:take]
            filled += take
            if take == len(head):
                ready.popleft()
            else:
                ready[0] = head[take:]
        return out

    def _gather(self, ids: np.ndarray) -> StepReturn:
        s = self._slots
        if len(ids) == self.num_envs:  # synchronous: the state buffers themselves, in id order
            end = self._engine.episode_end
            if end is None:
                end = np.logical_or(s.terminated, s.truncated, out=self._out["episode_end"])
            info = {"env_id": self._all_ids, "episode_return": s.episode_return,
                    "episode_length": s.episode_length, "episode_end": end, **self._extra}
            if self.autoreset is AutoresetMode.SAME_STEP:
                info["final_obs"] = s.final_obs
            return s.obs, s.reward, s.terminated, s.truncated, info
        o = self._out
        if ids is not o["env_id"]:
            o["env_id"][:] = ids
        s.obs.take(ids, axis=0, out=o["obs"])
        s.reward.take(ids, out=o["reward"])
        s.terminated.take(ids, out=o["terminated"])
        s.truncated.take(ids, out=o["truncated"])
        s.episode_return.take(ids, out=o["episode_return"])
        s.episode_length.take(ids, out=o["episode_length"])
        end = self._engine.episode_end
        if end is None:
            np.logical_or(o["terminated"], o["truncated"], out=o["episode_end"])
        else:
            end.take(ids, out=o["episode_end"])
        info = {"env_id": self._env_id_out, "episode_return": o["episode_return"],
                "episode_length": o["episode_length"], "episode_end": o["episode_end"]}
        for k, v in self._extra.items():
            info[k] = v.take(ids, axis=0, out=self._extra_out[k])
        if self.autoreset is AutoresetMode.SAME_STEP:
            s.final_obs.take(ids, axis=0, out=o["final_obs"])
            info["final_obs"] = o["final_obs"]
        return o["obs"], o["reward"], o["terminated"], o["truncated"], info

    def _check_ids(self, env_id: Any) -> np.ndarray:
        if env_id is None:
            return self._all_ids
        ids = np.asarray(env_id)
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or len(ids) == 0:
            raise ValueError(f"env_id must be a non-empty 1-d array of ints, got {env_id!r}")
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(f"env_id {ids.tolist()} out of range [0, {self.num_envs})")
        ids = ids.astype(np.int64)  # a private copy: the caller may reuse its array
        if len(ids) > 1 and np.bincount(ids).max() > 1:
            raise ValueError(f"env_id {ids.tolist()} repeats an id")
        return ids

    def _init_action_checks(self) -> None:
        space = self.action_space
        self._discrete_from_0 = isinstance(space, gym.spaces.Discrete) and int(space.start) == 0
        if isinstance(space, gym.spaces.Discrete):
            self._act_shape, self._act_kind = (), "iu"
            self._act_low, self._act_high = int(space.start), int(space.start + space.n - 1)
        elif isinstance(space, gym.spaces.Box):  # ints fit a float Box too, as in Gymnasium
            integer = np.issubdtype(space.dtype, np.integer)
            self._act_shape, self._act_kind = space.shape, "iu" if integer else "fiu"
            self._act_low, self._act_high = space.low, space.high
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self._act_shape, self._act_kind = space.shape, "iu"
            self._act_low, self._act_high = space.start, space.start + space.nvec - 1
        else:
            raise ValueError(f"unsupported action space {space}")

    def _check_actions(self, actions: Any, n: int) -> np.ndarray:
        a = np.asarray(actions)
        if a.shape != (n, *self._act_shape):
            raise ValueError(f"actions have shape {a.shape}, expected {(n, *self._act_shape)} "
                             f"(one action of shape {self._act_shape} per env_id)")
        if a.dtype.kind not in self._act_kind:
            want = "an integer" if self._act_kind == "iu" else "a floating-point or integer"
            raise ValueError(f"actions have dtype {a.dtype}, expected {want} dtype for "
                             f"{self.action_space}")
        if self._act_kind == "fiu" and a.dtype.kind != "f":
            a = a.astype(self.action_space.dtype)
        if self._discrete_from_0 and a.dtype == np.int64:
            in_range = not np.count_nonzero(a.view(np.uint64) > self._act_high)  # negatives wrap
        else:
            in_range = bool(np.all((a >= self._act_low) & (a <= self._act_high)))  # NaN fails
        if not in_range:
            raise ValueError(f"actions outside the action space {self.action_space} "
                             f"(min {a.min()}, max {a.max()}; NaN counts as outside); "
                             "clip them to the space first")
        return a


def _detached(e: BaseException) -> BaseException:
    """A copy of ``e`` without its traceback, cause or context (which hold the frames, and so
    the pool, that raised it); a ``RuntimeError`` of its text where ``e`` does not copy."""
    try:
        return copy.copy(e)
    except Exception:  # noqa: BLE001 - an exception class whose arguments do not rebuild it
        return RuntimeError(f"{type(e).__name__}: {e}")
