"""Task specification and autoreset modes of the env engine.

Source: the EnvPool paper: a pool is made from a task spec; the batched
API returns single-env Gymnasium spaces.
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass
from typing import Sequence

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding


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


def env_seeds(seed: int | Sequence[int], num_envs: int) -> np.ndarray:
    """``(num_envs,) int64``: the seed of each env's first reset. An int ``s`` gives ``s + i`` to
    env ``i`` (Gymnasium's vector convention); a sequence gives its ``i``-th item.

    Raises:
        ValueError: a sequence of another length than ``num_envs``, a seed that is no int, or an
            env seed outside ``[0, 2**63)`` (engines with a narrower range, ALE's and warp's
            ``[0, 2**31)``, refuse more where they are built).
    """
    try:
        if isinstance(seed, (int, np.integer)):
            given = [operator.index(seed) + i for i in range(num_envs)]
        else:
            given = [operator.index(s) for s in seed]
    except TypeError:
        raise ValueError(f"seed={seed!r} must be an int or a sequence of ints") from None
    if len(given) != num_envs:
        raise ValueError(f"seed has {len(given)} items, expected one per env ({num_envs})")
    if given and (min(given) < 0 or max(given) >= 2**63):
        raise ValueError(f"env seeds {min(given)}..{max(given)} (seed + env_id) must lie in "
                         "[0, 2**63); [0, 2**31 - num_envs] suits every engine")
    return np.array(given, np.int64)


def random_seed(num_envs: int = 1) -> int:
    """A fresh random seed ``s`` whose env seeds ``s .. s + num_envs - 1`` stay below ``2**31``
    (every engine's range): what an unseeded Gymnasium or SB3 face starts from."""
    return int(np.random.SeedSequence().generate_state(1)[0]) % (2**31 - num_envs)


class EnvGenerators:
    """Each env's ``np.random.Generator``, kept as ``gymnasium.Env`` keeps its ``np_random``: a
    seed re-creates it (``gymnasium.utils.seeding.np_random(seed)``), ``None`` continues it,
    and an env never seeded gets a randomly seeded one. The one seeding rule of the NumPy and
    C++ engines, whose trajectories equal Gymnasium's (the warp engine's worlds draw from Warp's
    counter-based generator instead)."""

    def __init__(self, num_envs: int) -> None:
        self._rngs: list[np.random.Generator | None] = [None] * num_envs

    def __call__(self, i: int, seed: int | None = None) -> np.random.Generator:
        """Env ``i``'s generator for a reset with ``seed``.

        Raises:
            gymnasium.error.Error: a negative seed.
        """
        if seed is not None or self._rngs[i] is None:
            self._rngs[i], _ = seeding.np_random(None if seed is None else operator.index(seed))
        return self._rngs[i]

    def __getitem__(self, i: int) -> np.random.Generator:
        """Env ``i``'s current generator (it was reset at least once)."""
        return self._rngs[i]
