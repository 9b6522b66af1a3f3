"""Deep Deterministic Policy Gradient: an actor-critic for continuous actions, learned off-policy
from a replay buffer with target networks.

Source: Lillicrap et al. 2016, "Continuous control with deep reinforcement learning",
Algorithm 1 (the critic regressed on ``r + gamma Q'(s', mu'(s'))``, the actor ascending
``Q(s, mu(s))``, soft target updates with ``tau``); Gaussian exploration noise and the schedule
(uniform random actions for ``learning_starts`` steps, then ``gradient_steps`` per
``train_frequency`` env steps) as Stable-Baselines3's DDPG and TD3. `gmi_drl.algos.td3` adds the
three changes of Fujimoto et al. 2018 on the same code: twin critics, target policy smoothing
and delayed policy updates (DDPG is that learner with one critic, no smoothing and no delay,
as in Stable-Baselines3). `ReplayActorCritic` and `OffPolicyConfig` are what they share with
`gmi_drl.algos.sac` (collection, replay, schedule, targets, checkpoint).

Actions are learned in ``[-1, 1]^A`` (the actor ends in tanh) and rescaled to the task's bounds
when stepped; the replay stores the rescaled-to-``[-1, 1]`` action.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Annotated, Callable

import gymnasium as gym
import numpy as np
import torch
from annotated_types import Ge, Gt, Interval
from torch import nn

from gmi_drl.algos.base import AlgoContext, load_modules
from gmi_drl.models.actor_critic import ActResult
from gmi_drl.models.mlp import MLP
from gmi_drl.optim.flat import FlatParams
from gmi_drl.rollout.acting import mlp_forward
from gmi_drl.rollout.arrays import Array, Arrays, HostArrays, pool_arrays
from gmi_drl.rollout.collector import Episodes, ReplayCollector
from gmi_drl.rollout.replay import (FrameReplayBuffer, ReplayBatch, ReplayBuffer, make_replay,
                                   refill_steps, replay_config_errors, warmup_errors)


@dataclass
class OffPolicyConfig:
    """What the replay actor-critics (DDPG, TD3, SAC) share: the replay, the schedule, the
    targets and the optimizer (defaults: Stable-Baselines3's DDPG/TD3). Each algorithm's config
    derives from it and adds its own terms and rules (`_rules`)."""

    learning_rate: Annotated[float, Gt(0)] = 1e-3
    """Adam step size of the actor and the critic"""
    buffer_size: Annotated[int, Ge(1)] = 1_000_000
    """replay capacity of each GMI, transitions"""
    learning_starts: Annotated[int, Ge(0)] = 256
    """env steps of a GMI taken with uniform random actions before the first gradient step (at
    least minibatch_size, rounded to whole iterations; Stable-Baselines3's 100 would draw
    256-transition minibatches from 100, which `validate` refuses)"""
    minibatch_size: Annotated[int, Ge(1)] = 256
    """transitions per gradient step (each GMI samples its own)"""
    tau: Annotated[float, Interval(gt=0, le=1)] = 0.005
    """soft update rate of the target networks"""
    gamma: Annotated[float, Interval(ge=0, le=1)] = 0.99
    """discount factor"""
    n_step: Annotated[int, Ge(1)] = 1
    """rewards per critic target: n-step returns, cut where an episode ended (1: the papers'
    one-step target)"""
    train_frequency: Annotated[int, Ge(1)] = 1
    """steps of every env per iteration (an iteration is num_envs * train_frequency env steps)"""
    gradient_steps: Annotated[int, Ge(1)] = 1
    """gradient steps of the critic per iteration"""
    max_grad_norm: Annotated[float, Gt(0)] = math.inf
    """global gradient norm bound of each network (inf: none, as Stable-Baselines3)"""
    adam_eps: Annotated[float, Gt(0)] = 1e-8
    """Adam epsilon"""
    weight_decay: Annotated[float, Ge(0)] = 0.0
    """decoupled weight decay of the actor's and the critics' Adam (AdamW; FastTD3 uses 0.1
    with its large critics); 0: Adam"""
    save_replay: bool = False
    """put the replay buffer in checkpoints (a resumed run of one GMI then trains on it at
    once; without it, and with several GMIs, whose checkpoint would hold GMI 0's alone, a
    resumed run refills its buffers for learning_starts env steps first, at most the buffer's
    size and half the steps left; the files grow by the buffer's size)"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """``num_envs * train_frequency``."""
        return num_envs * self.train_frequency

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule between these hyper-parameters and pools of ``num_envs`` envs:
        the replay's (`replay_config_errors`, `warmup_errors`) and a subclass's (`_rules`);
        each field's own bounds are declared on it."""
        return (self._rules(num_envs)
                + replay_config_errors(self.buffer_size, self.minibatch_size, self.n_step,
                                       num_envs)
                + warmup_errors(self.learning_starts, self.minibatch_size,
                                self.steps_per_iteration(num_envs)))

    def _rules(self, num_envs: int) -> list[str]:
        """The broken rules between fields that a subclass adds (none here)."""
        return []


@dataclass
class DeterministicPGConfig(OffPolicyConfig):
    """What DDPG and TD3 share (defaults: Stable-Baselines3's, but for the exploration noise,
    which SB3 leaves off and RL-Zoo sets, and `OffPolicyConfig`'s ``learning_starts``). `DDPGConfig` and
    `gmi_drl.algos.td3.TD3Config` each derive from it, neither from the other, so a config
    always names its own algorithm."""

    exploration_noise: Annotated[float, Ge(0)] = 0.1
    """std of the Gaussian noise added to the actor's action in [-1, 1] units (0.1: Fujimoto
    et al. 2018 §6.1 and RL-Zoo); with ``exploration_noise_max``, the least std of mixed
    noise"""
    exploration_noise_max: Annotated[float, Ge(0)] = 0.0
    """0: every env explores with std ``exploration_noise``. Above it: mixed noise, each env's
    std drawn uniformly from ``[exploration_noise, exploration_noise_max]`` and drawn again
    when its episode ends, so thousands of parallel worlds explore at many scales at once
    (FastTD3, Seo et al. 2025, §3: 0.001 to 0.4)"""

    def _rules(self, num_envs: int) -> list[str]:
        """Mixed noise's range in order."""
        hi, lo = self.exploration_noise_max, self.exploration_noise
        if 0 < hi < lo:
            return [f"algo.exploration_noise_max={hi} must be 0 (one std for every env) or >= "
                    f"algo.exploration_noise={lo} (the least std of mixed noise)"]
        return []

    # DDPG's values of TD3's terms (TD3Config makes them fields)
    n_critics = 1
    policy_delay = 1
    target_policy_noise = 0.0
    target_noise_clip = 0.0


@dataclass
class DDPGConfig(DeterministicPGConfig):
    """DDPG hyper-parameters (defaults: `DeterministicPGConfig`'s)."""


class DeterministicActor(nn.Module):
    """``mu(obs) = tanh(MLP(obs))``: ``(N, obs_dim) -> (N, A)`` in ``[-1, 1]``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: str, activation: str) -> None:
        super().__init__()
        self.mlp = MLP(f"{obs_dim}:{hidden}:{action_dim}", activation, orthogonal=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mlp(obs))


class QCritics(nn.Module):
    """``n`` independent critics ``Q_i(obs, action)``, each an MLP on the concatenation:
    ``(N, obs_dim), (N, A) -> (n, N)``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: str, activation: str,
                 n: int) -> None:
        super().__init__()
        self.q = nn.ModuleList(MLP(f"{obs_dim + action_dim}:{hidden}:1", activation,
                                   orthogonal=False) for _ in range(n))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], 1)
        return torch.stack([q(x).squeeze(-1) for q in self.q])

    def q1(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The first critic only, ``(N,)``: what the actor ascends."""
        return self.q[0](torch.cat([obs, actions], 1)).squeeze(-1)


def critic_target(q_next: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor,
                  discount: torch.Tensor | float) -> torch.Tensor:
    """``r + discount (1 - terminated) min_i Q'_i(s', a')`` for ``q_next (n, B)`` (with one
    critic the minimum is DDPG's target; with two, TD3's clipped double-Q, Fujimoto et al. eq.
    10); ``discount`` is ``gamma``, or ``(B,)`` ``gamma ** m`` after an n-step sum of ``m``
    rewards (`gmi_drl.rollout.replay.ReplayBatch`)."""
    return rewards + discount * (1.0 - terminated) * q_next.min(0).values


def smoothed_target_action(next_action: torch.Tensor, noise: torch.Tensor, scale: float,
                           clip: float) -> torch.Tensor:
    """TD3's target policy smoothing (Fujimoto et al. eq. 14): ``clip(mu'(s') + clip(scale
    noise, -clip, clip), -1, 1)`` for standard normal ``noise (B, A)``."""
    return (next_action + (noise * scale).clamp(-clip, clip)).clamp(-1.0, 1.0)


def critic_objective(critics: QCritics, obs: torch.Tensor, actions: torch.Tensor,
                     rewards: torch.Tensor, next_obs: torch.Tensor, terminated: torch.Tensor,
                     discount: torch.Tensor, noise: torch.Tensor | None = None, *,
                     actor_target: nn.Module, critics_target: nn.Module, target_policy_noise: float,
                     target_noise_clip: float) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The critics' loss on one replay minibatch in a `GradStep`'s shape: the sum over critics
    of the mean squared error to `critic_target` (no gradient through the target; the target
    networks' forwards join the compiled step). ``noise`` (standard normal, ``(B, A)``) smooths
    the target action when ``target_policy_noise > 0``. Returns ``(loss, (loss, mean Q_1))``."""
    next_action = actor_target(next_obs)
    if noise is not None and target_policy_noise > 0:
        next_action = smoothed_target_action(next_action, noise, target_policy_noise,
                                             target_noise_clip)
    target = critic_target(critics_target(next_obs, next_action), rewards, terminated,
                           discount).detach()
    q = critics(obs, actions)
    loss = ((q - target) ** 2).mean(1).sum()
    return loss, (loss.detach(), q[0].detach().mean())


