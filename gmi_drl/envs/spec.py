"""Task specification and autoreset modes of the env engine.

Source: EnvPool (papers/003_e9bf2f468e812145.txt): a pool is made from a task spec; the batched
API returns single-env Gymnasium spaces.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import gymnasium as gym


class AutoresetMode(str, enum.Enum):
    """What a pool does when a sub-environment's episode ends (terminated or truncated).

    - ``next_step`` (EnvPool's and Gymnasium's default): the ending step returns the final
      observation; the *next* step of that env ignores its action, resets it and returns the first
      observation of the new episode with reward 0 and ``terminated = truncated = False``.
    - ``same_step``: the ending step already resets the env and returns the new episode's first
      observation; the final observation is in ``info["final_obs"]`` (rows where the episode ended),
      so a learner can bootstrap ``V(final_obs)`` on truncation.
    - ``disabled``: nothing is reset; stepping an ended env raises ``ValueError`` until
      ``reset(env_id=...)`` is called for it.
    """

    NEXT_STEP = "next_step"
    SAME_STEP = "same_step"
    DISABLED = "disabled"


@dataclass(frozen=True)
class EnvSpec:
    """What a pool knows about its task before any env exists.

    Attributes:
        task_id: registered task name, e.g. ``"Hopper-v5"``.
        observation_space: single-env observation space.
        action_space: single-env action space.
        max_episode_steps: steps after which an episode is truncated by the pool, or ``None`` when
            the environment applies its own time limit (Gymnasium's ``TimeLimit``) or has none.
    """

    task_id: str
    observation_space: gym.spaces.Space
    action_space: gym.spaces.Space
    max_episode_steps: int | None
