"""The fragment: what a serving GMI sends to the trainers in an asynchronous run.

A fragment is ``T`` steps of the ``B`` envs of one serving GMI, time-major, with the behaviour
policy's log-probabilities and the ``policy_version`` of the weights that acted. Observations
travel raw (the trainer normalises them, and publishes its statistics with the weights), so
one set of statistics serves every serving GMI. Rewards travel as the serving GMI's reward
normaliser left them.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from gmi_drl.comm.channels.fabric import FieldSpec


def fragment_fields(observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                    num_steps: int, num_envs: int) -> tuple[FieldSpec, ...]:
    """The fields of a fragment of ``num_steps`` (T) steps of ``num_envs`` (B) envs:

    - ``obs (T, B, *obs_shape)`` as the pool returns it (float32, or uint8 frames)
    - ``actions (T, B, *A) float32`` (Box, the unclipped sample) or ``(T, B) int64``
    - ``logprobs (T, B) float32``: log mu(a|s) of the behaviour policy
    - ``rewards (T, B) float32``; ``terminated``, ``truncated (T, B) bool``
    - ``final_values (T, B) float32``: the behaviour critic's V(final_obs) where an episode
      was truncated (0 elsewhere)
    - ``episode_end (T, B) bool``, ``episode_return (T, B) float32``, ``episode_length (T, B)
      int32``: finished episodes (what the trainer logs)
    - ``last_obs (B, *obs_shape)``: the observation after the last step (the bootstrap)
    - ``policy_version (1,) int64``
    """
    T, B = num_steps, num_envs
    obs_dtype = "uint8" if observation_space.dtype == np.uint8 else "float32"
    obs = tuple(observation_space.shape)
    if isinstance(action_space, gym.spaces.Discrete):
        actions = FieldSpec("actions", (T, B), "int64")
    else:
        actions = FieldSpec("actions", (T, B, *action_space.shape), "float32")
    return (FieldSpec("obs", (T, B, *obs), obs_dtype), actions,
            FieldSpec("logprobs", (T, B), "float32"), FieldSpec("rewards", (T, B), "float32"),
            FieldSpec("terminated", (T, B), "bool"), FieldSpec("truncated", (T, B), "bool"),
            FieldSpec("final_values", (T, B), "float32"),
            FieldSpec("episode_end", (T, B), "bool"),
            FieldSpec("episode_return", (T, B), "float32"),
            FieldSpec("episode_length", (T, B), "int32"),
            FieldSpec("last_obs", (B, *obs), obs_dtype, time_major=False),
            FieldSpec("policy_version", (1,), "int64", time_major=False))