def actor_objective(actor: DeterministicActor, obs: torch.Tensor, *,
                    critics: QCritics) -> tuple[torch.Tensor, tuple[torch.Tensor]]:
    """``-mean Q_1(s, mu(s))`` (the deterministic policy gradient, Silver et al. 2014), with the
    critics' weights held constant: no gradient reaches them. Returns ``(loss, (loss,))``."""
    weights = {name: p.detach() for name, p in critics.named_parameters()}
    q = torch.func.functional_call(critics, weights, (obs, actor(obs)), strict=True)
    loss = -q[0].mean()
    return loss, (loss.detach(),)


class BoundedActing:
    """What the agent roles of the replay actor-critics share (the
    `gmi_drl.rollout.acting.Acting` protocol over a policy in ``[-1, 1]^A``): actions rescaled
    to the task's bounds (`to_env`), ``act`` with ``logprob`` and ``value`` 0 (a policy without
    a state value; Q is only computed by `value`), and ``value = Q_1(obs, greedy(obs))``. A
    subclass gives `scaled` (the action the replay stores) and `_greedy`.

    Raises:
        ValueError: an action space without finite bounds (``who``: the algorithm, named).
    """

    def __init__(self, critics: QCritics, space: gym.spaces.Box, generator: torch.Generator,
                 arrays: Arrays, who: str) -> None:
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            raise ValueError(f"{who} finite action bounds, got {space}")
        self.critics, self.generator, self.arrays = critics, generator, arrays
        self._host = isinstance(arrays, HostArrays)
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        self.dtype = space.dtype
        self._bounds = (self.low, self.high) if self._host else tuple(
            torch.as_tensor(x, device=arrays.device) for x in (self.low, self.high))

    def scaled(self, obs: Array, deterministic: bool = False) -> Array:
        """``(N, A) float32`` actions in ``[-1, 1]`` (what the replay stores)."""
        raise NotImplementedError

    def episodes_ended(self, done: Array) -> None:
        """Where the envs whose episode ended (``done (N,) bool``, as `arrays`') change how they
        explore (nothing here)."""

    def _greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's action without exploration, ``(N, A)`` in ``[-1, 1]`` (no grad)."""
        raise NotImplementedError

    def to_env(self, scaled: Array) -> Array:
        """``[-1, 1]`` actions rescaled to ``[low, high]`` (arrays of `arrays`' kind)."""
        low, high = self._bounds
        return low + (scaled + 1.0) * 0.5 * (high - low)

    def act(self, obs: Array, deterministic: bool = False) -> ActResult:
        action = self.to_env(self.scaled(obs, deterministic))
        zeros = self.arrays.full((len(action),), 0.0)
        return ActResult(action, zeros, zeros)

    def value(self, obs: Array) -> Array:
        """``Q_1(obs, greedy(obs))`` ``(N,)``."""
        x = torch.from_numpy(obs) if self._host else obs
        with torch.no_grad():
            x = x.float()
            q = self.critics.q1(x, self._greedy(x))
        return q.numpy() if self._host else q


