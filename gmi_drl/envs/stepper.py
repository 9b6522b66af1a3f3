"""Autoreset, time limit and episode statistics over any `BatchedEnv`, written into state slots.

The same code runs in the pool's own process (in-process engines) and inside each worker process
(generic path), so the three autoreset modes behave identically everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gmi_drl.envs.batched import BatchedEnv
from gmi_drl.envs.spec import AutoresetMode


@dataclass
class Slots:
    """Per-env state buffers, indexed by env index; an engine's results live here.

    Shapes (``k`` = envs covered): ``obs (k, *obs_shape)``, ``reward (k,) float64``,
    ``terminated``/``truncated (k,) bool``, ``episode_return (k,) float64`` (sum of rewards of the
    current episode, this step included), ``episode_length (k,) int64`` (steps of the current
    episode), ``final_obs (k, *obs_shape)`` (``same_step`` mode: the last observation of the
    episode that ended on this step).
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_return: np.ndarray
    episode_length: np.ndarray
    final_obs: np.ndarray

    @classmethod
    def allocate(cls, num_envs: int, obs_shape: tuple, obs_dtype) -> "Slots":
        return cls(
            obs=np.zeros((num_envs, *obs_shape), obs_dtype),
            reward=np.zeros(num_envs, np.float64),
            terminated=np.zeros(num_envs, bool),
            truncated=np.zeros(num_envs, bool),
            episode_return=np.zeros(num_envs, np.float64),
            episode_length=np.zeros(num_envs, np.int64),
            final_obs=np.zeros((num_envs, *obs_shape), obs_dtype),
        )


_ALL = slice(None)


class EpisodeEndedError(ValueError):
    """An env whose episode ended was stepped with autoreset ``disabled``."""


class Stepper:
    """Drives a `BatchedEnv` under an autoreset mode and writes every result into `Slots`.

    Args:
        env: the sub-environments (local indices ``0..env.num_envs-1``).
        slots: state buffers with ``env.num_envs`` rows.
        mode: the `AutoresetMode`.
        max_episode_steps: truncate an episode after this many steps (``None``: the env's own).
        seeds: ``(env.num_envs,)`` seed of each env's first reset (later resets continue its
            generator, as Gymnasium does).
    """

    def __init__(self, env: BatchedEnv, slots: Slots, mode: AutoresetMode,
                 max_episode_steps: int | None, seeds: np.ndarray) -> None:
        self.env, self.slots, self.mode = env, slots, AutoresetMode(mode)
        self.max_episode_steps = max_episode_steps
        self._pending_seeds: list[int | None] = [int(s) for s in seeds]
        self._unseeded = len(self._pending_seeds)
        self._n = env.num_envs
        self._arange_bytes = np.arange(env.num_envs, dtype=np.int64).tobytes()
        self.ended = np.zeros(env.num_envs, bool)
        self._num_ended = 0  # envs awaiting a reset; lets the common step skip the check
        self._return = np.zeros(env.num_envs, np.float64)  # running totals of the current episode
        self._length = np.zeros(env.num_envs, np.int64)

    def reset(self, ids: np.ndarray) -> None:
        """Start new episodes in ``ids`` and write their first observations; reward 0."""
        s = self.slots
        s.obs[ids] = self.env.reset(ids, self._seeds_for(ids))
        s.reward[ids] = 0.0
        s.terminated[ids] = False
        s.truncated[ids] = False
        s.episode_return[ids] = 0.0
        s.episode_length[ids] = 0
        self._return[ids] = 0.0
        self._length[ids] = 0
        if self._num_ended:
            self.ended[ids] = False
            self._num_ended = int(np.count_nonzero(self.ended))

    def step(self, ids: np.ndarray, actions: np.ndarray) -> None:
        """Step ``ids`` with ``actions (n, *action_shape)`` under the autoreset mode.

        Raises:
            EpisodeEndedError: autoreset is ``disabled`` and an env of ``ids`` has ended.
        """
        if self._num_ended:
            ended = self.ended[ids]
            if np.count_nonzero(ended):
                if self.mode is AutoresetMode.DISABLED:
                    raise EpisodeEndedError(
                        f"env_id {ids[ended].tolist()}: episode ended and autoreset is disabled; "
                        "call reset(env_id=...) for them before stepping")
                self.reset(ids[ended])  # next_step: this step only resets
                ids, actions = ids[~ended], actions[~ended]
                if len(ids) == 0:
                    return
        # all envs in id order (the synchronous case): slices instead of fancy indexing
        at = _ALL if len(ids) == self._n and ids.tobytes() == self._arange_bytes else ids
        s = self.slots
        obs, reward, terminated, truncated = self.env.step(ids, actions)
        length = self._length[at] + 1
        ret = self._return[at] + reward
        if self.max_episode_steps is not None:
            truncated = truncated | (length >= self.max_episode_steps)
        s.obs[at] = obs
        s.reward[at] = reward
        s.terminated[at] = terminated
        s.truncated[at] = truncated
        s.episode_return[at] = ret
        s.episode_length[at] = length
        self._return[at] = ret
        self._length[at] = length
        done = terminated | truncated
        if not np.count_nonzero(done):
            return
        done_ids = ids[done]
        self._return[done_ids] = 0.0
        self._length[done_ids] = 0
        if self.mode is AutoresetMode.SAME_STEP:
            s.final_obs[done_ids] = s.obs[done_ids]
            s.obs[done_ids] = self.env.reset(done_ids, self._seeds_for(done_ids))
        else:
            self.ended[done_ids] = True
            self._num_ended = int(np.count_nonzero(self.ended))

    def _seeds_for(self, ids: np.ndarray) -> list[int | None]:
        """First-reset seeds of ``ids`` (then forgotten); ``None`` for envs already seeded."""
        if self._unseeded == 0:
            return [None] * len(ids)
        pending = self._pending_seeds
        seeds = [pending[i] for i in ids]
        for i in ids:
            pending[i] = None
        self._unseeded = sum(x is not None for x in pending)
        return seeds
