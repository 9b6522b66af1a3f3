"""The collection core: one step of every env of a pool, on the array layer, into a sink.

Every collection (`gmi_drl.rollout.collector.Collector`'s rollouts,
`gmi_drl.rollout.collector.ReplayCollector`'s transitions, a serving GMI's fragments in
`gmi_drl.runner.roles.ServingRole`) is the same sequence, written once here: the sink acts on
the policy's input, the action is clipped to a Box space and sent (`StepCore.send`), the
step is received with its observations normalised and its rewards normalised
(`StepCore.recv`), its episode ends recorded (`gmi_drl.rollout.episodes`), and the sink
writes the step where it keeps it, bootstrapping ``V(final_obs)`` where an episode was
truncated (`StepCore.final_values`) or storing the final observation as the next one
(`StepCore.next_obs`). `collect_steps` runs that loop over one pool or over the splits of a
serving GMI (acting on one split while the others step).

With a pool of device tensors (``pool.tensors``: the warp engine) every per-step array stays a
tensor on the pool's device: actions are sent as tensors, ends are recorded on the device
(`gmi_drl.rollout.episodes.DeviceEnds`), every row is bootstrapped and masked, and final
observations are selected with ``torch.where``, so nothing synchronises with the host until
the collection ends. With NumPy pools the host path is NumPy throughout (no torch op per step).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

import gymnasium as gym
import numpy as np
import torch

from gmi_drl.rollout.arrays import Array, Arrays, flatnonzero, pool_arrays
from gmi_drl.rollout.episodes import Episodes, episode_ends
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.telemetry.timer import timer


class Step(NamedTuple):
    """One step of a pool's envs, as the pool returned it (NumPy, or tensors of a tensor pool;
    valid until the pool's next step) but for the normalised reward."""

    obs: Array
    """``(n, *obs_shape)``: the observations that follow (the next episode's first where one
    ended)"""
    reward: Array
    """``(n,)``: the rewards, of the core's `Arrays` kind, normalised where the core
    has a reward normaliser"""
    terminated: Array
    """``(n,) bool``"""
    truncated: Array
    """``(n,) bool``"""
    done: Array
    """``(n,) bool``: terminated or truncated"""
    info: dict
    """the pool's ``info`` (``final_obs``, ``episode_*``)"""
    ended: bool
    """``done.any()`` on the host; always ``True`` for a pool of device tensors (whose rows
    are all recorded and masked, never read to the host)"""


def check_pool(pool) -> None:
    """Raise ``ValueError`` unless ``pool`` returns full batches in ``same_step`` mode."""
    if pool.env_batch_size != pool.num_envs or pool.autoreset.value != "same_step":
        raise ValueError(f"collection needs a full-batch pool in same_step mode, got {pool!r}")


