"""Synchronous collection from an `EnvPool`: rollouts into a `RolloutBuffer` (on-policy
algorithms) and transitions into a `ReplayBuffer` (off-policy algorithms)."""

from __future__ import annotations

from typing import Callable

import torch

from gmi_drl.rollout.acting import Acting
from gmi_drl.rollout.arrays import Array, Arrays, HostArrays
from gmi_drl.rollout.episodes import Episodes
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.rollout.replay import FrameReplayBuffer, ReplayBuffer
from gmi_drl.rollout.core import Step, StepCore, collect_steps
from gmi_drl.rollout.storage import RolloutBuffer

__all__ = ["Collector", "Episodes", "Policy", "ReplayCollector"]


class Collector:
    """Steps a pool with a policy and fills a rollout buffer, one rollout per `collect` call.

    The pool must use ``autoreset="same_step"`` so that ``V(final_obs)`` can be bootstrapped where
    an episode is truncated. Observations and rewards pass through the optional normalisers
    (statistics updated as data arrives, like Gymnasium's wrappers); Box actions are clipped to
    the action space before they are sent, while the unclipped sample is stored (its
    log-probability is the one the learner's ratio needs). Each step is the collection core's
    (`gmi_drl.rollout.core`), written through ``arrays`` (`gmi_drl.rollout.arrays`): NumPy
    views of the buffer on the CPU, the tensors on a device, where the pool's outputs are copied
    each step, unless the pool's outputs are tensors already (``pool.tensors``: the warp engine),
    which pass through untouched and never cross to the host before the rollout ends. After
    each rollout the pool's ``check_limits`` runs (a simulator's contact buffers, once per
    rollout).

    Args:
        pool: an `EnvPool` (or `gmi_drl.envs.warp.pool.WarpPool`) with ``env_batch_size ==
            num_envs`` and ``same_step`` autoreset.
        acting: the policy (`gmi_drl.rollout.acting.make_acting`), taking arrays of the
            collector's kind (`arrays`).
        arrays: where the buffer and normalisers live (on ``arrays.device``; replaced by its
            tensor-pool form for a pool of tensors).
        obs_norm: observation normaliser or ``None``.
        reward_norm: reward normaliser or ``None``.

    Raises:
        ValueError: the pool returns partial batches or is not in ``same_step`` mode.
    """

    def __init__(self, pool, acting: Acting, arrays: Arrays, obs_norm: ObsNormalizer | None,
                 reward_norm: RewardNormalizer | None) -> None:
        self.core = StepCore(pool, arrays, obs_norm, reward_norm=reward_norm)
        self.pool, self.acting, self.arrays = pool, acting, self.core.arrays
        self.obs_norm, self.reward_norm = obs_norm, reward_norm
        self._rows = None

    @property
    def _on_device(self) -> bool:
        return self.core.on_device

    @property
    def next_obs(self) -> Array | None:
        """The policy's input for the pool's current observations (``None`` before `reset`)."""
        return self.core.policy_obs

    def reset(self) -> None:
        """Reset every env of the pool and take its first observations."""
        self.core.reset()

    def collect(self, buf: RolloutBuffer) -> Episodes:
        """Fill every row of ``buf`` with ``buf.num_steps`` steps of all envs (blocks).

        Returns the episodes that ended during this rollout.
        """
        self._rows = buf.rows(self.arrays)
        episodes = collect_steps([self.core], buf.num_steps, self)
        self._rows.last_values[...] = self.acting.value(self.core.policy_obs)
        self.pool.check_limits()
        return episodes

    def act(self, t: int, core: StepCore) -> Array:
        """(`gmi_drl.rollout.core.Sink`) Row ``t``'s observations, action, log-probability
        and value."""
        rows = self._rows
        obs = rows.obs[t]
        obs[...] = core.policy_obs
        action, rows.logprobs[t], rows.values[t] = self.acting.act(obs)
        rows.actions[t] = action
        return action

    def record(self, t: int, core: StepCore, step: Step) -> None:
        """(`gmi_drl.rollout.core.Sink`) Row ``t``'s rewards, ends and ``V(final_obs)``."""
        rows, a = self._rows, self.arrays
        rows.rewards[t] = step.reward
        rows.terminated[t] = a.from_pool(step.terminated)
        rows.truncated[t] = a.from_pool(step.truncated)
        core.final_values(step, self.acting.value, rows.final_values[t])

    def step_done(self, t: int) -> None:
        """(`gmi_drl.rollout.core.Sink`) Nothing to do."""


Policy = Callable[[Array], tuple[Array, Array]]
"""``policy(obs) -> (env_action, stored_action)``: ``obs (num_envs, *obs_shape)`` as the pool
returned it (NumPy, or tensors on the device of a pool of tensors); the action the pool steps
(as the pool takes it: `ReplayCollector.arrays`' ``to_pool``) and the one the replay stores
(they differ where the learner acts in a rescaled space)."""


class ReplayCollector:
    """Steps a pool with a policy and appends every transition to a replay buffer.

    Each transition is stored with the observation that followed it: the final observation
    where an episode ended (``info["final_obs"]`` of a ``same_step`` pool), so a truncated
    episode bootstraps from its real last state, and ``terminated`` marks the ends that do not.
    Each step is the collection core's (`gmi_drl.rollout.core`): with a pool of device
    tensors (the warp engine) observations, actions, rewards, ends and the final-observation
    substitution stay tensors on the pool's device and go into the replay as such.

    Args:
        pool: an `EnvPool` with ``env_batch_size == num_envs`` and ``same_step`` autoreset.
        replay: where transitions go.

    The policy's arrays are `arrays`: NumPy (`HostArrays`), or for a pool of tensors the
    tensor-pool form on the pool's device.

    Raises:
        ValueError: the pool returns partial batches or is not in ``same_step`` mode.
    """

    def __init__(self, pool, replay: ReplayBuffer | FrameReplayBuffer) -> None:
        self.core = StepCore(pool, HostArrays(), clip=False, inputs=False)
        self.pool, self.replay, self.arrays = pool, replay, self.core.arrays
        self.obs: Array | None = None
        self._policy: Policy | None = None
        self._ended: Callable[[Array], None] | None = None
        self._stored: Array | None = None

    def collect(self, num_steps: int, policy: Policy,
                ended: Callable[[Array], None] | None = None) -> Episodes:
        """``num_steps`` steps of every env (blocks); returns the episodes that ended.
        ``ended(done)``, when given, sees each step's ``done (num_envs,) bool`` (as the pool
        returned it) where an episode may have ended (every step on a pool of tensors)."""
        if self.obs is None:
            self.core.reset()
            self.obs = _copy(self.core.obs)
        self._policy, self._ended = policy, ended
        return collect_steps([self.core], num_steps, self)

    def act(self, t: int, core: StepCore) -> Array:
        """(`gmi_drl.rollout.core.Sink`) The policy's action; keeps the stored one."""
        env_action, self._stored = self._policy(self.obs)
        return env_action

    def record(self, t: int, core: StepCore, step: Step) -> None:
        """(`gmi_drl.rollout.core.Sink`) Append the transition."""
        self.replay.add(self.obs, self._stored, step.reward, core.next_obs(step),
                        step.terminated, step.done)
        self.obs[...] = step.obs
        if self._ended is not None and step.ended:
            self._ended(step.done)

    def step_done(self, t: int) -> None:
        """(`gmi_drl.rollout.core.Sink`) Nothing to do."""


def _copy(x: Array) -> Array:
    return x.clone() if isinstance(x, torch.Tensor) else x.copy()
