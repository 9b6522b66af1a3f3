"""Rollout storage: preallocated time-major ``[T, B, ...]`` tensors for on-policy algorithms."""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from gmi_drl.rollout.arrays import Arrays


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


class Rows(NamedTuple):
    """The `RolloutBuffer` tensors a collector writes, as arrays of its `Arrays` kind (NumPy
    views on the CPU); same shapes and memory as the tensors."""

    obs: object
    actions: object
    logprobs: object
    values: object
    rewards: object
    terminated: object
    truncated: object
    final_values: object
    last_values: object


class RolloutBuffer:
    """``num_steps`` (T) steps of ``num_envs`` (B) envs on ``device``, allocated once and reused.

    Row ``t`` holds the observation the policy saw, its action, log-probability and value, then the
    reward and the ``terminated``/``truncated`` flags of that step (kept apart, never merged).
    ``final_values[t, b]`` is ``V(final_obs)`` where env ``b``'s episode was truncated at step
    ``t`` (0 elsewhere); ``last_values (B,)`` is ``V`` of the observation after step ``T-1``.
    `compute_advantages` fills ``advantages`` and ``returns``.

    Args:
        num_steps: T. num_envs: B.
        observation_space: single-env space; float obs are stored as float32, uint8 stays uint8.
        action_space: Discrete (stored ``int64 (T, B)``) or Box (``float32 (T, B, A)``).
        device: where every tensor lives (the learner's device).
    """

    def __init__(self, num_steps: int, num_envs: int, observation_space: gym.spaces.Space,
                 action_space: gym.spaces.Space, device: torch.device | str = "cpu") -> None:
        T, B = num_steps, num_envs

        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(shape, dtype=dtype, device=device)

        obs_dtype = torch.uint8 if observation_space.dtype == np.uint8 else torch.float32
        self.obs = zeros(T, B, *observation_space.shape, dtype=obs_dtype)
        if isinstance(action_space, gym.spaces.Discrete):
            self.actions = zeros(T, B, dtype=torch.int64)
        else:
            self.actions = zeros(T, B, *action_space.shape)
        self.logprobs, self.values, self.rewards = zeros(T, B), zeros(T, B), zeros(T, B)
        self.terminated = zeros(T, B, dtype=torch.bool)
        self.truncated = zeros(T, B, dtype=torch.bool)
        self.final_values, self.last_values = zeros(T, B), zeros(B)
        self.advantages, self.returns = zeros(T, B), zeros(T, B)
        self.num_steps, self.num_envs = T, B

    def rows(self, arrays: Arrays) -> Rows:
        """The collected tensors as ``arrays``' kind (no copy)."""
        return Rows(*(arrays.view(getattr(self, f)) for f in Rows._fields))

    def compute_advantages(self, gamma: float, gae_lambda: float) -> None:
        """Fill `advantages` and `returns` (in place) with GAE from the stored rollout
        (`gmi_drl.rollout.gae.compute_gae`)."""
        from gmi_drl.rollout.gae import compute_gae

        compute_gae(self.rewards, self.values, self.terminated, self.truncated, self.final_values,
                    self.last_values, gamma, gae_lambda, advantages=self.advantages)
        torch.add(self.advantages, self.values, out=self.returns)

    def flatten(self) -> Batch:
        """The rollout as ``N = T * B`` samples, time-major order (views)."""
        n = self.num_steps * self.num_envs
        return Batch(self.obs.flatten(0, 1), self.actions.flatten(0, 1), self.logprobs.view(n),
                     self.values.view(n), self.advantages.view(n), self.returns.view(n))
