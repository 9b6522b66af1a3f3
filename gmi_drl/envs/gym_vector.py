"""A Gymnasium ``VectorEnv`` face over one gmi-drl pool: code written for
``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv`` runs on the engine unchanged.

    envs = gmi_drl.envs.make_vec("Hopper-v5", num_envs=8)
    envs = gymnasium.wrappers.vector.RecordEpisodeStatistics(envs)   # wrappers chain as usual
    obs, info = envs.reset(seed=1)
    obs, rewards, terminations, truncations, info = envs.step(envs.action_space.sample())

Semantics follow ``gymnasium.make_vec(task_id, num_envs, vectorization_mode="sync")``: env ``i``
of ``reset(seed=s)`` (or of ``make_vec(..., seed=s)``, then the first ``reset()``) is seeded
``s + i`` (or ``seed[i]`` for a list), the autoreset modes are
Gymnasium's (`gymnasium.vector.AutoresetMode`: next-step by default, same-step with
``info["final_obs"]`` / ``info["final_info"]`` and their ``_``-masks, disabled with
``options={"reset_mask": mask}``), rewards are float64 and the flags bool. Observations,
rewards and flags equal ``gymnasium.make_vec``'s step for step on the same seeds (tested for
classic control and MuJoCo). gmi-drl's Atari ids (``Pong-v5``) have the preprocessing of
ale-py's ``AtariVectorEnv``, which ``gymnasium.make_vec("ALE/Pong-v5", n)`` makes by default
(84x84 grayscale, 4 stacked frames), but the settings DQN and PPO runs use: no sticky actions
(``AtariVectorEnv``: ``repeat_action_probability=0.25``, v5's default) and ``episodic_life``
(a life loss ends an episode, the game goes on; ``AtariVectorEnv`` has none). Given
``repeat_action_probability=0.25, episodic_life=False``, the newest frame, rewards, flags and
lives equal ``AtariVectorEnv``'s step for step; the frame stack of a new game is padded with
its first frame, where ale-py pads with zeros. An ``ALE/`` id itself gives the raw frames of
``gymnasium.make``, as ``vectorization_mode="sync"`` does, and `make_vec` warns. ``get_attr``
and ``call`` answer what every env of a pool shares (`gmi_drl.envs.faces.shared_env_attr`);
``set_attr``, and ``call`` of anything else, raise: a pool's envs are no Python objects.
What differs: ``info`` carries no per-step keys of Gymnasium's single envs
(the pool computes observations, rewards and flags only; Atari pools add ``lives``), a
``reset(seed=...)`` after the first one rebuilds the pool (engines take seeds at construction;
``None`` items of a seed list get seeds drawn from its ints, where Gymnasium would continue
those envs' generators), ``step`` before any ``reset`` raises ``gymnasium.error.ResetNeeded``,
Box actions outside the action space are clipped to it before the step (the pool itself
refuses them): the dynamics are Gymnasium's, whose envs clamp the control too, but a reward
with a control cost (MuJoCo locomotion, MountainCarContinuous) is charged on the clipped action
where Gymnasium's env charges the unclipped one; for actions inside the space they are equal.
``render`` is not available (``gmi-drl eval --video`` renders a policy). The env cannot be
copied or pickled (``copy.deepcopy`` raises TypeError): make another with `make_vec`.

Copies: with ``copy=True`` (the default, as Gymnasium users expect owned arrays) every returned
array is a new one (one copy of the batch per call); with ``copy=False`` observations are this
object's buffer and the flags the pool's, valid until the next ``step``/``reset`` (one copy of
the observations per step instead of two). Over a pool of torch tensors (the warp engine on
CUDA, or ``tensors=True``) every output is copied to NumPy on the host.
"""

from __future__ import annotations

import time
import warnings
from copy import deepcopy
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode as GymAutoreset
from gymnasium.vector.utils import batch_space

from gmi_drl.envs.faces import (OWNED_BY_EVERY_FACE, check_face_args, face_seeds, host_outputs,
                                rebuild, shared_env_attr)

_MODES = {GymAutoreset.NEXT_STEP: "next_step", GymAutoreset.SAME_STEP: "same_step",
          GymAutoreset.DISABLED: "disabled"}
