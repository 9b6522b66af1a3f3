"""Test environments with observable internals, for the pool's semantics tests."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np


class CounterEnv(gym.Env):
    """obs = [steps taken in this episode, sum of actions received, seed-derived id, pid].

    Terminates after ``episode_len`` steps; reward = the action received. Lets a test see that
    every env was stepped exactly once per action sent, and with which action.
    """

    def __init__(self, episode_len: int = 5, fail_at: int | None = None,
                 fail_padding: int = 0) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float64)
        self.action_space = gym.spaces.Box(-10.0, 10.0, (), np.float64)
        self.episode_len, self.fail_at, self.fail_padding = episode_len, fail_at, fail_padding
        self.t, self.total, self.tag = 0, 0.0, 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.total, self.tag, os.getpid()], np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.total = 0, 0.0
        self.tag = float(self.np_random.integers(1 << 30))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if self.fail_at is not None and self.t == self.fail_at:
            raise RuntimeError("CounterEnv was told to fail here" + "." * self.fail_padding)
        self.total += float(action)
        return self._obs(), float(action), self.t >= self.episode_len, False, {}
