"""A Stable-Baselines3 ``VecEnv`` face over one gmi-drl pool (needs ``stable-baselines3``).

    from stable_baselines3 import PPO
    from gmi_drl.envs.sb3 import make_vec_env

    model = PPO("MlpPolicy", make_vec_env("Hopper-v5", n_envs=8, seed=1)).learn(1_000_000)

`step_async` sends the actions of every env to the pool and `step_wait` receives them, so the
engine steps while SB3 waits (SB3's ``SubprocVecEnv`` contract, one process instead of one per
env). The conventions are SB3's (as ``DummyVecEnv`` over ``Monitor``-wrapped envs): ``dones =
terminated | truncated``, the pool resets an ended env in the same step and the ended episode's
last observation is ``infos[i]["terminal_observation"]``, ``infos[i]["TimeLimit.truncated"]``
says a time limit cut it, ``infos[i]["episode"]`` (``r``, ``l``, ``t``: return, length, seconds
since this VecEnv started) marks an ended episode as ``Monitor`` does, rewards are float32.
Actions must lie in the action space (SB3's algorithms clip or squash them into it before they
step): the pool refuses others with a message, where a Gymnasium env might clamp them itself.
Observations, rewards and dones equal ``DummyVecEnv``'s step for step on the same seeds.
``env_is_wrapped(Monitor)`` is True, so SB3's ``evaluate_policy`` counts whole episodes (on
Atari whole games, not lives) from ``infos[i]["episode"]``; a ``VecMonitor`` over this face
would count lives instead. Returned observations are copies (SB3 keeps them across steps);
``reset`` after ``seed(s)`` builds the pool anew (engines take seeds at construction; a seed the
engine refuses raises and leaves the old pool in use); ``step`` before any ``reset`` raises, as
``Monitor`` does; ``env_method`` / ``set_attr`` have no per-env Python object to reach and
raise. Over a pool of torch tensors (the warp engine on CUDA, or ``tensors=True``) every output is
copied to NumPy on the host.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices

from gmi_drl.envs.faces import (OWNED_BY_EVERY_FACE, check_face_args, face_seeds, host_outputs,
                                rebuild)
from gmi_drl.envs.spec import env_seeds, random_seed

_OWNED = {"autoreset": "an SB3 VecEnv resets an ended env in the same step (its last observation "
                       "in infos[i]['terminal_observation'])", **OWNED_BY_EVERY_FACE}


class GmiVecEnv(VecEnv):
    """``num_envs`` envs of ``task_id`` as a ``stable_baselines3`` ``VecEnv`` (module docstring).

    Args:
        task_id: as `gmi_drl.envs.make`. num_envs: sub-environments.
        num_workers: as `gmi_drl.envs.make`.
        seed: seeds of the pool's first reset (``seed + i``); ``None``: random ones.
        **task_kwargs: the task's keyword arguments (also ``device`` and ``engine``).

    Raises:
        ValueError: an invalid ``num_envs``; an unknown task or keyword (from
            `gmi_drl.envs.make`); a `make` keyword the face sets itself (``autoreset``,
            ``env_batch_size``: the message says what to use instead).
    """

    def __init__(self, task_id: str, num_envs: int, num_workers: int | None = None,
                 seed: int | None = None, **task_kwargs: Any) -> None:
        from gmi_drl.envs.registry import make

        check_face_args("Stable-Baselines3 face", num_envs, task_kwargs, _OWNED)
        self._make = lambda seeds: make(task_id, num_envs, num_workers=num_workers, seed=seeds,
                                        autoreset="same_step", **task_kwargs)
        self._pool_seeds = face_seeds(seed, num_envs)
        self.pool = self._make(self._pool_seeds)
        self._host = host_outputs(self.pool)
        self._fresh = True  # no reset yet: the pool is the first one, and step must wait
        super().__init__(num_envs, self.pool.observation_space, self.pool.action_space)
        self._t_start = time.time()

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seeds ``seed + i`` for the next `reset` (a random base when ``None``)."""
        return super().seed(random_seed(self.num_envs) if seed is None else seed)

    def reset(self) -> np.ndarray:
        """Reset every env; ``(num_envs, *obs_shape)`` (a copy).

        Raises:
            ValueError: reset options were set (the pools take none), or the engine refuses
                the seeds of `seed` (they are dropped; the pool in use stays).
        """
        if any(self._options):
            options = self._options
            self._reset_options()  # (dropped, as after a reset: the next reset may go on)
            self._reset_seeds()
            raise ValueError(f"reset options {options} are not supported by gmi-drl pools")
        try:
            if all(s is not None for s in self._seeds):
                seeds = env_seeds(self._seeds, self.num_envs)
                if not (self._fresh and np.array_equal(seeds, self._pool_seeds)):
                    self.pool = rebuild(self._make, self.pool, seeds)
                    self._pool_seeds = seeds
        finally:
            self._reset_seeds()
        self._fresh = False
        obs, _ = self._host(self.pool.reset())
        self.reset_infos = [{} for _ in range(self.num_envs)]
        return obs.copy()

    def step_async(self, actions: np.ndarray) -> None:
        """Send one action per env (``action_space``-shaped per env). SB3's algorithms clip or
        squash actions into the space before they step; the pool refuses any outside it.

        Raises:
            ValueError: actions of another shape or dtype (the expected shape named), or outside
                the action space.
            RuntimeError: no `reset` since the VecEnv was made (as SB3's ``Monitor``).
        """
        if self._fresh:
            raise RuntimeError("step before reset: call reset() first (as SB3's Monitor, the "
                               "face does not step unreset envs)")
        self.pool.send(actions)

    def step_wait(self):
        """``(obs, rewards (n,) float32, dones (n,) bool, infos)`` of the actions sent."""
        obs, rewards, terminated, truncated, info = self._host(self.pool.recv())
        dones = terminated | truncated
        infos: list[dict[str, Any]] = [{"TimeLimit.truncated": False} for _ in range(len(dones))]
        if np.count_nonzero(dones):  # (count_nonzero: a third of ndarray.any's fixed cost)
            final, now = info["final_obs"], round(time.time() - self._t_start, 6)
            for i in np.flatnonzero(dones):
                infos[i]["terminal_observation"] = final[i].copy()
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            for i in np.flatnonzero(info["episode_end"]):
                infos[i]["episode"] = {"r": round(float(info["episode_return"][i]), 6),
                                       "l": int(info["episode_length"][i]), "t": now}
        return obs.copy(), rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.pool.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """What every env of a pool shares: ``render_mode`` (``None``: pools do not render),
        ``observation_space`` and ``action_space`` (one env's), ``metadata`` and ``spec`` (the
        Gymnasium registration of the task id, or ``None`` for a gmi-drl-only task); anything
        else raises.

        Raises:
            AttributeError: the envs of a pool are no Python objects with attributes.
        """
        shared = {"render_mode": lambda: None,  # (asked for by VecEnv.__init__: lazily)
                  "observation_space": lambda: self.observation_space,
                  "action_space": lambda: self.action_space, "metadata": lambda: self.metadata,
                  "spec": lambda: gym.registry.get(self.pool.spec.task_id)}
        if attr_name in shared:
            value = shared[attr_name]()
            return [value for _ in self._get_indices(indices)]
        raise AttributeError(f"gmi-drl pools have no per-env attribute {attr_name!r}")

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise AttributeError(f"gmi-drl pools have no per-env attribute {attr_name!r} to set")

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None,
                   **method_kwargs) -> list[Any]:
        raise AttributeError(f"gmi-drl pools have no per-env method {method_name!r}")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        """True for ``Monitor`` (and its bases): the face reports episodes as ``Monitor``
        does (``infos[i]["episode"]``), so SB3's evaluation counts them, not ``dones``."""
        wrapped = isinstance(wrapper_class, type) and issubclass(Monitor, wrapper_class)
        return [wrapped for _ in self._get_indices(indices)]


def make_vec_env(task_id: str, n_envs: int = 1, seed: int | None = None,
                 num_workers: int | None = None, **task_kwargs: Any) -> GmiVecEnv:
    """`GmiVecEnv` of ``n_envs`` envs, seeded ``seed + i`` at the first reset (SB3's
    ``make_vec_env`` convention); gmi-drl's answer to ``stable_baselines3.common.env_util
    .make_vec_env``."""
    env = GmiVecEnv(task_id, n_envs, num_workers=num_workers, seed=seed, **task_kwargs)
    if seed is not None:
        env.seed(seed)  # SB3's own record of the seeds: the first reset keeps the pool
    return env

