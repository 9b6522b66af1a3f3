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

What a port from ``make_vec_env`` meets:
- ``infos[i]`` holds the keys above and nothing of the env's own ``info`` (Hopper's
  ``x_position``, an ``is_success``): the pool computes observations, rewards and flags only,
  so callbacks that read env info keys (``EvalCallback``'s success rate, Monitor's
  ``info_keywords``, HER) have nothing to read; ``reset_infos`` are empty dicts.
- gmi-drl's Atari tasks (``Breakout-v5``) already return SB3's Atari preprocessing, 4 stacked
  84x84 frames (``make_atari_env`` + ``VecFrameStack(..., 4)``): do not stack them again.
- ``render`` and ``get_images`` are not available (``gmi-drl eval --video`` records a policy),
  so neither is ``VecVideoRecorder``.
- Observation spaces are arrays (Box, Discrete, MultiDiscrete, MultiBinary); Dict and Tuple
  spaces (``MultiInputPolicy``) are refused.
- The VecEnv cannot be copied or pickled (``copy.deepcopy`` raises TypeError; SB3's
  ``model.save`` and ``VecNormalize.save`` leave the VecEnv out and work): make another with
  `make_vec_env`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.monitor import Monitor, ResultsWriter
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices

from gmi_drl.envs.faces import (OWNED_BY_EVERY_FACE, check_face_args, face_seeds, host_outputs,
                                rebuild, shared_env_attr)
from gmi_drl.envs.spec import env_seeds, random_seed

_OWNED = {"autoreset": "an SB3 VecEnv resets an ended env in the same step (its last observation "
                       "in infos[i]['terminal_observation'])", **OWNED_BY_EVERY_FACE}


class GmiVecEnv(VecEnv):
    """``num_envs`` envs of ``task_id`` as a ``stable_baselines3`` ``VecEnv`` (module docstring).

    Args:
        task_id: as `gmi_drl.envs.make`. num_envs: sub-environments.
        num_workers: as `gmi_drl.envs.make`.
        seed: seeds of the pool's first reset (``seed + i``); ``None``: random ones.
        monitor_files: one path per env (without the suffix) where each ended episode is
            written as ``Monitor`` writes it (``<path>.monitor.csv``: ``r``, ``l``, ``t``, for
            SB3's ``load_results`` / ``plot_results``); ``None``: none.
        override_existing: replace monitor files that exist (False: append to them).
        **task_kwargs: the task's keyword arguments (also ``device`` and ``engine``).

    Raises:
        ValueError: an invalid ``num_envs``; an unknown task or keyword (from
            `gmi_drl.envs.make`); a `make` keyword the face sets itself (``autoreset``,
            ``env_batch_size``: the message says what to use instead).
    """

    def __init__(self, task_id: str, num_envs: int, num_workers: int | None = None,
                 seed: int | None = None, monitor_files: Sequence[str] | None = None,
                 override_existing: bool = True, **task_kwargs: Any) -> None:
        from gmi_drl.envs.registry import make

        check_face_args("Stable-Baselines3 face", num_envs, task_kwargs, _OWNED)
        if monitor_files is not None and len(monitor_files) != num_envs:
            raise ValueError(f"monitor_files has {len(monitor_files)} paths, expected one per "
                             f"env ({num_envs})")
        self._make = lambda seeds: make(task_id, num_envs, num_workers=num_workers, seed=seeds,
                                        autoreset="same_step", **task_kwargs)
        self._pool_seeds = face_seeds(seed, num_envs)
        self.pool = self._make(self._pool_seeds)
        self._host = host_outputs(self.pool)
        self._fresh = True  # no reset yet: the pool is the first one, and step must wait
        self._waiting = False  # actions sent by step_async, not yet taken by step_wait
        super().__init__(num_envs, self.pool.observation_space, self.pool.action_space)
        self._t_start = time.time()
        self._monitors = None if monitor_files is None else [
            ResultsWriter(path, {"t_start": self._t_start, "env_id": task_id},
                          override_existing=override_existing) for path in monitor_files]

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
        if self._waiting:  # a step_async not waited for: its results are dropped (as
            self.pool.recv()  # DummyVecEnv's reset does)
            self._waiting = False
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
        if self._waiting:
            raise RuntimeError("step_async() twice: call step_wait() for the actions sent first")
        self.pool.send(actions)
        self._waiting = True

    def step_wait(self):
        """``(obs, rewards (n,) float32, dones (n,) bool, infos)`` of the actions sent.

        Raises:
            RuntimeError: no `step_async` since the last `step_wait`.
        """
        if not self._waiting:
            raise RuntimeError("step_wait() without step_async(): send actions with "
                               "step_async() (or call step()) first")
        self._waiting = False
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
                if self._monitors is not None:
                    self._monitors[i].write_row(infos[i]["episode"])
        return obs.copy(), rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.pool.close()
        for monitor in self._monitors or ():
            monitor.close()

    def __reduce__(self):
        raise TypeError(f"{type(self).__name__}({self.pool.spec.task_id}, num_envs="
                        f"{self.num_envs}) cannot be copied or pickled: its pool's envs step in "
                        "worker threads or processes over shared memory; make another with "
                        "gmi_drl.envs.sb3.make_vec_env(...)")

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """What every env of a pool shares (`gmi_drl.envs.faces.shared_env_attr`).

        Raises:
            AttributeError: any other name: the envs of a pool are no Python objects.
        """
        value = shared_env_attr(self, attr_name, ("observation_space", "action_space"))
        return [value for _ in self._get_indices(indices)]

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


