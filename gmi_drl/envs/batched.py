"""The contract every environment implementation of the engine fulfils: `BatchedEnv`.

A `BatchedEnv` holds ``num_envs`` independent sub-environments of one task and steps any subset
of them at once, given by local indices. It does *not* autoreset, apply a time limit or keep
episode statistics: `gmi_drl.envs.stepper.Stepper` adds those identically for every
implementation (native NumPy, native MuJoCo threads, or Gymnasium envs in worker processes).
"""

from __future__ import annotations

import abc
from typing import Sequence

import gymnasium as gym
import numpy as np

StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class BatchedEnv(abc.ABC):
    """``num_envs`` sub-environments of one task, stepped together by index.

    Arrays returned by `reset` and `step` may be internal buffers: they stay valid only until the
    next call on this object. Indices (``ids``) are ``int64`` arrays of distinct values in
    ``[0, num_envs)``; actions are already validated against `action_space` by the pool.
    """

    observation_space: gym.spaces.Space
    action_space: gym.spaces.Space
    num_envs: int

    @abc.abstractmethod
    def reset(self, ids: np.ndarray, seeds: Sequence[int | None]) -> np.ndarray:
        """Start a new episode in each env of ``ids``.

        Args:
            ids: ``(n,) int64`` env indices.
            seeds: one entry per id; an int re-seeds that env's random generator exactly as
                ``gymnasium.Env.reset(seed=...)`` does, ``None`` continues its current generator.

        Returns:
            obs: ``(n, *obs_shape)`` in the dtype of `observation_space`.
        """

    @abc.abstractmethod
    def step(self, ids: np.ndarray, actions: np.ndarray) -> StepResult:
        """Advance each env of ``ids`` by one step.

        Args:
            ids: ``(n,) int64`` env indices; none of them has an ended episode.
            actions: ``(n, *action_shape)`` in the dtype of `action_space`.

        Returns:
            ``(obs (n, *obs_shape), reward (n,) float64, terminated (n,) bool,
            truncated (n,) bool)``; ``truncated`` is only set by environments that apply their own
            time limit (the pool's `EnvSpec.max_episode_steps` is ``None`` for those).
        """

    def close(self) -> None:
        """Release native resources. Idempotent."""


class GymnasiumBatch(BatchedEnv):
    """The generic path: a list of ``gymnasium.Env`` stepped one by one in this process.

    Used inside the worker processes of `gmi_drl.envs.workers`, each worker owning a shard.

    Args:
        env_fns: one callable per sub-environment, each returning a fresh ``gymnasium.Env``.
    """

    def __init__(self, env_fns: Sequence) -> None:
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        shape = self.observation_space.shape
        self._obs = np.zeros((self.num_envs, *shape), self.observation_space.dtype)
        self._reward = np.zeros(self.num_envs, np.float64)
        self._terminated = np.zeros(self.num_envs, bool)
        self._truncated = np.zeros(self.num_envs, bool)

    def reset(self, ids: np.ndarray, seeds: Sequence[int | None]) -> np.ndarray:
        n = len(ids)
        for k in range(n):
            self._obs[k], _ = self.envs[ids[k]].reset(seed=seeds[k])
        return self._obs[:n]

    def step(self, ids: np.ndarray, actions: np.ndarray) -> StepResult:
        n = len(ids)
        obs, rew, term, trunc, envs = self._obs, self._reward, self._terminated, self._truncated, self.envs
        for k in range(n):
            obs[k], rew[k], term[k], trunc[k], _ = envs[ids[k]].step(actions[k])
        return obs[:n], rew[:n], term[:n], trunc[:n]

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
