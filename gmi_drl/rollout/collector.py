"""Synchronous rollout collection from an `EnvPool` into a `RolloutBuffer`."""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from gmi_drl.models.actor_critic import ActorCritic
from gmi_drl.models.fast_mlp import NumpyActing
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.rollout.storage import RolloutBuffer
from gmi_drl.telemetry.timer import timer


class Episodes(NamedTuple):
    """Episodes that finished during one rollout, in completion order."""

    returns: np.ndarray
    """``(k,) float64``, undiscounted, unnormalised episode returns"""
    lengths: np.ndarray
    """``(k,) int64``, env steps per episode"""


class Collector:
    """Steps a pool with a policy and fills rollout buffers, one rollout per `collect` call.

    The pool must use ``autoreset="same_step"`` so that ``V(final_obs)`` can be bootstrapped where
    an episode is truncated. Observations and rewards pass through the optional normalisers
    (statistics updated as data arrives, like Gymnasium's wrappers); Box actions are clipped to
    the action space before they are sent, while the unclipped sample is stored (its
    log-probability is the one PPO's ratio needs).

    Args:
        pool: an `EnvPool` with ``env_batch_size == num_envs`` and ``same_step`` autoreset.
        model: the policy; only read, under ``torch.inference_mode``.
        obs_norm: observation normaliser or ``None``.
        reward_norm: reward normaliser or ``None``.
        generator: the torch RNG used to sample actions (saved in checkpoints).

    Raises:
        ValueError: the pool is asynchronous or not in ``same_step`` mode.
    """

    def __init__(self, pool, model: ActorCritic, obs_norm: ObsNormalizer | None,
                 reward_norm: RewardNormalizer | None, generator: torch.Generator) -> None:
        if pool.env_batch_size != pool.num_envs or pool.autoreset.value != "same_step":
            raise ValueError(f"Collector needs a synchronous pool in same_step mode, got {pool!r}")
        self.pool, self.model = pool, model
        self.obs_norm, self.reward_norm = obs_norm, reward_norm
        self.generator = generator
        space = pool.action_space
        self._clip = isinstance(space, gym.spaces.Box)
        if self._clip:
            self._low, self._high = space.low, space.high
            self._act_dtype = space.dtype
        self.next_obs: np.ndarray | None = None
        self._numpy = NumpyActing(model) if NumpyActing.supports(model) else None

    def reset(self) -> None:
        """Reset every env of the pool and take its first observations."""
        obs, _ = self.pool.reset()
        self.next_obs = self._normalized(obs)

    def _normalized(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """A new array: the normalised float32 observations, or a copy of uint8 images."""
        if self.obs_norm is not None:
            return self.obs_norm(obs, update).astype(np.float32)
        return obs.copy() if obs.dtype == np.uint8 else obs.astype(np.float32)

    def _act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._numpy is not None:
            return self._numpy.act(obs, self.generator)
        action, logprob, value = self.model.act(torch.from_numpy(obs), self.generator)
        return action.numpy(), logprob.numpy(), value.numpy()

    def _value(self, obs: np.ndarray) -> np.ndarray:
        if self._numpy is not None:
            return self._numpy.value(obs)
        return self.model.value(torch.from_numpy(obs)).numpy()

    @torch.inference_mode()
    def collect(self, buf: RolloutBuffer) -> Episodes:
        """Fill every row of ``buf`` with ``buf.num_steps`` steps of all envs (blocks).

        Returns the episodes that ended during this rollout.
        """
        if self.next_obs is None:
            self.reset()
        if self._numpy is not None and self._numpy.stale():  # parameters were re-homed
            self._numpy = NumpyActing(self.model)
        pool, rows = self.pool, buf.numpy()
        ep_returns, ep_lengths = [], []
        for t in range(buf.num_steps):
            obs = rows.obs[t]
            obs[...] = self.next_obs
            with timer("inference"):
                action, rows.logprobs[t], rows.values[t] = self._act(obs)
            rows.actions[t] = action
            env_action = action
            if self._clip:
                env_action = np.minimum(np.maximum(action, self._low), self._high)  # clip
                env_action = env_action.astype(self._act_dtype, copy=False)
            with timer("env_step"):
                obs_np, reward, terminated, truncated, info = pool.step(env_action)
            done = terminated | truncated
            self.next_obs = self._normalized(obs_np)
            if self.reward_norm is not None:
                reward = self.reward_norm(reward, done)
            rows.rewards[t] = reward
            rows.terminated[t] = terminated
            rows.truncated[t] = truncated
            rows.final_values[t] = 0.0
            if done.any():
                end = info["episode_end"]  # Atari with episodic life: whole games only
                ep_returns.append(info["episode_return"][end].copy())
                ep_lengths.append(info["episode_length"][end].copy())
                cut = np.flatnonzero(truncated & ~terminated)
                if len(cut):
                    final = self._normalized(info["final_obs"][cut], update=False)
                    rows.final_values[t, cut] = self._value(final)
        rows.last_values[...] = self._value(self.next_obs)
        return Episodes(np.concatenate(ep_returns) if ep_returns else np.zeros(0),
                        np.concatenate(ep_lengths) if ep_lengths else np.zeros(0, np.int64))
