"""Twin Delayed DDPG: DDPG with clipped double-Q learning, target policy smoothing and delayed
policy updates.

Source: Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods",
Algorithm 1: two critics and the minimum of their targets (eq. 10), target actions smoothed with
clipped Gaussian noise (eq. 14), the actor and the targets updated every ``policy_delay`` critic
steps. The learner is `gmi_drl.algos.ddpg.DDPG`'s; only the config differs (defaults:
Stable-Baselines3's TD3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge

from gmi_drl.algos.ddpg import DDPG, DeterministicPGConfig


@dataclass
class TD3Config(DeterministicPGConfig):
    """TD3 hyper-parameters: DDPG's, and the three of Fujimoto et al. 2018."""

    n_critics: Annotated[int, Ge(1)] = 2
    """critics whose minimum forms the target (clipped double-Q)"""
    policy_delay: Annotated[int, Ge(1)] = 2
    """critic steps per actor step and target update"""
    target_policy_noise: Annotated[float, Ge(0)] = 0.2
    """std of the noise on target actions, in [-1, 1] units"""
    target_noise_clip: Annotated[float, Ge(0)] = 0.5
    """bound of that noise"""


class TD3(DDPG):
    """The TD3 learner: `DDPG` with a `TD3Config` (see there)."""
