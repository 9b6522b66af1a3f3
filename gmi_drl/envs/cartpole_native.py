"""CartPole-v1 as a whole pool in C++: EnvPool's API with no Python per call but the binding.

A CartPole step costs nanoseconds, so a pool of it is bound by the bookkeeping around the step
(env ids, action checks, episode statistics, batch assembly), which the Python `EnvPool` does in
Python on every ``send`` + ``recv``. Here ``reset``/``send``/``recv``/``step`` are the methods of the
native ``gmi_drl.envs._cartpole_pool.CartPolePool`` (``csrc/cartpole_pool.cpp``), with the same
contract, errors and messages as `EnvPool` (the EnvPool paper, §3: a C++
core behind a thin binding). It steps in the caller's thread: a hand-off to another thread costs
more than the step.

Python keeps each env's ``np.random.Generator`` (Gymnasium's ``seeding.np_random``): the core asks
for an env's reset states in blocks of `DRAW_BLOCK`, drawn in one call as ``uniform(-0.05,
0.05, (DRAW_BLOCK, 4))`` (the same stream as that many ``reset`` calls), so trajectories equal
Gymnasium's step for step (``tests/envs/test_cartpole_native.py``). This is CartPole-v1's
``native`` engine; ``engine="numpy"`` selects the vectorised NumPy task in the Python pool
(`gmi_drl.envs.classic_control.CartPole`), which ``"auto"`` also takes where the core is not
built.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from gmi_drl.envs import classic_control
from gmi_drl.envs.factories import EngineEntry, PoolRequest
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.spec import AutoresetMode, EnvGenerators, EnvSpec, env_seeds
from gmi_drl.envs.stepper import EpisodeEndedError

try:
    from gmi_drl.envs import _cartpole_pool
except ImportError as e:  # not built (no compiler at install time)
    _cartpole_pool = None
    UNAVAILABLE = f"the native core gmi_drl.envs._cartpole_pool is not built ({e})"
else:
    UNAVAILABLE = None

TASK_ID = "CartPole-v1"
MAX_EPISODE_STEPS = 500
DRAW_BLOCK = 64
_MODES = {AutoresetMode.NEXT_STEP: 0, AutoresetMode.SAME_STEP: 1, AutoresetMode.DISABLED: 2}


class CartPoleNativePool(EnvPool):
    """`EnvPool` of CartPole-v1 whose methods run in C++; same API, outputs and errors.

    Outputs: ``obs (env_batch_size, 4) float32``, ``rewards float64``, ``terminated``/
    ``truncated bool``, ``info`` with ``env_id`` (read-only), ``episode_return``,
    ``episode_length``, ``episode_end`` (and ``final_obs`` in ``same_step`` mode); views valid
    until the next ``reset``/``recv``/``step`` call, as in `EnvPool`.

    Args:
        num_envs, env_batch_size, autoreset: as `gmi_drl.envs.make`. seeds: each env's first
            seed, or an int ``s`` for ``s + i`` (`gmi_drl.envs.spec.env_seeds`).
        sutton_barto_reward: as the Gymnasium constructor argument.
    """

    def __init__(self, num_envs: int, env_batch_size: int, seeds, autoreset: AutoresetMode,
                 sutton_barto_reward: bool = False) -> None:
        if UNAVAILABLE is not None:
            raise ValueError(f"engine='native' cannot run: {UNAVAILABLE}")
        probe = classic_control.CartPole(1)
        self.spec = EnvSpec(TASK_ID, probe.observation_space, probe.action_space,
                            MAX_EPISODE_STEPS)
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        self.num_envs, self.env_batch_size = num_envs, env_batch_size
        self.autoreset = AutoresetMode(autoreset)
        self._pending_seeds: list[int | None] = env_seeds(seeds, num_envs).tolist()
        self._rngs = EnvGenerators(num_envs)
        self._closed = False
        self._core = _cartpole_pool.CartPolePool(
            num_envs, env_batch_size, _MODES[self.autoreset], MAX_EPISODE_STEPS,
            bool(sutton_barto_reward), self._draw, EpisodeEndedError)
        self.recv = self._core.recv
        # until every env was reset, Python guards refuse to step; then the bound C++ methods
        # themselves: no Python frame per call
        self._unreset = np.ones(num_envs, bool)
        self.reset, self.send, self.step = self._first_reset, self._unreset_send, self._unreset_step

    def _first_reset(self, env_id: Any = None):
        out = self._core.reset(env_id)
        self._unreset[out[1]["env_id"]] = False
        if not self._unreset.any():
            self.reset, self.send = self._core.reset, self._core.send
            self.step = self._core.step
        return out

    def _refuse_unreset(self, env_id: Any) -> None:
        if self._closed:
            raise RuntimeError(f"the {self.spec.task_id} pool is closed")
        ids = np.arange(self.num_envs) if env_id is None else np.asarray(env_id).reshape(-1)
        if ids.dtype.kind in "iu" and len(ids) and 0 <= ids.min() and ids.max() < self.num_envs:
            never = ids[self._unreset[ids]]
            if len(never):
                raise gym.error.ResetNeeded(f"env_id {never.tolist()} never reset: call reset() "
                                            "before stepping them")

    def _unreset_send(self, actions, env_id: Any = None) -> None:
        self._refuse_unreset(env_id)
        self._core.send(actions, env_id)

    def _unreset_step(self, actions, env_id: Any = None):
        self._refuse_unreset(env_id)
        return self._core.step(actions, env_id)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.close()

    def get_state(self, env_id: int) -> np.ndarray:
        """Env ``env_id``'s state ``[x, x_dot, theta, theta_dot] (4,) float64`` (a copy)."""
        return self._core.get_state(env_id)

    def _draw(self, i: int) -> np.ndarray:
        """The next `DRAW_BLOCK` reset states of env ``i``, ``(DRAW_BLOCK, 4) float64``."""
        rng = self._rngs(i, self._pending_seeds[i])
        self._pending_seeds[i] = None
        return rng.uniform(low=-0.05, high=0.05, size=(DRAW_BLOCK, 4))


def _native_pool(request: PoolRequest, **kwargs: Any) -> CartPoleNativePool:
    """The ``native`` engine's pool. ``kwargs``: ``sutton_barto_reward`` (Gymnasium's keyword).

    Raises:
        ValueError: an unknown keyword.
    """
    kwargs.pop("max_episode_steps", None)  # (None or its own 500: `_unavailable` saw to it)
    unknown = set(kwargs) - {"sutton_barto_reward"}
    if unknown:
        raise ValueError(f"unknown CartPole-v1 keyword(s) {sorted(unknown)}")
    return CartPoleNativePool(request.num_envs, request.env_batch_size, request.seeds,
                              request.autoreset, **kwargs)


def engines() -> dict[str, dict[str, EngineEntry]]:
    """CartPole-v1's ``native`` engine (the registry's table: task id -> engine name ->
    `EngineEntry`); its ``numpy`` engine is `gmi_drl.envs.classic_control`'s."""
    return {TASK_ID: {"native": EngineEntry(_native_pool, unavailable=_unavailable)}}


def _unavailable(kwargs: dict[str, Any]) -> str | None:
    if UNAVAILABLE is None and kwargs.get("max_episode_steps") not in (None,
                                                                      MAX_EPISODE_STEPS):
        return "its core has CartPole-v1's 500-step limit built in (max_episode_steps)"
    return UNAVAILABLE