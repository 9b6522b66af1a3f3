"""The two roles of the ``async_training`` template as objects (GMI-DRL §5.1, Fig. 6(b)): the
same code runs in one process (serial mode: one of each, alternating) or one role per GMI
process (`gmi_drl.runner.async_loop`).

- `ServingRole` (simulator + agent): steps its pool with the newest published weights, writes
  each fragment into its dispenser, and never waits for an update: it picks a newer
  ``policy_version`` up between fragments when there is one.
- `TrainerRole`: takes batches from its batcher, drops fragments older than the policy-lag
  bound (counted), updates the learner and publishes the weights as the next version.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from gmi_drl.comm.channels import Batcher, Dispenser
from gmi_drl.comm.weights import WeightStore
from gmi_drl.rollout.acting import Acting
from gmi_drl.rollout.collector import Episodes
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.telemetry.timer import timer


class ServingRole:
    """Serving GMI ``serving``: its pools, a copy of the policy, a dispenser.

    With one pool, each step acts on every env and then steps them. With ``k`` pools (the
    env splits; Sample Factory's double-buffered sampling), the role acts on one split while the
    pools' threads step the others: ``send`` returns at once and ``recv`` collects a split's
    results, so inference overlaps the physics of native engines. A fragment's columns are the
    splits' envs in order, and every step of it is acted with one ``policy_version``: weights
    are picked up only between fragments, when no split is in flight.

    Args:
        pools: full-batch ``same_step`` pools whose envs together are the ``B`` columns of a
            fragment, in order.
        model: the policy's module (its tensors are overwritten by published weights).
        acting: `make_acting` of ``model``.
        obs_norm: the trainer's observation statistics (loaded with the weights, never
            updated here), or ``None``.
        reward_norm: this serving GMI's reward normaliser over the ``B`` envs, or ``None``.
        dispenser: where fragments go. store: where weights come from.
    """

    def __init__(self, pools: list, model: torch.nn.Module, acting: Acting,
                 obs_norm: ObsNormalizer | None, reward_norm: RewardNormalizer | None,
                 dispenser: Dispenser, store: WeightStore) -> None:
        self.pools, self.acting, self.dispenser, self.store = pools, acting, dispenser, store
        self.obs_norm, self.reward_norm = obs_norm, reward_norm
        self.targets = [t.numpy() for t in model.state_dict().values()]
        if obs_norm is not None:
            self.targets += [obs_norm.rms.mean, obs_norm.rms.var]
        self.policy_version = -1  # none loaded: the first pull takes the first publication
        bounds = np.cumsum([0] + [p.num_envs for p in pools])
        self._splits = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        space = pools[0].action_space
        self._clip = (space.low, space.high, space.dtype) if isinstance(space, gym.spaces.Box) \
            else None
        self._obs: np.ndarray | None = None
        self.env_steps = 0

    def pull_weights(self) -> bool:
        """Load the newest published weights if they are newer (never blocks)."""
        version = self.store.read_into(self.targets, newer_than=self.policy_version)
        if version is None:
            return False
        self.policy_version = version
        return True

    def _input(self, obs: np.ndarray) -> np.ndarray:
        if self.obs_norm is not None:
            return self.obs_norm(obs, update=False).astype(np.float32)
        return obs if obs.dtype == np.uint8 else obs.astype(np.float32, copy=False)

    def collect(self) -> Episodes:
        """One fragment of ``T`` steps of every env into the dispenser (blocks only while its
        channel is full); returns the episodes that ended."""
        with timer("weights"):
            self.pull_weights()
        if self._obs is None:
            self._obs = np.concatenate([pool.reset()[0] for pool in self.pools])
        d = self.dispenser
        frag = d.begin(self.policy_version)
        T = d.plan.num_steps
        returns, lengths = [], []
        for s in range(len(self.pools)):
            self._act(frag, 0, s)
        for t in range(T):
            for s, pool in enumerate(self.pools):
                with timer("env_step"):
                    result = pool.recv()
                self._record(frag, t, s, result, returns, lengths)
                if t + 1 < T:
                    self._act(frag, t + 1, s)
            with timer("dispense"):
                d.step_done(t, self._obs)
        d.end()
        self.env_steps += T * len(self._obs)
        return Episodes.concat(returns, lengths)

    def _act(self, frag: dict, t: int, s: int) -> None:
        """Act on split ``s``'s observations (row ``t`` of the fragment) and send the actions."""
        cols = self._splits[s]
        obs = self._obs[cols]
        frag["obs"][t, cols] = obs
        with timer("inference"):
            action, logprob, _ = self.acting.act(self._input(obs))
        frag["actions"][t, cols] = action
        frag["logprobs"][t, cols] = logprob
        if self._clip is not None:
            low, high, dtype = self._clip
            action = np.clip(action, low, high).astype(dtype, copy=False)
        with timer("env_step"):
            self.pools[s].send(action)

    def _record(self, frag: dict, t: int, s: int, result, returns: list,
                lengths: list) -> None:
        """Write split ``s``'s step result into row ``t``; its next observations into
        ``self._obs``."""
        obs, reward, terminated, truncated, info = result
        cols = self._splits[s]
        done = terminated | truncated
        frag["rewards"][t, cols] = (reward if self.reward_norm is None
                                    else self.reward_norm(reward, done, cols))
        frag["terminated"][t, cols], frag["truncated"][t, cols] = terminated, truncated
        frag["final_values"][t, cols] = 0.0
        end = info["episode_end"]  # Atari with episodic life: whole games only
        frag["episode_end"][t, cols] = end
        frag["episode_return"][t, cols] = np.where(end, info["episode_return"], 0.0)
        frag["episode_length"][t, cols] = np.where(end, info["episode_length"], 0)
        if done.any():
            returns.append(info["episode_return"][end].copy())
            lengths.append(info["episode_length"][end].copy())
            cut = np.flatnonzero(truncated & ~terminated)
            if len(cut):
                frag["final_values"][t, cols.start + cut] = self.acting.value(
                    self._input(info["final_obs"][cut]))
        self._obs[cols] = obs


