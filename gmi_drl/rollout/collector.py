"""Synchronous collection from an `EnvPool`: rollouts into a `RolloutBuffer` (on-policy
algorithms) and transitions into a `ReplayBuffer` (off-policy algorithms)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple

import gymnasium as gym
import numpy as np

from gmi_drl.rollout.acting import Acting
from gmi_drl.rollout.arrays import Array, Arrays, arrays_for, flatnonzero, to_host
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.rollout.replay import FrameReplayBuffer, ReplayBuffer
from gmi_drl.rollout.storage import RolloutBuffer
from gmi_drl.telemetry.timer import timer


class Episodes(NamedTuple):
    """Episodes that finished during one collection, in completion order."""

    returns: np.ndarray
    """``(k,) float64``, undiscounted, unnormalised episode returns"""
    lengths: np.ndarray
    """``(k,) int64``, env steps per episode"""
    extras: Mapping[str, np.ndarray] = MappingProxyType({})
    """``{name: (k,) float64}``: a task's own per-episode totals, from the pool's
    ``info["episode_<name>"]`` (ShadowHand's ``successes``), logged as ``env/episodic_<name>``"""

    @staticmethod
    def concat(returns: list[np.ndarray], lengths: list[np.ndarray],
               extras: Mapping[str, list[np.ndarray]] | None = None) -> "Episodes":
        """One `Episodes` from per-step pieces (empty lists: no episode)."""
        def join(parts: list[np.ndarray], dtype) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        return Episodes(join(returns, np.float64), join(lengths, np.int64),
                        {k: join(v, np.float64) for k, v in (extras or {}).items()})

    @staticmethod
    def merge(parts: list["Episodes"]) -> "Episodes":
        """The episodes of several collections, in order (a logged row covers every iteration
        since the last one)."""
        names = {k for p in parts for k in p.extras}
        return Episodes.concat([p.returns for p in parts], [p.lengths for p in parts],
                               {k: [p.extras[k] for p in parts if k in p.extras]
                                for k in names})


_TOTALS = ("episode_return", "episode_length", "episode_end")


def extra_totals(info: dict) -> list[str]:
    """The ``info`` keys of a task's own per-episode totals: ``episode_<name>`` other than
    return, length and end."""
    return [k for k in info if k.startswith("episode_") and k not in _TOTALS]


class Collector:
    """Steps a pool with a policy and fills a rollout buffer, one rollout per `collect` call.

    The pool must use ``autoreset="same_step"`` so that ``V(final_obs)`` can be bootstrapped where
    an episode is truncated. Observations and rewards pass through the optional normalisers
    (statistics updated as data arrives, like Gymnasium's wrappers); Box actions are clipped to
    the action space before they are sent, while the unclipped sample is stored (its
    log-probability is the one the learner's ratio needs). Everything is written through
    ``arrays`` (`gmi_drl.rollout.arrays`): NumPy views of the buffer on the CPU, the tensors on a
    device, where the pool's outputs are copied each step, unless the pool's outputs are
    tensors already (``pool.tensors``: the warp engine), which pass through untouched. After each
    rollout the pool's ``check_limits`` runs (a simulator's contact buffers, once per rollout).

    Args:
        pool: an `EnvPool` (or `gmi_drl.envs.warp.pool.WarpPool`) with ``env_batch_size ==
            num_envs`` and ``same_step`` autoreset.
        acting: the policy (`gmi_drl.rollout.acting.make_acting`).
        arrays: where the buffer and normalisers live (on ``arrays.device``; replaced by its
            tensor-pool form for a pool of tensors).
        obs_norm: observation normaliser or ``None``.
        reward_norm: reward normaliser or ``None``.

    Raises:
        ValueError: the pool returns partial batches or is not in ``same_step`` mode.
    """

    def __init__(self, pool, acting: Acting, arrays: Arrays, obs_norm: ObsNormalizer | None,
                 reward_norm: RewardNormalizer | None) -> None:
        _check_pool(pool)
        # a pool of device tensors (the warp engine on a GPU): nothing crosses to the host per
        # step; episode ends are recorded on the device and read once per rollout
        self._on_device = bool(getattr(pool, "tensors", False))
        if self._on_device:
            arrays = arrays_for(arrays.device, pool_tensors=True)
        self.pool, self.acting, self.arrays = pool, acting, arrays
        self.obs_norm, self.reward_norm = obs_norm, reward_norm
        space = pool.action_space
        self._clip = isinstance(space, gym.spaces.Box)
        if self._clip:
            self._low, self._high = space.low, space.high
            self._act_dtype = space.dtype
            if getattr(arrays, "pool_tensors", False):
                import torch

                self._low, self._high = (torch.as_tensor(x, device=arrays.device)
                                         for x in (space.low, space.high))
        self._images = pool.observation_space.dtype == np.uint8
        self.next_obs: Array | None = None

    def reset(self) -> None:
        """Reset every env of the pool and take its first observations."""
        obs, _ = self.pool.reset()
        self.next_obs = self._normalized(self.arrays.from_pool(obs))

    def _normalized(self, obs: Array, update: bool = True) -> Array:
        """A new array: the normalised float32 observations, or a copy of uint8 images."""
        if self.obs_norm is not None:
            return self.arrays.float32(self.obs_norm(obs, update))
        if self._images:
            return self.arrays.copy(obs)
        return self.arrays.float32(obs)

    def collect(self, buf: RolloutBuffer) -> Episodes:
        """Fill every row of ``buf`` with ``buf.num_steps`` steps of all envs (blocks).

        Returns the episodes that ended during this rollout.
        """
        if self.next_obs is None:
            self.reset()
        pool, arrays, rows = self.pool, self.arrays, buf.rows(self.arrays)
        ep_returns, ep_lengths, ep_extras = [], [], {}
        ends = _DeviceEnds(buf.num_steps, pool.num_envs, arrays.device) if self._on_device \
            else None
        for t in range(buf.num_steps):
            obs = rows.obs[t]
            obs[...] = self.next_obs
            with timer("inference"):
                action, rows.logprobs[t], rows.values[t] = self.acting.act(obs)
            rows.actions[t] = action
            env_action = self._env_action(action)
            with timer("env_step"):
                obs_np, reward, terminated, truncated, info = pool.step(env_action)
            done = terminated | truncated
            self.next_obs = self._normalized(arrays.from_pool(obs_np))
            reward = arrays.from_pool(reward)
            if self.reward_norm is not None:
                reward = self.reward_norm(reward, arrays.from_pool(done))
            rows.rewards[t] = reward
            rows.terminated[t] = arrays.from_pool(terminated)
            rows.truncated[t] = arrays.from_pool(truncated)
            rows.final_values[t] = 0.0
            if ends is not None:  # no host sync: record on the device, bootstrap every row
                ends.record(t, info)
                final = self._normalized(info["final_obs"], update=False)
                cut = truncated & ~terminated
                rows.final_values[t] = self.acting.value(final).where(cut, 0.0)
            elif done.any():
                end = info["episode_end"]  # Atari with episodic life: whole games only
                ep_returns.append(to_host(info["episode_return"][end]))
                ep_lengths.append(to_host(info["episode_length"][end]))
                for key in extra_totals(info):
                    ep_extras.setdefault(key[len("episode_"):], []).append(
                        to_host(info[key][end]))
                cut = flatnonzero(truncated & ~terminated)
                if len(cut):
                    final = self._normalized(arrays.from_pool(info["final_obs"][cut]),
                                             update=False)
                    rows.final_values[t, arrays.from_pool(cut)] = self.acting.value(final)
        rows.last_values[...] = self.acting.value(self.next_obs)
        pool.check_limits()
        if ends is not None:
            return ends.episodes()
        return Episodes.concat(ep_returns, ep_lengths, ep_extras)

    def _env_action(self, action: Array):
        """The action the pool steps: the sample clipped to a Box space, as the pool takes it."""
        env_action = self.arrays.to_pool(action)
        if not self._clip:
            return env_action
        if isinstance(env_action, np.ndarray):
            env_action = np.minimum(np.maximum(env_action, self._low), self._high)
            return env_action.astype(self._act_dtype, copy=False)
        return env_action.clamp(self._low, self._high)


class _DeviceEnds:
    """Episode ends of one rollout kept on the device, ``(num_steps, num_envs)`` each, read to
    the host once at its end (in completion order: step by step, env ids ascending)."""

    def __init__(self, num_steps: int, num_envs: int, device) -> None:
        import torch

        self.end = torch.zeros(num_steps, num_envs, dtype=torch.bool, device=device)
        self.returns = torch.zeros(num_steps, num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_steps, num_envs, dtype=torch.int64, device=device)
        self.extras: dict = {}  # name -> (num_steps, num_envs) float64, made at first sight

    def record(self, t: int, info: dict) -> None:
        self.end[t] = info["episode_end"]
        self.returns[t] = info["episode_return"]
        self.lengths[t] = info["episode_length"]
        for key in extra_totals(info):
            if key not in self.extras:
                self.extras[key] = self.returns.new_zeros(self.returns.shape)
            self.extras[key][t] = info[key]

    def episodes(self) -> Episodes:
        end = self.end.cpu()
        return Episodes(self.returns.cpu()[end].numpy(), self.lengths.cpu()[end].numpy(),
                        {k[len("episode_"):]: v.cpu()[end].numpy()
                         for k, v in self.extras.items()})


def _check_pool(pool) -> None:
    if pool.env_batch_size != pool.num_envs or pool.autoreset.value != "same_step":
        raise ValueError(f"collection needs a full-batch pool in same_step mode, got {pool!r}")


Policy = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``policy(obs) -> (env_action, stored_action)``: ``obs (num_envs, *obs_shape)`` as the pool
returned it; the action the pool steps and the one the replay stores (they differ where the
learner acts in a rescaled space)."""


class ReplayCollector:
    """Steps a pool with a policy and appends every transition to a replay buffer.

    Each transition is stored with the observation that followed it: the final observation
    where an episode ended (``info["final_obs"]`` of a ``same_step`` pool), so a truncated
    episode bootstraps from its real last state, and ``terminated`` marks the ends that do not.

    Args:
        pool: an `EnvPool` with ``env_batch_size == num_envs`` and ``same_step`` autoreset.
        replay: where transitions go.

    Raises:
        ValueError: the pool returns partial batches or is not in ``same_step`` mode.
    """

    def __init__(self, pool, replay: ReplayBuffer | FrameReplayBuffer) -> None:
        _check_pool(pool)
        self.pool, self.replay = pool, replay
        self.obs: np.ndarray | None = None

    def collect(self, num_steps: int, policy: Policy) -> Episodes:
        """``num_steps`` steps of every env (blocks); returns the episodes that ended."""
        if self.obs is None:
            self.obs = self.pool.reset()[0].copy()
        returns, lengths = [], []
        for _ in range(num_steps):
            with timer("inference"):
                env_action, stored_action = policy(self.obs)
            with timer("env_step"):
                next_obs, reward, terminated, truncated, info = self.pool.step(env_action)
            done = terminated | truncated
            stored_next = next_obs
            if done.any():
                stored_next = next_obs.copy()
                ended = np.flatnonzero(done)
                stored_next[ended] = info["final_obs"][ended]
                end = info["episode_end"]
                returns.append(info["episode_return"][end].copy())
                lengths.append(info["episode_length"][end].copy())
            self.replay.add(self.obs, stored_action, reward, stored_next, terminated, done)
            self.obs[...] = next_obs
        return Episodes.concat(returns, lengths)
