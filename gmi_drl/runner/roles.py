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

import numpy as np
import torch

from gmi_drl.comm.channels import Batcher, Dispenser
from gmi_drl.comm.weights import WeightStore
from gmi_drl.rollout.acting import Acting
from gmi_drl.rollout.arrays import Array, HostArrays
from gmi_drl.rollout.episodes import Episodes
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.rollout.core import Step, StepCore, collect_steps
from gmi_drl.telemetry.timer import timer


class ServingRole:
    """Serving GMI ``serving``: its pools, a copy of the policy, a dispenser.

    Each step is the collection core's (`gmi_drl.rollout.core.collect_steps`), with this
    role as its sink: the fragment's rows. With one pool, each step acts on every env and then
    steps them. With ``k`` pools (the env splits; Sample Factory's double-buffered sampling),
    the role acts on one split while the pools' threads step the others: ``send`` returns at
    once and ``recv`` collects a split's results, so inference overlaps the physics of native
    engines. A fragment's columns are the splits' envs in order, and every step of it is acted
    with one ``policy_version``: weights are picked up only between fragments, when no split is
    in flight.

    Pools of device tensors (the warp engine on a GPU: ``pool.tensors``) keep every per-step
    array on their device: the role writes the fragment into tensors there and copies it into
    the channel's host memory once per fragment, one copy per field (UCC, which sends every
    step, copies each step's row as it is sent), and published weights are copied to the
    device once per version. Fragments are host shared memory (`gmi_drl.comm.channels`: rings
    that trainers of other processes read), so they cannot live on the device themselves.

    Args:
        pools: full-batch ``same_step`` pools whose envs together are the ``B`` columns of a
            fragment, in order (all NumPy, or all tensors on one device).
        model: the policy's module (its tensors are overwritten by published weights), where
            the pools' arrays are (`gmi_drl.rollout.arrays.pool_arrays`).
        acting: `make_acting` of ``model`` for those arrays.
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
        self._weights = list(model.state_dict().values())
        if obs_norm is not None:
            self._weights += [obs_norm.rms.mean, obs_norm.rms.var]
        self.targets = [_host_view(w) for w in self._weights]
        """host arrays the store reads into: views of CPU weights, buffers for device ones"""
        self.policy_version = -1  # none loaded: the first pull takes the first publication
        bounds = np.cumsum([0] + [p.num_envs for p in pools])
        splits = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self.cores = [StepCore(pool, HostArrays(), obs_norm, update_obs_stats=False,
                                     reward_norm=reward_norm,
                                     cols=cols if len(pools) > 1 else None)
                         for pool, cols in zip(pools, splits)]
        self.arrays = self.cores[0].arrays
        self._on_device = self.cores[0].on_device
        plan = dispenser.plan
        self._device_frag = ({f.name: torch.zeros(f.shape, dtype=_torch_dtype(f.dtype),
                                                  device=self.arrays.device)
                              for f in plan.fields if f.name != "policy_version"}
                             if self._on_device else None)
        self._next_obs = None  # (B, *obs_shape): the observations after the latest step
        self._frag: dict | None = None
        self.env_steps = 0

    def pull_weights(self) -> bool:
        """Load the newest published weights if they are newer (never blocks)."""
        version = self.store.read_into(self.targets, newer_than=self.policy_version)
        if version is None:
            return False
        for w, host in zip(self._weights, self.targets):
            if isinstance(w, torch.Tensor) and w.device.type != "cpu":
                w.copy_(torch.from_numpy(host))
        self.policy_version = version
        return True

    def collect(self) -> Episodes:
        """One fragment of ``T`` steps of every env into the dispenser (blocks only while its
        channel is full); returns the episodes that ended."""
        with timer("weights"):
            if self.pull_weights() and self.obs_norm is not None:
                for s in self.cores:  # the current observations, with the new statistics
                    s.refresh()
        d = self.dispenser
        self._frag = d.begin(self.policy_version)
        if self._next_obs is None:
            shape = self._frag["last_obs"].shape
            self._next_obs = (self._device_frag["last_obs"] if self._on_device
                              else np.zeros(shape, self._frag["last_obs"].dtype))
        episodes = collect_steps(self.cores, d.plan.num_steps, self)
        d.end()
        self.env_steps += d.plan.num_steps * d.plan.num_envs
        return episodes

    def act(self, t: int, core: StepCore) -> Array:
        """(`gmi_drl.rollout.core.Sink`) Row ``t`` of the split's observations (raw),
        actions and log-probabilities."""
        frag, cols = self._rows(), core.cols
        frag["obs"][t, cols] = core.arrays.from_pool(core.obs)
        action, logprob, _ = self.acting.act(core.policy_obs)
        frag["actions"][t, cols] = action
        frag["logprobs"][t, cols] = logprob
        return action

    def record(self, t: int, core: StepCore, step: Step) -> None:
        """(`gmi_drl.rollout.core.Sink`) Row ``t`` of the split's step; its observations
        into the next ones."""
        frag, cols, a = self._rows(), core.cols, core.arrays
        info = step.info
        frag["rewards"][t, cols] = step.reward
        frag["terminated"][t, cols] = a.from_pool(step.terminated)
        frag["truncated"][t, cols] = a.from_pool(step.truncated)
        core.final_values(step, self.acting.value, frag["final_values"][t, cols])
        end = a.from_pool(info["episode_end"])  # Atari with episodic life: whole games only
        frag["episode_end"][t, cols] = end
        frag["episode_return"][t, cols] = _ended(end, a.from_pool(info["episode_return"]))
        frag["episode_length"][t, cols] = _ended(end, a.from_pool(info["episode_length"]))
        self._next_obs[cols] = a.from_pool(step.obs)

    def step_done(self, t: int) -> None:
        """(`gmi_drl.rollout.core.Sink`) Hand step ``t`` to the dispenser; a device
        fragment is copied to the host first: whole after its last step, or (UCC) row ``t``."""
        d, frag = self.dispenser, self._frag
        with timer("dispense"):
            if self._on_device:
                last = t == d.plan.num_steps - 1
                if last or d.plan.mode == "uni":
                    for name, x in self._device_frag.items():
                        rows = x if last or name == "last_obs" else x[t]
                        host = frag[name] if last or name == "last_obs" else frag[name][t]
                        torch.from_numpy(host).copy_(rows)
                d.step_done(t, frag["last_obs"])
            else:
                d.step_done(t, self._next_obs)

    def _rows(self) -> dict:
        return self._device_frag if self._on_device else self._frag


def _ended(end: Array, x: Array) -> Array:
    """``x`` where an episode ended, 0 elsewhere."""
    return x.where(end, 0) if isinstance(x, torch.Tensor) else np.where(end, x, 0)


def _host_view(w: np.ndarray | torch.Tensor) -> np.ndarray:
    """A host array for the weight store to read ``w`` into: ``w`` itself (NumPy), its memory
    (a CPU tensor), or a buffer that `ServingRole.pull_weights` copies to the device."""
    if isinstance(w, np.ndarray):
        return w
    if w.device.type == "cpu":
        return w.numpy()
    return np.empty(tuple(w.shape), torch.empty(0, dtype=w.dtype).numpy().dtype)


def _torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


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