def make_vec_env(env_id: str, n_envs: int = 1, seed: int | None = None, start_index: int = 0,
                 monitor_dir: str | None = None, wrapper_class: Any = None,
                 env_kwargs: dict[str, Any] | None = None, vec_env_cls: Any = None,
                 vec_env_kwargs: dict[str, Any] | None = None,
                 monitor_kwargs: dict[str, Any] | None = None,
                 wrapper_kwargs: dict[str, Any] | None = None, *,
                 num_workers: int | None = None, **task_kwargs: Any) -> GmiVecEnv:
    """gmi-drl's answer to ``stable_baselines3.common.env_util.make_vec_env``, with its
    arguments: `GmiVecEnv` of ``n_envs`` envs of ``env_id``, seeded ``seed + i`` at the first
    reset; ``env_kwargs`` (and any other keyword) go to the task; ``monitor_dir`` gets one
    ``<start_index + i>.monitor.csv`` per env, as SB3's ``Monitor`` writes them
    (``monitor_kwargs``: ``override_existing``, and ``allow_early_resets``, which the face
    always allows). One pool stands in for ``DummyVecEnv`` and ``SubprocVecEnv`` alike
    (``vec_env_cls`` may name either; ``vec_env_kwargs`` only SubprocVecEnv's
    ``start_method``, which has no use here).

    Raises:
        ValueError: a callable ``env_id`` (register the env and pass its id), a
            ``wrapper_class`` (it would wrap each single env, which a pool does not build),
            another ``vec_env_cls``, Monitor's ``info_keywords`` / ``reset_keywords`` (pools carry
            no per-env info), a keyword given twice; what `GmiVecEnv` refuses.
    """
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    if not isinstance(env_id, str):
        raise ValueError(f"env_id={env_id!r}: the gmi-drl face takes a task id, not a callable; "
                         "register your env (gymnasium.register('MyEnv-v0', entry_point=...)) "
                         "and pass 'MyEnv-v0'")
    errors = []
    if wrapper_class is not None or wrapper_kwargs:
        errors.append("wrapper_class wraps each single env, which a gmi-drl pool does not "
                      "build: wrap the VecEnv instead (stable_baselines3.common.vec_env "
                      "wrappers, e.g. VecNormalize)")
    if vec_env_cls not in (None, DummyVecEnv, SubprocVecEnv):
        errors.append(f"vec_env_cls={vec_env_cls!r}: the face stands in for DummyVecEnv and "
                      "SubprocVecEnv only")
    if set(vec_env_kwargs or {}) - {"start_method"}:
        errors.append(f"vec_env_kwargs {sorted(vec_env_kwargs)}: only SubprocVecEnv's "
                      "start_method is taken (and has no use: the pool's workers are its own)")
    monitor_kwargs = dict(monitor_kwargs or {})
    monitor_kwargs.pop("allow_early_resets", None)
    override = monitor_kwargs.pop("override_existing", True)
    unknown = sorted(set(monitor_kwargs) - {"info_keywords", "reset_keywords"})
    if unknown:
        errors.append(f"monitor_kwargs {unknown}: not Monitor's")
    if any(monitor_kwargs.get(k) for k in ("info_keywords", "reset_keywords")):
        errors.append("monitor_kwargs info_keywords / reset_keywords: gmi-drl pools carry no "
                      "per-env info keys for Monitor to record (override_existing and "
                      "allow_early_resets are taken)")
    twice = sorted(set(env_kwargs or {}) & set(task_kwargs))
    if twice:
        errors.append(f"{twice} given both in env_kwargs and as keywords")
    if errors:
        raise ValueError("invalid make_vec_env: " + "; ".join(errors))
    monitors = None
    if monitor_dir is not None:
        os.makedirs(monitor_dir, exist_ok=True)
        monitors = [os.path.join(monitor_dir, str(start_index + i)) for i in range(n_envs)]
    env = GmiVecEnv(env_id, n_envs, num_workers=num_workers, seed=seed, monitor_files=monitors,
                    override_existing=override, **(env_kwargs or {}), **task_kwargs)
    if seed is not None:
        env.seed(seed)  # SB3's own record of the seeds: the first reset keeps the pool
    return env