class StepCore:
    """Steps one pool for a collection: actions out, normalised observations and rewards in.

    Args:
        pool: an `EnvPool` (or `gmi_drl.envs.warp.pool.WarpPool`) with ``env_batch_size ==
            num_envs`` and ``same_step`` autoreset.
        arrays: where the collection's arrays live (`gmi_drl.rollout.arrays.pool_arrays`
            of it: for a pool of tensors, its tensor-pool form on the pool's ``device``).
        obs_norm: observation normaliser, or ``None``.
        update_obs_stats: fold each step's observations into ``obs_norm``'s statistics (a
            serving GMI uses the trainer's, unchanged).
        reward_norm: reward normaliser, or ``None``.
        cols: this pool's envs among the collection's columns (a serving GMI's split);
            ``None``: the pool alone, all of ``reward_norm``'s envs.
        clip: clip actions to a Box action space before they are sent (the sampled action is
            what a sink stores); ``False``: send them as given (a policy that rescales).
        inputs: keep the policy's input (`input` of each step's observations) in
            ``policy_obs``; ``False``: a sink that acts on the observations as the pool
            returned them.

    Raises:
        ValueError: the pool returns partial batches or is not in ``same_step`` mode.
    """

    def __init__(self, pool, arrays: Arrays, obs_norm: ObsNormalizer | None = None,
                 update_obs_stats: bool = True, reward_norm: RewardNormalizer | None = None,
                 cols: slice | None = None, clip: bool = True, inputs: bool = True) -> None:
        check_pool(pool)
        self.on_device = bool(getattr(pool, "tensors", False))
        """the pool's outputs are tensors on its device: nothing crosses to the host"""
        self.pool, self.arrays = pool, pool_arrays(arrays, pool)
        self.obs_norm, self.update_obs_stats = obs_norm, update_obs_stats
        self.reward_norm, self.inputs = reward_norm, inputs
        self.cols = slice(0, pool.num_envs) if cols is None else cols
        self._norm_rows = slice(None) if cols is None else cols
        space = pool.action_space
        self._clip = clip and isinstance(space, gym.spaces.Box)
        if self._clip:
            self._low, self._high, self._act_dtype = space.low, space.high, space.dtype
            if self.on_device:
                self._low, self._high = (torch.as_tensor(x, device=self.arrays.device)
                                         for x in (space.low, space.high))
        self._images = pool.observation_space.dtype == np.uint8
        self.obs: Array | None = None
        """the current observations as the pool returned them (valid until its next step)"""
        self.policy_obs: Array | None = None
        """the policy's input for ``obs`` (`input`; with ``inputs``), a new array"""

    def reset(self) -> None:
        """Reset every env of the pool and take its first observations."""
        self._observe(self.pool.reset()[0])

    def refresh(self) -> None:
        """Recompute ``policy_obs`` from ``obs`` (the normaliser's statistics were replaced: a
        serving GMI's newly published weights)."""
        if self.obs is not None:
            self._observe(self.obs)

    def _observe(self, obs) -> None:
        self.obs = obs
        if self.inputs:
            self.policy_obs = self.input(self.arrays.from_pool(obs), self.update_obs_stats)

    def input(self, obs: Array, update: bool = False) -> Array:
        """The policy's input for ``obs`` (of `arrays`' kind), a new array: the normalised
        float32 observations (folded into the statistics first when ``update``), a copy of
        uint8 images, or float32 observations."""
        if self.obs_norm is not None:
            return self.arrays.float32(self.obs_norm(obs, update))
        if self._images:
            return self.arrays.copy(obs)
        return self.arrays.float32(obs)

    def _env_action(self, action: Array):
        """``action`` as the pool takes it, clipped to a Box space with ``clip``."""
        env_action = self.arrays.to_pool(action)
        if not self._clip:
            return env_action
        if isinstance(env_action, np.ndarray):
            env_action = np.minimum(np.maximum(env_action, self._low), self._high)
            return env_action.astype(self._act_dtype, copy=False)
        return env_action.clamp(self._low, self._high)

    def send(self, action: Array) -> None:
        """Send ``action`` (of `arrays`' kind; clipped to a Box space with ``clip``)."""
        env_action = self._env_action(action)
        with timer("env_step"):
            self.pool.send(env_action)

    def recv(self) -> Step:
        """The step `send` started; ``obs``/``policy_obs`` move on to its observations."""
        with timer("env_step"):
            result = self.pool.recv()
        return self._received(*result)

    def step(self, action: Array) -> Step:
        """`send` then `recv` (one pool call)."""
        env_action = self._env_action(action)
        with timer("env_step"):
            result = self.pool.step(env_action)
        return self._received(*result)

    def _received(self, obs, reward, terminated, truncated, info) -> Step:
        done = terminated | truncated
        ended = self.on_device or bool(done.any())
        self._observe(obs)
        reward = self.arrays.from_pool(reward)
        if self.reward_norm is not None:
            reward = self.reward_norm(reward, self.arrays.from_pool(done), self._norm_rows)
        return Step(obs, reward, terminated, truncated, done, info, ended)

    def final_values(self, step: Step, value: Callable[[Array], Array], out: Array) -> None:
        """``out (n,)`` (of `arrays`' kind) = ``value(input(final_obs))`` where the episode was
        truncated (bootstrapped: GAE and V-trace add ``gamma V(final_obs)``), 0 elsewhere. On
        the device every row is evaluated and masked (no host sync); on the host only the
        truncated rows."""
        if self.on_device:
            final = self.input(step.info["final_obs"])
            out[...] = value(final).where(step.truncated & ~step.terminated, 0.0)
            return
        out[...] = 0.0
        if not step.ended:
            return
        cut = flatnonzero(step.truncated & ~step.terminated)
        if len(cut):
            a = self.arrays
            out[a.from_pool(cut)] = value(self.input(a.from_pool(step.info["final_obs"][cut])))

    def next_obs(self, step: Step) -> Array:
        """``(n, *obs_shape)`` as the pool returned them: the observation that followed each
        transition, the final one (``info["final_obs"]``) where an episode ended (so a
        truncated episode bootstraps from its real last state); ``step.obs`` itself where
        none ended."""
        final = step.info.get("final_obs")
        if self.on_device:
            done = step.done.reshape(-1, *([1] * (step.obs.dim() - 1)))
            return final.where(done, step.obs)
        if not step.ended:
            return step.obs
        ended = np.flatnonzero(step.done)
        stored = step.obs.copy()
        stored[ended] = final[ended]
        return stored


class Sink(Protocol):
    """Where a collection's steps go (rollout rows, a replay buffer, a serving fragment)."""

    def act(self, t: int, core: StepCore) -> Array:
        """Step ``t``'s action for ``core``'s envs (on its current observations), of its
        `Arrays` kind, as `StepCore.send` takes it; stores what the sink keeps of it."""

    def record(self, t: int, core: StepCore, step: Step) -> None:
        """Write step ``t`` of ``core``'s envs."""

    def step_done(self, t: int) -> None:
        """Step ``t`` of every pool is recorded."""


def collect_steps(cores: list[StepCore], num_steps: int, sink: Sink) -> Episodes:
    """``num_steps`` steps of every core's envs into ``sink`` (blocks); returns the episodes
    that ended. Each core's step ``t + 1`` is acted on as soon as its step ``t`` is recorded,
    while the others' are in flight (a serving GMI's splits: Sample Factory's double-buffered
    sampling); with one core, act, step and record, step after step."""
    first = cores[0]
    ends = episode_ends(first.on_device, num_steps, sum(s.pool.num_envs for s in cores),
                        first.arrays.device)
    for s in cores:
        if s.obs is None:
            s.reset()
    if len(cores) == 1:
        for t in range(num_steps):
            with timer("inference"):
                action = sink.act(t, first)
            step = first.step(action)
            ends.record(t, first.cols, step.info, step.ended)
            sink.record(t, first, step)
            sink.step_done(t)
        return ends.episodes()
    for s in cores:
        _act(sink, 0, s)
    for t in range(num_steps):
        for s in cores:
            step = s.recv()
            ends.record(t, s.cols, step.info, step.ended)
            sink.record(t, s, step)
            if t + 1 < num_steps:
                _act(sink, t + 1, s)
        sink.step_done(t)
    return ends.episodes()


def _act(sink: Sink, t: int, core: StepCore) -> None:
    with timer("inference"):
        action = sink.act(t, core)
    core.send(action)
