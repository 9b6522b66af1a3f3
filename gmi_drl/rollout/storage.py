"""Rollout storage: preallocated time-major ``[T, B, ...]`` tensors for on-policy algorithms."""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch


class Batch(NamedTuple):
    """One flattened rollout, ``N = T * B`` samples (views of `RolloutBuffer`, no copy)."""

    obs: torch.Tensor
    """``(N, *obs_shape)`` as stored (float32, or uint8 for images)"""
    actions: torch.Tensor
    """``(N, A) float32`` or ``(N,) int64``"""
    logprobs: torch.Tensor
    """``(N,) float32``, log pi_old(a|s) at collection time"""
    values: torch.Tensor
    """``(N,) float32``, V_old(s) at collection time"""
    advantages: torch.Tensor
    """``(N,) float32``, GAE(gamma, lambda)"""
    returns: torch.Tensor
    """``(N,) float32``, advantages + values (the value target)"""


class BufferArrays(NamedTuple):
    """NumPy views of the `RolloutBuffer` tensors that a collector writes (same shapes)."""

    obs: np.ndarray
    actions: np.ndarray
    logprobs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_values: np.ndarray
    last_values: np.ndarray


class RolloutBuffer:
    """``num_steps`` (T) steps of ``num_envs`` (B) envs, allocated once and reused.

    Row ``t`` holds the observation the policy saw, its action, log-probability and value, then the
    reward and the ``terminated``/``truncated`` flags of that step (kept apart, never merged).
    ``final_values[t, b]`` is ``V(final_obs)`` where env ``b``'s episode was truncated at step
    ``t`` (0 elsewhere); ``last_values (B,)`` is ``V`` of the observation after step ``T-1``.

    Args:
        num_steps: T. num_envs: B.
        observation_space: single-env space; float obs are stored as float32, uint8 stays uint8.
        action_space: Discrete (stored ``int64 (T, B)``) or Box (``float32 (T, B, A)``).
    """

    def __init__(self, num_steps: int, num_envs: int, observation_space: gym.spaces.Space,
                 action_space: gym.spaces.Space) -> None:
        T, B = num_steps, num_envs
        obs_dtype = torch.uint8 if observation_space.dtype == np.uint8 else torch.float32
        self.obs = torch.zeros((T, B, *observation_space.shape), dtype=obs_dtype)
        if isinstance(action_space, gym.spaces.Discrete):
            self.actions = torch.zeros((T, B), dtype=torch.int64)
        else:
            self.actions = torch.zeros((T, B, *action_space.shape), dtype=torch.float32)
        self.logprobs = torch.zeros((T, B))
        self.values = torch.zeros((T, B))
        self.rewards = torch.zeros((T, B))
        self.terminated = torch.zeros((T, B), dtype=torch.bool)
        self.truncated = torch.zeros((T, B), dtype=torch.bool)
        self.final_values = torch.zeros((T, B))
        self.last_values = torch.zeros(B)
        self.advantages = torch.zeros((T, B))
        self.returns = torch.zeros((T, B))
        self.num_steps, self.num_envs = T, B
        self._numpy: BufferArrays | None = None

    def numpy(self) -> BufferArrays:
        """NumPy views of the collected tensors (the same memory; built once, then cached)."""
        if self._numpy is None:
            self._numpy = BufferArrays(*(getattr(self, f).numpy() for f in BufferArrays._fields))
        return self._numpy

    def compute_advantages(self, gamma: float, gae_lambda: float) -> None:
        """Fill `advantages` and `returns` (in place) with GAE from the stored rollout."""
        from gmi_drl.rollout.gae import compute_gae

        compute_gae(self.rewards, self.values, self.terminated, self.truncated, self.final_values,
                    self.last_values, gamma, gae_lambda, advantages=self.advantages)
        torch.add(self.advantages, self.values, out=self.returns)

    def flatten(self) -> Batch:
        """The rollout as ``N = T * B`` samples, time-major order (views)."""
        n = self.num_steps * self.num_envs
        return Batch(self.obs.flatten(0, 1), self.actions.flatten(0, 1), self.logprobs.view(n),
                     self.values.view(n), self.advantages.view(n), self.returns.view(n))
