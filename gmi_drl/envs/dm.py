"""A ``dm_env`` face over one gmi-drl pool: batched `dm_env.TimeStep` s, as EnvPool's
``env_type="dm"`` gives DeepMind-style agents (Acme, dm-control users).

    env = gmi_drl.envs.make_dm("Hopper-v5", num_envs=8, seed=0)
    ts = env.reset()                 # step_type (8,) FIRST, reward (8,) 0, discount (8,) 1
    ts = env.step(actions)           # actions (8, 3); ts.observation (8, 11) float64

Semantics (EnvPool's dm envs, next-step autoreset): a step that ends an env's episode is
``LAST``, with discount 0 where the episode terminated and 1 where it was truncated (a time
limit: the value of the state still counts); that env's next step ignores its action and
returns ``FIRST`` with reward 0, discount 1 and the new episode's first observation; every other
step is ``MID`` with discount 1. Rewards and discounts are float32, observations the pool's
dtype, step types uint8 (`dm_env.StepType`'s values). Env ``i`` is seeded ``seed + i``, as on the
Gymnasium face, so both faces give the same episodes for one seed (tested step for step). Box
actions outside the action spec are clipped to it, as on the Gymnasium face. The specs
(`observation_spec`, `action_spec`) are one env's, as EnvPool's. Over a pool of torch tensors the
outputs are copied to NumPy. The warp engine, which runs same-step autoreset only, has no dm face.

Needs the optional package ``dm-env`` (``pip install 'gmi-drl[dm]'``).
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from gmi_drl.envs.faces import OWNED_BY_EVERY_FACE, check_face_args, face_seeds, host_outputs

_OWNED = {"autoreset": "the dm face steps in EnvPool's next-step mode (LAST, then FIRST)",
          **OWNED_BY_EVERY_FACE}


def _dm_env():
    try:
        import dm_env
    except ImportError:
        raise ImportError("the dm_env face needs the dm-env package: pip install dm-env (or "
                          "pip install -e '.[dm]' in the checkout)") from None
    # a virtual subclass: DmEnv is a dm_env.Environment to isinstance, while dm-env stays an
    # optional import (the class is defined without it)
    dm_env.Environment.register(DmEnv)
    return dm_env


def make_dm(task_id: str, num_envs: int, seed: int | Sequence[int] | None = None,
            num_workers: int | None = None, copy: bool = True, **task_kwargs: Any):
    """``num_envs`` envs of ``task_id`` as one batched `dm_env.Environment` (`DmEnv`).

    Raises:
        ImportError: dm-env is not installed. ValueError: as `DmEnv`.
    """
    return DmEnv(task_id, num_envs, seed, num_workers, copy, **task_kwargs)


class DmEnv:
    """A batched `dm_env.Environment` over one pool (module docstring).

    Args:
        task_id: as `gmi_drl.envs.make`. num_envs: envs of the batch.
        seed: an int ``s`` (env ``i`` gets ``s + i``), one per env, or ``None`` (random).
        num_workers: as `gmi_drl.envs.make`.
        copy: return new arrays (True) or the pool's buffers, valid until the next call.
        **task_kwargs: the task's keyword arguments (``max_episode_steps``, ``engine``, ...).

    Raises:
        ValueError: an invalid ``num_envs`` or seed, an unknown task or keyword, a keyword the
            face sets itself (``autoreset``, ``env_batch_size``), or a task whose engine runs
            same-step autoreset only (the warp engine).
    """

    def __init__(self, task_id: str, num_envs: int, seed: int | Sequence[int] | None = None,
                 num_workers: int | None = None, copy: bool = True, **task_kwargs: Any) -> None:
        from gmi_drl.envs.registry import make

        self._dm = dm = _dm_env()
        check_face_args("dm_env face", num_envs, task_kwargs, _OWNED)
        try:
            self.pool = make(task_id, num_envs, num_workers=num_workers,
                             seed=face_seeds(seed, num_envs), autoreset="next_step",
                             **task_kwargs)
        except ValueError as e:
            if "autoreset=" not in str(e):
                raise
            raise ValueError(f"{e}: the dm_env face needs next-step autoreset (LAST, then "
                             "FIRST), which this engine does not run") from None
        self.num_envs, self.copy = num_envs, copy
        self._host = host_outputs(self.pool)
        space = self.pool.action_space
        self._clip = (space.low, space.high, space.dtype) if isinstance(space, gym.spaces.Box) \
            else None
        self._ended = np.zeros(num_envs, bool)  # the env's last step was LAST: this one is FIRST
        self._fresh = True
        self._first = np.full(num_envs, dm.StepType.FIRST, np.uint8)
        self._zeros = np.zeros(num_envs, np.float32)
        self._ones = np.ones(num_envs, np.float32)
        self._obs_spec = _spec(dm, self.pool.observation_space, "observation")
        self._act_spec = _spec(dm, space, "action")

    def reset(self):
        """Reset every env: a `dm_env.TimeStep` of ``FIRST`` s, reward 0, discount 1 and
        ``observation (num_envs, *obs_shape)``."""
        obs, _ = self._host(self.pool.reset())
        self._ended[:] = False
        self._fresh = False
        return self._dm.TimeStep(self._first.copy(), self._zeros.copy(), self._ones.copy(),
                                 self._out(obs))

    def step(self, action):
        """One step of every env with ``action (num_envs, *action_shape)``; a `dm_env.TimeStep`
        of ``(num_envs,)`` step types, rewards, discounts and the observations (module doc).

        Raises:
            RuntimeError: ``step`` before ``reset``. ValueError: actions of another shape.
        """
        if self._fresh:
            raise RuntimeError("step() before reset(): call reset() first")
        a = np.asarray(action)
        if self._clip is not None and a.dtype.kind in "fiu":
            low, high, dtype = self._clip
            a = np.clip(a, low, high).astype(dtype, copy=False)
        obs, reward, terminated, truncated, _ = self._host(self.pool.step(a))
        dm = self._dm
        ended = terminated | truncated
        step_type = np.where(ended, dm.StepType.LAST, dm.StepType.MID).astype(np.uint8)
        step_type[self._ended] = dm.StepType.FIRST
        discount = np.where(terminated, 0.0, 1.0).astype(np.float32)
        self._ended[:] = ended
        return dm.TimeStep(step_type, reward.astype(np.float32), discount, self._out(obs))

    def _out(self, obs: np.ndarray) -> np.ndarray:
        return obs.copy() if self.copy else obs

    def observation_spec(self):
        """One env's observation: a `dm_env.specs.BoundedArray` (or ``Array`` where the space
        is unbounded) of its shape and dtype."""
        return self._obs_spec

    def action_spec(self):
        """One env's action: a `dm_env.specs.BoundedArray` (Box) or ``DiscreteArray``."""
        return self._act_spec

    def reward_spec(self):
        """One env's reward: a float32 scalar."""
        return self._dm.specs.Array((), np.float32, "reward")

    def discount_spec(self):
        """One env's discount: a float32 scalar in [0, 1]."""
        return self._dm.specs.BoundedArray((), np.float32, 0.0, 1.0, "discount")

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "DmEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DmEnv({self.pool.spec.task_id}, num_envs={self.num_envs})"


def _spec(dm, space: gym.spaces.Space, name: str):
    """The `dm_env.specs` of one env's Gymnasium ``space``.

    Raises:
        ValueError: a space other than Box or Discrete.
    """
    if isinstance(space, gym.spaces.Discrete):
        return dm.specs.DiscreteArray(int(space.n), np.int64, name)
    if isinstance(space, gym.spaces.Box):
        if np.isfinite(space.low).all() and np.isfinite(space.high).all():
            return dm.specs.BoundedArray(space.shape, space.dtype, space.low, space.high, name)
        return dm.specs.Array(space.shape, space.dtype, name)
    raise ValueError(f"the dm_env face has no spec for {space}")