class GaussianExploration(BoundedActing):
    """The agent role of DDPG/TD3: ``clip(mu(obs) + std N(0, 1), -1, 1)`` rescaled to the
    task's action bounds (`BoundedActing`). ``std`` is ``noise`` for every env, or with
    ``noise_max > noise`` each env's own, uniform in ``[noise, noise_max]`` and drawn again
    where an episode ended (`episodes_ended`; FastTD3's mixed noise, Seo et al. 2025 §3).
    The actor of an MLP on the CPU runs in NumPy on views of its weights. Draws one standard
    normal per action dimension per env (and one uniform per env at each end) from the
    runner's generator.

    Raises:
        ValueError: an action space without finite bounds.
    """

    def __init__(self, actor: DeterministicActor, critics: QCritics, space: gym.spaces.Box,
                 noise: float, generator: torch.Generator, arrays: Arrays,
                 noise_max: float = 0.0) -> None:
        super().__init__(critics, space, generator, arrays, "DDPG/TD3 need")
        self.actor, self.noise, self.noise_max = actor, noise, max(noise_max, noise)
        self._mu = mlp_forward(actor, actor.mlp, arrays, post=np.tanh)
        """``mu(obs) (N, A)`` in ``[-1, 1]``, arrays of ``arrays``' kind"""
        self.stds: Array | None = None
        """mixed noise: ``(N, 1)`` each env's std (drawn at the first action), else ``None``"""

    @property
    def mixed(self) -> bool:
        return self.noise_max > self.noise

    def _draw(self, shape: tuple[int, ...], uniform: bool = False) -> Array:
        """Standard normal (or uniform in [0, 1)) draws from the generator, as `arrays`'."""
        g = self.generator  # drawn on its device (the runner's, a GPU's with --device cuda)
        x = (torch.rand if uniform else torch.randn)(shape, generator=g, device=g.device)
        return x.cpu().numpy() if self._host else x.to(self.arrays.device)

    def _new_stds(self, n: int) -> Array:
        return self.noise + (self.noise_max - self.noise) * self._draw((n, 1), uniform=True)

    def scaled(self, obs: Array, deterministic: bool = False) -> Array:
        """``(N, A) float32`` actions in ``[-1, 1]`` (what the replay stores)."""
        action = self._mu(obs)
        if deterministic or self.noise_max == 0:
            return action
        std = self.noise
        if self.mixed:
            if self.stds is None or len(self.stds) != len(action):
                self.stds = self._new_stds(len(action))
            std = self.stds
        noise = self._draw(tuple(action.shape))
        if self._host:
            action += std * noise
            return np.clip(action, -1.0, 1.0, out=action)
        return (action + std * noise).clamp_(-1.0, 1.0)

    def episodes_ended(self, done: Array) -> None:
        """Mixed noise: a new std for each env whose episode ended (``done (N,) bool``, as
        `arrays`'; on a device without reading it on the host). Otherwise nothing."""
        if not self.mixed or self.stds is None:
            return
        fresh = self._new_stds(len(self.stds))
        if self._host:
            np.copyto(self.stds, fresh, where=np.asarray(done)[:, None])
        else:
            self.stds = torch.where(done.reshape(-1, 1), fresh, self.stds)

    def _greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)