_POOL_KEYS = {"env_id", "episode_return", "episode_length", "episode_end", "final_obs"}
"""the pool's own info keys; any other (Atari's ``lives``) passes through"""
_OWNED = {"autoreset": "use autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP (or "
                       "NEXT_STEP, DISABLED)", **OWNED_BY_EVERY_FACE}
"""`make` keywords the face sets itself, and what to use instead"""


class GymVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` envs of ``task_id`` as a `gymnasium.vector.VectorEnv` (module docstring).

    Args:
        task_id: as `gmi_drl.envs.make`. num_envs: sub-environments.
        seed: the seeds of the first reset (an int ``s``: ``s + i``; or one per env), as if
            the first ``reset`` were ``reset(seed=seed)``; ``None``: random ones.
        autoreset_mode: a `gymnasium.vector.AutoresetMode` (or its value, e.g. ``"SameStep"``);
            ``None``: the engine's default, ``NEXT_STEP`` (Gymnasium's) where it runs every
            mode, ``SAME_STEP`` on the warp engine, which runs only that one.
        num_workers: as `gmi_drl.envs.make`.
        copy: return new arrays (True) or the pool's buffers (False).
        episode_statistics: also put Gymnasium's ``info["episode"]`` (``r``, ``l``, ``t``) and
            ``info["_episode"]`` where an episode ended (what ``RecordEpisodeStatistics`` adds;
            leave False to chain that wrapper instead: it refuses existing statistics).
        **task_kwargs: the task's keyword arguments (also ``device`` and ``engine``).

    Raises:
        ValueError: an invalid ``num_envs`` or seed; an unknown task, mode or keyword (from
            `gmi_drl.envs.make`); a `make` keyword the face sets itself (``autoreset``,
            ``env_batch_size``: the message says what to use instead).
    """

    def __init__(self, task_id: str, num_envs: int,
                 autoreset_mode: GymAutoreset | str | None = None,
                 num_workers: int | None = None, copy: bool = True,
                 episode_statistics: bool = False,
                 seed: int | Sequence[int | None] | None = None, **task_kwargs: Any) -> None:
        from gmi_drl.envs.registry import make

        check_face_args("Gymnasium face", num_envs, task_kwargs, _OWNED)
        try:
            mode = None if autoreset_mode is None else GymAutoreset(autoreset_mode)
        except ValueError:
            raise ValueError(f"autoreset_mode={autoreset_mode!r} must be a gymnasium.vector."
                             f"AutoresetMode or one of {[m.value for m in GymAutoreset]}") from None
        # (a local: a lambda reading self would make a cycle that keeps a dropped face, and its
        # workers, alive until the cycle collector runs)
        autoreset = None if mode is None else _MODES[mode]
        self._make = lambda seeds: make(task_id, num_envs, num_workers=num_workers, seed=seeds,
                                        autoreset=autoreset, **task_kwargs)
        self._seeds = face_seeds(seed, num_envs)
        try:
            self.pool = self._make(self._seeds)
        except ValueError as e:
            if "autoreset=" not in str(e):
                raise
            raise ValueError(f"{e} (on the Gymnasium face: autoreset_mode="
                             "gymnasium.vector.AutoresetMode.SAME_STEP)") from None
        self._mode = next(m for m, value in _MODES.items() if value == self.pool.autoreset.value)
        self._host = host_outputs(self.pool)
        self._fresh = True  # no reset yet: the pool is the first one, and step() must wait
        if seed is not None:
            super().reset(seed=int(self._seeds[0]))
        self.num_envs, self.copy, self.episode_statistics = num_envs, copy, episode_statistics
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": self._mode, "render_modes": []}
        self.autoreset_mode = self._mode  # (as SyncVectorEnv's attribute)
        self.spec = deepcopy(gym.registry.get(task_id))
        self._clip = isinstance(self.single_action_space, gym.spaces.Box)
        if self._clip:
            act = self.single_action_space
            self._low, self._high, self._dtype = act.low, act.high, act.dtype
            self._batch_shape = (num_envs, *act.shape)
        self._episode_start = np.zeros(num_envs)
        space = self.single_observation_space
        self._obs = np.zeros((num_envs, *space.shape), space.dtype)  # every env's latest

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (or those of ``options["reset_mask"]``); returns ``(obs (num_envs,
        *obs_shape), info)``.

        Raises:
            ValueError: options other than ``reset_mask``; a bad mask; a seed list of another
                length; seeds together with a mask (seeding rebuilds the whole pool).
        """
        self._check_open()
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise ValueError(f"reset options {sorted(options)} are not supported (only "
                             "reset_mask)")
        if seed is not None:
            if mask is not None:
                raise ValueError("reset(seed=..., options={'reset_mask': ...}): seeding a subset "
                                 "of the envs is not supported; seed all of them, or reset the "
                                 "subset without a seed")
            if isinstance(seed, (list, tuple)) and all(s is None for s in seed) \
                    and len(seed) == self.num_envs:
                seed = None  # every env continues: no new seeds
        if seed is not None:
            seeds = face_seeds(seed, self.num_envs)
            if not (self._fresh and np.array_equal(seeds, self._seeds)):
                self.pool = rebuild(self._make, self.pool, seeds)
                self._seeds = seeds
            super().reset(seed=int(seeds[0]))
        self._fresh = False
        ids = slice(None) if mask is None else self._mask_ids(mask)
        obs, _ = self._host(self.pool.reset(None if mask is None else ids))
        self._obs[ids] = obs
        self._episode_start[ids] = time.perf_counter()
        return (self._obs.copy() if self.copy else self._obs), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                          dict[str, Any]]:
        """One step of every env with ``actions`` (``action_space``-shaped).

        Raises:
            ValueError: actions of another shape or dtype (the message names the expected
                shape); an env stepped after its episode ended with autoreset disabled.
            RuntimeError: the env was closed.
            gymnasium.error.ResetNeeded: no ``reset`` since the env was made.
        """
        self._check_open()
        if self._fresh:
            raise gym.error.ResetNeeded("step() before reset(): call reset() first (as "
                                        "Gymnasium's envs, the face does not step unreset envs)")
        a = np.asarray(actions)
        if self._clip and a.shape == self._batch_shape and a.dtype.kind in "fiu":
            # (a wrong shape goes on to the pool, whose message names the expected one)
            a = np.minimum(np.maximum(a, self._low), self._high).astype(self._dtype, copy=False)
        obs, rewards, terminated, truncated, pool_info = self._host(self.pool.step(a))
        np.copyto(self._obs, obs)
        info = {k: v.copy() for k, v in pool_info.items() if k not in _POOL_KEYS}  # e.g. lives
        if self._mode is GymAutoreset.SAME_STEP and np.count_nonzero(terminated | truncated):
            for i in np.flatnonzero(terminated | truncated):
                info = self._add_info(info, {"final_obs": pool_info["final_obs"][i].copy(),
                                             "final_info": {}}, int(i))
        if np.count_nonzero(pool_info["episode_end"]):  # (a third of ndarray.any's cost)
            self._episode_ended(pool_info, info)
        obs = self._obs
        if self.copy:
            obs, terminated, truncated = obs.copy(), terminated.copy(), truncated.copy()
        return obs, rewards.astype(np.float64), terminated, truncated, info

    def _episode_ended(self, pool_info: dict[str, Any], info: dict[str, Any]) -> None:
        """Restart the episode clocks of the envs whose episode ended; add Gymnasium's
        ``episode`` statistics to ``info`` where asked to."""
        ended, now = pool_info["episode_end"].astype(bool), time.perf_counter()
        if self.episode_statistics:  # RecordEpisodeStatistics' arrays: 0 where none ended
            info["episode"] = {
                "r": np.where(ended, pool_info["episode_return"].astype(np.float64), 0.0),
                "l": np.where(ended, pool_info["episode_length"].astype(np.int64), 0),
                "t": np.where(ended, np.round(now - self._episode_start, 6), 0.0)}
            info["_episode"] = ended
        self._episode_start[ended] = now

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """One value per env of what every env of a pool shares (`gmi_drl.envs.faces.
        shared_env_attr`).

        Raises:
            AttributeError: any other name: the envs of a pool are no Python objects.
        """
        value = shared_env_attr(self, name, ("single_observation_space", "single_action_space"))
        return tuple(value for _ in range(self.num_envs))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """`get_attr` of a shared attribute (Gymnasium's ``call`` returns attributes that are no
        methods); ``"render"`` as `render`.

        Raises:
            AttributeError: any other name (a pool's envs have no methods to call).
            NotImplementedError: ``"render"``.
        """
        if name == "render":
            self.render()
        return self.get_attr(name)

    def set_attr(self, name: str, values: Any) -> None:
        raise AttributeError(f"gmi-drl pools have no per-env attribute {name!r} to set: the envs "
                             "of a pool are no Python objects")

    def render(self):
        raise NotImplementedError("gmi-drl pools do not render; `gmi-drl eval RUN_DIR --video` "
                                  "records a policy's episode")

    def close_extras(self, **kwargs: Any) -> None:
        self.pool.close()

    def __reduce__(self):
        raise TypeError(f"{self!r} cannot be copied or pickled: its pool's envs step in "
                        "worker threads or processes over shared memory; make another with "
                        "gmi_drl.envs.make_vec(...)")

    def __repr__(self) -> str:
        return f"GymVectorEnv({self.pool.spec.task_id}, num_envs={self.num_envs})"

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"{self!r} is closed")

    def _mask_ids(self, mask: Any) -> np.ndarray:
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ \
                or mask.shape != (self.num_envs,) or not mask.any():
            raise ValueError(f"options['reset_mask'] must be a bool array of shape "
                             f"({self.num_envs},) with at least one True, got {mask!r}")
        return np.flatnonzero(mask)


_VECTOR_KWARGS = {"autoreset_mode", "copy"}
"""``vector_kwargs`` of Gymnasium's vector envs that the face takes"""


def make_vec(task_id: str, num_envs: int = 1, vectorization_mode: str | None = None,
             vector_kwargs: dict[str, Any] | None = None, wrappers: Sequence[Any] | None = None,
             render_mode: str | None = None, **kwargs: Any) -> GymVectorEnv:
    """`GymVectorEnv` of ``task_id`` (keyword arguments as there), with the arguments of
    ``gymnasium.make_vec``: gmi-drl's answer to it. One pool stands in for every
    ``vectorization_mode`` (``None``, ``"sync"``, ``"async"``); ``vector_kwargs`` may hold
    ``autoreset_mode`` and ``copy``.

    Raises:
        TypeError: ``task_id`` not a string (``gymnasium.make_vec`` also takes an ``EnvSpec``).
        ValueError: ``vectorization_mode="vector_entry_point"`` or an unknown one; other
            ``vector_kwargs``; ``wrappers`` (they wrap each single env, which a pool does not
            build); a ``render_mode`` (pools do not render); a keyword given twice; what
            `GymVectorEnv` refuses.
    """
    if not isinstance(task_id, str):
        raise TypeError(f"make_vec takes an env id string, got {task_id!r} (for a "
                        "gymnasium EnvSpec, pass spec.id and its kwargs)")
    errors = []
    if vectorization_mode not in (None, "sync", "async"):
        errors.append(f"vectorization_mode={vectorization_mode!r}: the face is its own vector env, "
                      "standing in for 'sync' and 'async' (for ale-py's AtariVectorEnv, use "
                      "gmi-drl's Atari ids, e.g. Pong-v5)")
    vector_kwargs = dict(vector_kwargs or {})
    if set(vector_kwargs) - _VECTOR_KWARGS:
        errors.append(f"vector_kwargs {sorted(set(vector_kwargs) - _VECTOR_KWARGS)} are not "
                      f"taken (only {sorted(_VECTOR_KWARGS)})")
    if wrappers:
        errors.append("wrappers= wraps each single env, which a gmi-drl pool does not build: "
                      "wrap the vector env (gymnasium.wrappers.vector) instead")
    if render_mode is not None:
        errors.append(f"render_mode={render_mode!r}: gmi-drl pools do not render; "
                      "`gmi-drl eval RUN_DIR --video` records a policy's episode")
    twice = sorted(set(vector_kwargs) & set(kwargs))
    if twice:
        errors.append(f"{twice} given both in vector_kwargs and as keywords")
    if errors:
        raise ValueError("invalid make_vec: " + "; ".join(errors))
    if task_id.startswith("ALE/"):
        warnings.warn(f"{task_id} steps the raw frames of gymnasium.make({task_id!r}) (as "
                      "vectorization_mode='sync'); gymnasium.make_vec's default for ALE ids is "
                      f"ale-py's AtariVectorEnv (84x84 grayscale, 4 frames stacked): the "
                      f"preprocessing of gmi-drl's {task_id.removeprefix('ALE/')} (add "
                      "repeat_action_probability=0.25, episodic_life=False for "
                      "AtariVectorEnv's own defaults)", stacklevel=2)
    return GymVectorEnv(task_id, num_envs, **vector_kwargs, **kwargs)