class TrainerUpdate(NamedTuple):
    """What one `TrainerRole.update` did."""

    metrics: dict[str, float]
    episodes: Episodes
    """the episodes that ended in the batch's fragments"""
    lags: np.ndarray
    """``(F,) int64``: policy lag of each fragment trained on (trainer version minus the
    fragment's, at the update)"""


class TrainerRole:
    """Trainer GMI: batcher -> learner update -> publish.

    Args:
        learner: an `gmi_drl.algos.base.AsyncAlgorithm` (``learn(batch)``, ``policy_version``, ``weights()``).
        batcher: this trainer's batcher.
        store: where weights go (trainer 0 publishes; other trainers hold identical weights
            and normalise observations with the statistics trainer 0 published last).
        publish: whether this trainer publishes.
        max_policy_lag: drop fragments more than this many versions old; ``None``: keep all.
    """

    def __init__(self, learner, batcher: Batcher, store: WeightStore, publish: bool = True,
                 max_policy_lag: int | None = None) -> None:
        self.learner, self.batcher, self.store = learner, batcher, store
        self.publish, self.max_policy_lag = publish, max_policy_lag
        self._follow = (not publish and learner.ctx.obs_norm is not None)
        self._scratch = [np.empty_like(a) for a in learner.weights()] if self._follow else []
        self._seen = -1
        if publish:
            store.publish(learner.weights(), learner.policy_version)

    def update(self, block: bool = True,
               timeout_s: float | None = None) -> TrainerUpdate | None:
        """One update from the next batch; ``None`` when ``block`` is false and no whole
        batch is there yet.

        Raises:
            ChannelClosed: the run stopped while waiting. TimeoutError: no experience for
            ``timeout_s`` seconds.
        """
        b = self.batcher
        if self.max_policy_lag is not None:
            b.min_version = self.learner.policy_version - self.max_policy_lag
        with timer("batch"):
            if not b.next(block, timeout_s):
                return None
        batch = b.batch
        B = b.plan.num_envs
        versions = batch["policy_version"][::B].cpu().numpy()
        lags = self.learner.policy_version - versions
        ends = batch["episode_end"]
        episodes = Episodes(batch["episode_return"][ends].double().cpu().numpy(),
                            batch["episode_length"][ends].long().cpu().numpy())
        if self._follow:  # normalise as the publishing trainer (and the serving GMIs) do
            version = self.store.read_into(self._scratch, newer_than=self._seen)
            if version is not None:
                self._seen = version
                self.learner.set_obs_stats(self._scratch[-2], self._scratch[-1])
        with timer("learn"):
            metrics = self.learner.learn(batch, update_obs_stats=not self._follow)
        if self.publish:
            with timer("publish"):
                self.store.publish(self.learner.weights(), self.learner.policy_version)
        metrics["async/policy_lag_mean"] = float(lags.mean())
        metrics["async/policy_lag_max"] = float(lags.max())
        metrics["async/stale_dropped"] = float(b.stale_dropped)
        return TrainerUpdate(metrics, episodes, lags)