class ReplayActorCritic:
    """What the replay actor-critics (`DDPG`, TD3's, `gmi_drl.algos.sac.SAC`) share: the task
    checks, the collection into the replay buffer, the schedule of critic and actor steps, the
    soft target updates and the checkpoint (an `gmi_drl.algos.base.Algorithm`).

    ``collect`` steps every env ``train_frequency`` times into the replay buffer (uniform random
    actions for the first ``learning_starts`` env steps); ``update`` takes ``gradient_steps``
    critic steps, after every ``policy_delay``-th one the actor's steps (`_actor_steps`). Each
    network has its own `GradStep` (each a collective over the trainers); each target network
    follows its network's step (`GradStep.follow`: a soft update after every step of the actor,
    and after every ``policy_delay``-th of the critics, or every one for SAC), where the step
    is taken: with stale-sync steps on their LWU thread, so the steps' pipelines are drained
    only where the weights must agree (`drain`, which the runner calls at logged and
    checkpointed iterations).

    A subclass's `_build` makes ``actor``, ``critics``, ``critic_step``, ``actor_step``,
    ``acting``, the targets' `GradStep.follow`, ``_steps`` (``{name: GradStep}``, the critics'
    first: the optimizers of the checkpoint, named as their modules, drained in that order) and
    ``_module_names`` (the checkpoint's modules, targets included).

    With observation normalisation (``--norm.obs``; FastTD3 and FastSAC use it) the replay
    keeps the observations as the pool returned them; every collected step folds into the
    runner's statistics, the actor acts on the normalised observations, and each sampled
    minibatch's ``obs`` and ``next_obs`` are normalised with the statistics of the moment (as
    FastTD3 does), on the replay's device.

    Raises:
        ValueError: a non-Box action space or one without finite bounds; reward normalisation
            (the replay stores the rewards); observations that are not a 1-d Box, or an encoder
            other than ``mlp``.
    """

    actor_metrics: tuple[str, ...] = ("losses/actor_loss",)
    """names of what `_actor_steps` returns, in its order"""

    def __init__(self, cfg: OffPolicyConfig, ctx: AlgoContext) -> None:
        spec = ctx.spec
        if not isinstance(spec.action_space, gym.spaces.Box):
            raise ValueError(f"{type(self).__name__} needs a Box action space, {spec.task_id} "
                             f"has {spec.action_space}")
        if ctx.reward_norm is not None:
            raise ValueError(f"{type(self).__name__} learns from the rewards as stored in its "
                             "replay: run without --norm.reward")
        shape = spec.observation_space.shape
        if ctx.model.encoder != "mlp" or not isinstance(
                spec.observation_space, gym.spaces.Box) or len(shape or ()) != 1:
            raise ValueError(f"{type(self).__name__} builds MLP actor and critics on flat "
                             f"observations: {spec.task_id} has {spec.observation_space}, "
                             f"--model.encoder is {ctx.model.encoder!r} (use mlp)")
        self.cfg, self.ctx = cfg, ctx
        self.steps_per_iteration = cfg.steps_per_iteration(ctx.num_envs)
        obs_dim = int(np.prod(spec.observation_space.shape))
        self.action_dim = int(np.prod(spec.action_space.shape))
        self._build(obs_dim, self.action_dim)
        self.replay: ReplayBuffer | FrameReplayBuffer | None = None  # the first collect makes it
        self._refill_until = 0
        """env steps at which a run resumed without its replay trains again (counted in env
        steps, the same on every GMI, so that all GMIs take their first step together)"""
        self._actor_means: dict[str, torch.Tensor] = {}  # of the latest iteration with actor steps
        # replay sampling and the update's noise, drawn on the learner's device: no per-step
        # host-to-device copy of minibatch indices or noise on a GPU
        self.generator = torch.Generator(ctx.device).manual_seed(ctx.seed)
        self.env_steps, self.critic_updates, self.iteration = 0, 0, 0
        self._collector: ReplayCollector | None = None

    def _build(self, obs_dim: int, action_dim: int) -> None:
        """Make the networks, their steps, the targets and the acting (see the class doc)."""
        raise NotImplementedError

    def _critic_update(self, batch: ReplayBatch) -> tuple[torch.Tensor, ...]:
        """One critic step on ``batch``; returns ``(loss, mean Q_1)``."""
        raise NotImplementedError

    def _actor_steps(self, batch: ReplayBatch) -> torch.Tensor:
        """The actor's steps after a ``policy_delay``-th critic step on ``batch``; returns
        ``(len(actor_metrics),)``: their means."""
        raise NotImplementedError

    def collect(self, pool) -> Episodes:
        """``train_frequency`` steps of every env (phase ``rollout``) into the replay buffer."""
        with self.ctx.phase("rollout"):
            if self._collector is None:
                self._start(pool)
            return self._collector.collect(self.cfg.train_frequency, self._policy,
                                           self._episodes_ended)

    def _policy(self, obs: Array) -> tuple[Array, Array]:
        """`gmi_drl.rollout.collector.Policy`: uniform actions for ``learning_starts`` env
        steps (as SB3), then the acting's (``acting.scaled``); both in ``[-1, 1]`` (stored)
        and rescaled to the bounds (stepped), arrays as the pool returns and takes them."""
        arrays, acting, norm = self._arrays, self.acting, self.ctx.obs_norm
        x = arrays.from_pool(obs)
        if norm is not None:  # (folded in during the warm-up too: ready when learning starts)
            x = arrays.float32(norm(x, update=True))
        if self.env_steps < self.cfg.learning_starts:
            g = self.ctx.action_generator
            u = torch.rand((len(obs), self.action_dim), generator=g, device=g.device)
            scaled = (u * 2.0 - 1.0).to(arrays.device) if self._on_device else (
                u.cpu().numpy() * 2.0 - 1.0)
        else:
            scaled = arrays.to_pool(acting.scaled(x))
        self.env_steps += len(obs)
        if self._on_device:  # the acting's bounds are tensors on the pool's device
            return acting.to_env(scaled), scaled
        env_action = acting.low + (scaled + 1.0) * 0.5 * (acting.high - acting.low)
        return env_action.astype(acting.dtype, copy=False), scaled

    def _episodes_ended(self, done: Array) -> None:
        self.acting.episodes_ended(self._arrays.from_pool(done))

    def _start(self, pool) -> None:
        spec, cfg = self.ctx.spec, self.cfg
        if self.replay is None:
            self.replay = make_replay(cfg.buffer_size, spec, self.ctx.num_envs, self.ctx.device,
                                      n_step=cfg.n_step, gamma=cfg.gamma)
        self._collector = ReplayCollector(pool, self.replay)
        self._arrays = pool_arrays(self.ctx.arrays, pool)
        self._on_device = bool(getattr(pool, "tensors", False))
        if self._on_device:  # a pool of tensors: act on them where they are, never in NumPy
            self.acting = self.make_acting(self._arrays)

    def make_acting(self, arrays: Arrays):
        """The policy as it acts on ``arrays`` (the runner's, or a pool of tensors' on its
        device; ``scaled`` / ``to_env`` / ``act`` / ``value``, as `GaussianExploration`)."""
        raise NotImplementedError

    def update(self) -> dict[str, torch.Tensor]:
        """``gradient_steps`` critic steps once ``learning_starts`` env steps were taken (none
        before), each ``policy_delay``-th followed by the actor's steps (the targets follow
        their steps). Returns ``losses/critic_loss``, ``losses/q_values`` (means over the
        critic steps) and the `actor_metrics` (means over the actor steps of the latest
        iteration that had any: with ``policy_delay`` an iteration may have none), as 0-d
        tensors on the learner's device (no host sync per iteration); stale-sync steps are not
        drained here (`drain`)."""
        cfg = self.cfg
        self.iteration += 1
        if self.env_steps < cfg.learning_starts:
            return {}
        if self.env_steps < self._refill_until:  # resumed without its replay: refill first
            return {}
        critic_aux, actor_aux = [], []
        normalize = self._batch_normalizer()
        for _ in range(cfg.gradient_steps):
            batch = normalize(self.replay.sample(cfg.minibatch_size, self.generator))
            critic_aux.append(torch.stack(self._critic_update(batch)))
            self.critic_updates += 1
            if self.critic_updates % cfg.policy_delay == 0:
                actor_aux.append(self._actor_steps(batch))
        # 0-d tensors where the steps ran: read to the host only where a row is logged
        means = torch.stack(critic_aux).mean(0)
        metrics = {"losses/critic_loss": means[0], "losses/q_values": means[1]}
        if actor_aux:
            self._actor_means = dict(zip(self.actor_metrics,
                                         torch.stack(actor_aux).mean(0).unbind()))
        metrics.update(self._actor_means)  # (delayed: a logged iteration may have no actor step)
        return metrics

    def _batch_normalizer(self) -> Callable[[ReplayBatch], ReplayBatch]:
        """A minibatch with ``obs`` and ``next_obs`` normalised by the runner's statistics of
        now (float32 on the replay's device; the same clip as acting), or as sampled without
        observation normalisation."""
        norm = self.ctx.obs_norm
        if norm is None:
            return lambda batch: batch
        device = self.replay.obs.device
        mean, var = (torch.as_tensor(x).to(device, torch.float32)
                     for x in (norm.rms.mean, norm.rms.var))
        std = (var + norm.eps).sqrt()

        def normalize(batch: ReplayBatch) -> ReplayBatch:
            return batch._replace(obs=((batch.obs - mean) / std).clamp(-norm.clip, norm.clip),
                                  next_obs=((batch.next_obs - mean) / std).clamp(-norm.clip,
                                                                                 norm.clip))
        return normalize

    def drain(self) -> dict[str, float]:
        """End the overlap of the stale-sync steps (`GradStep.drain`, the critics' first):
        every step taken is in the weights and targets, identical on every GMI (a collective:
        every GMI calls it at the same iteration). Returns the steps' metrics since the last
        drain (none for synchronous steps)."""
        metrics = {}
        for step in self._steps.values():
            metrics.update(step.drain())
        return metrics

    def state_dict(self) -> dict:
        """The networks (``modules``, targets included), the optimizers, the sampling RNG, the
        counters and, with ``save_replay``, the replay buffer."""
        state = {"modules": {name: module.state_dict()
                             for name, module in self._modules_by_name().items()},
                 "optimizers": {name: step.state_dict() for name, step in self._steps.items()},
                 "generator": self.generator.get_state(), "iteration": self.iteration,
                 "env_steps": self.env_steps, "critic_updates": self.critic_updates}
        if self.cfg.save_replay and self.replay is not None:
            state["replay"] = self.replay.state_dict()
        return state

    def _modules_by_name(self) -> dict:
        return {name: getattr(self, name) for name in self._module_names}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output.

        Raises:
            ValueError: the stored weights or optimizers do not fit this model.
        """
        load_modules(self._modules_by_name(), state["modules"])
        for name, step in self._steps.items():
            step.load_state_dict(state["optimizers"][name])
        self.generator.set_state(state["generator"])
        self.iteration, self.env_steps = int(state["iteration"]), int(state["env_steps"])
        self.critic_updates = int(state["critic_updates"])
        left = self.ctx.num_iterations * self.steps_per_iteration - self.env_steps
        self._refill_until = 0 if "replay" in state else self.env_steps + refill_steps(
            self.cfg.learning_starts, self.cfg.buffer_size, left)
        if "replay" in state:
            self.replay = make_replay(self.cfg.buffer_size, self.ctx.spec, self.ctx.num_envs,
                                      self.ctx.device, state["replay"], self.cfg.n_step,
                                      self.cfg.gamma)

    def close(self) -> None:
        for step in self._steps.values():
            step.close()


class DDPG(ReplayActorCritic):
    """The DDPG learner (a `ReplayActorCritic`: see there for the schedule), and TD3's through
    the config's ``n_critics``, ``policy_delay`` and target smoothing terms: a deterministic
    actor, ``n_critics`` critics, a target of each, one actor step per ``policy_delay`` critic
    steps.

    Raises:
        ValueError: as `ReplayActorCritic`.
    """

    cfg: DeterministicPGConfig

    def _build(self, obs_dim: int, act_dim: int) -> None:
        cfg, ctx, m = self.cfg, self.ctx, self.ctx.model
        self.actor = DeterministicActor(obs_dim, act_dim, m.actor_hidden,
                                        m.activation).to(ctx.device)
        self.critics = QCritics(obs_dim, act_dim, m.critic_hidden, m.activation,
                                cfg.n_critics).to(ctx.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        critic_loss = functools.partial(
            critic_objective, actor_target=self.actor_target,
            critics_target=self.critics_target,
            target_policy_noise=cfg.target_policy_noise, target_noise_clip=cfg.target_noise_clip)
        self.critic_step = ctx.make_grad_step(self.critics, critic_loss, cfg.learning_rate,
                                              cfg.max_grad_norm, cfg.adam_eps,
                                              weight_decay=cfg.weight_decay)
        self.actor_step = ctx.make_grad_step(
            self.actor, functools.partial(actor_objective, critics=self.critics),
            cfg.learning_rate, cfg.max_grad_norm, cfg.adam_eps, weight_decay=cfg.weight_decay)
        self.actor_step.follow(FlatParams(self.actor_target), cfg.tau)
        self.critic_step.follow(FlatParams(self.critics_target), cfg.tau, cfg.policy_delay)
        self._steps = {"critics": self.critic_step, "actor": self.actor_step}
        self._module_names = ("actor", "critics", "actor_target", "critics_target")
        self.acting = self.make_acting(ctx.arrays)

    def make_acting(self, arrays: Arrays) -> GaussianExploration:
        """The actor with Gaussian exploration noise, on ``arrays``."""
        return GaussianExploration(self.actor, self.critics, self.ctx.spec.action_space,
                                   self.cfg.exploration_noise, self.ctx.action_generator, arrays,
                                   self.cfg.exploration_noise_max)

    def _critic_update(self, batch: ReplayBatch) -> tuple[torch.Tensor, ...]:
        if self.cfg.target_policy_noise > 0:  # TD3's smoothing noise, from the learner's RNG
            g = self.generator
            noise = torch.randn(batch.actions.shape, generator=g, device=g.device)
            batch = (*batch, noise.to(batch.actions.device))
        return self.critic_step(*batch)

    def _actor_steps(self, batch: ReplayBatch) -> torch.Tensor:
        return torch.stack(self.actor_step(batch[0]))
