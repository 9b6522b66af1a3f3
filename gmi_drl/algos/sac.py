"""Soft Actor-Critic: a maximum-entropy actor-critic for continuous actions, learned off-policy
from a replay buffer, with twin critics, a tanh-squashed Gaussian policy and an entropy
coefficient tuned towards a target entropy.

Source: Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications": the critics
regressed on ``r + gamma (min_i Q'_i(s', a') - alpha log pi(a'|s'))`` with ``a' ~ pi(.|s')``
(§4.2, with the two critics' minimum of §6), the reparameterised policy loss
``alpha log pi(a|s) - Q(s, a)`` (§4.2), ``log pi`` of the tanh-squashed Gaussian with the
change-of-variables correction (Appendix C) and the temperature loss
``-log_alpha (log pi + target_entropy)`` (§5, towards ``target_entropy = -dim(A)``). Defaults
and step order follow Stable-Baselines3's SAC (the actor's loss against the minimum of both
critics, the temperature learned as ``log alpha`` from the actor step's sample, the targets
Polyak-averaged after every critic step); CleanRL's ``sac_continuous_action.py`` adds what the
``cleanrl`` preset sets: a separate actor step size, ``policy_delay`` actor steps after every
``policy_delay``-th critic step, and the log-std bounded by tanh.

The learner is `gmi_drl.algos.ddpg.ReplayActorCritic`'s: collection, replay, schedule, targets
and checkpoint are DDPG's and TD3's. Actions are learned in ``[-1, 1]^A`` (the policy ends in
tanh) and rescaled to the task's bounds when stepped, as DDPG's; ``log pi`` is of the
``[-1, 1]`` action.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Annotated

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from annotated_types import Ge, Gt
from torch import nn

from gmi_drl.algos.ddpg import (BoundedActing, OffPolicyConfig, QCritics, ReplayActorCritic,
                               critic_target)
from gmi_drl.models.mlp import MLP
from gmi_drl.optim.flat import FlatParams
from gmi_drl.rollout.acting import NumpyForward, mlp_forward
from gmi_drl.rollout.arrays import Array, Arrays
from gmi_drl.rollout.replay import ReplayBatch


@dataclass
class SACConfig(OffPolicyConfig):
    """SAC hyper-parameters (defaults: Stable-Baselines3's SAC, but ``learning_starts``:
    `OffPolicyConfig`'s)."""

    learning_rate: Annotated[float, Gt(0)] = 3e-4
    """Adam step size of the critics and the entropy coefficient (and of the actor, unless
    policy_learning_rate is set)"""
    policy_learning_rate: Annotated[float, Gt(0)] | None = None
    """Adam step size of the actor (None: learning_rate; CleanRL: 3e-4 with 1e-3 for the
    critics)"""
    alpha: Annotated[float, Gt(0)] = 1.0
    """entropy coefficient: the initial one with autotune, the fixed one without"""
    autotune: bool = True
    """learn the entropy coefficient towards target_entropy (Haarnoja et al. 2018b §5)"""
    target_entropy: float | None = None
    """entropy the coefficient is tuned towards, nats of the [-1, 1] action (None: -dim(A))"""
    policy_delay: Annotated[int, Ge(1)] = 1
    """critic steps per actor turn; a turn takes policy_delay actor steps (CleanRL's
    policy_frequency: 2)"""
    log_std_min: float = -20.0
    """lower bound of the policy's log std (CleanRL: -5)"""
    log_std_max: float = 2.0
    """upper bound of the policy's log std"""
    log_std_tanh: bool = False
    """map the log std into its bounds with tanh (CleanRL) rather than clamp it (SB3)"""

    n_critics = 2  # the twin critics (not a field: SAC always has two)

    def _rules(self, num_envs: int) -> list[str]:
        """The log-std bounds in order."""
        if self.log_std_min < self.log_std_max:
            return []
        return [f"algo.log_std_min={self.log_std_min} must be < algo.log_std_max="
                f"{self.log_std_max}"]


class SquashedGaussianActor(nn.Module):
    """``pi(.|obs)``: ``tanh(u)``, ``u ~ N(mean(obs), exp(log_std(obs))^2)``; one MLP
    ``(N, obs_dim) -> (N, 2A)`` whose output halves are the mean and the unbounded log std
    (what Stable-Baselines3's two heads on one trunk compute)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: str, activation: str,
                 log_std_bounds: tuple[float, float], log_std_tanh: bool) -> None:
        super().__init__()
        self.mlp = MLP(f"{obs_dim}:{hidden}:{2 * action_dim}", activation, orthogonal=False)
        self.log_std_bounds, self.log_std_tanh = log_std_bounds, log_std_tanh

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)``, each ``(N, A)``; ``log_std`` in its bounds."""
        mean, raw = self.mlp(obs).chunk(2, -1)
        return mean, bound_log_std(raw, self.log_std_bounds, self.log_std_tanh)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reparameterised sample ``a = tanh(mean + std noise)`` ``(N, A)`` for standard
        normal ``noise (N, A)``, and ``log pi(a|obs)`` ``(N,)``."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), squashed_log_prob(noise, log_std, u)


def bound_log_std(raw, bounds: tuple[float, float], squash: bool):
    """``raw`` (a tensor or an array) into ``[low, high]``: clamped (SB3), or
    ``low + (high - low) (tanh(raw) + 1) / 2`` with ``squash`` (CleanRL)."""
    low, high = bounds
    if isinstance(raw, np.ndarray):
        return low + 0.5 * (high - low) * (np.tanh(raw) + 1.0) if squash else np.clip(
            raw, low, high)
    return low + 0.5 * (high - low) * (torch.tanh(raw) + 1.0) if squash else raw.clamp(low, high)


def squashed_log_prob(noise: torch.Tensor, log_std: torch.Tensor,
                      u: torch.Tensor) -> torch.Tensor:
    """``log pi(tanh(u))`` ``(N,)`` of ``u = mean + exp(log_std) noise`` (all ``(N, A)``): the
    Gaussian's ``sum_j -noise_j^2 / 2 - log_std_j - log(2 pi) / 2`` less the tanh's
    ``sum_j log(1 - tanh(u_j)^2)`` (Haarnoja et al. 2018b, Appendix C), computed as
    ``2 (log 2 - u - softplus(-2u))``, exact where ``tanh(u)`` rounds to +-1 (SB3 and CleanRL
    add 1e-6 inside the log instead)."""
    gaussian = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (gaussian - log_det).sum(-1)


class EntropyCoefficient(nn.Module):
    """The temperature ``alpha = exp(log_alpha)``, learned as ``log_alpha`` ``(1,)`` (so it
    stays positive)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.full((1,), math.log(alpha)))

    def alpha(self) -> torch.Tensor:
        """``(1,)`` ``exp(log_alpha)``, without gradient (what the other losses take)."""
        return self.log_alpha.detach().exp()


def soft_critic_objective(critics: QCritics, obs: torch.Tensor, actions: torch.Tensor,
                          rewards: torch.Tensor, next_obs: torch.Tensor,
                          terminated: torch.Tensor, discount: torch.Tensor, noise: torch.Tensor,
                          alpha: torch.Tensor, *, actor: SquashedGaussianActor,
                          critics_target: QCritics
                          ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The critics' loss on one replay minibatch in a `GradStep`'s shape: ``sum_i 0.5 mean (Q_i
    - y)^2`` with ``y = r + discount (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s'))``,
    ``a' = tanh(mean(s') + std(s') noise)`` from the current policy (no gradient through ``y``;
    Haarnoja et al. 2018b eq. 5 with the twin minimum, as SB3). ``noise`` ``(B, A)`` standard
    normal, ``alpha`` ``(1,)``. Returns ``(loss, (loss, mean Q_1))``."""
    next_action, next_logp = actor.sample(next_obs, noise)
    soft_next = critics_target(next_obs, next_action) - alpha * next_logp
    target = critic_target(soft_next, rewards, terminated, discount).detach()
    q = critics(obs, actions)
    loss = 0.5 * ((q - target) ** 2).mean(1).sum()
    return loss, (loss.detach(), q[0].detach().mean())


def soft_actor_objective(actor: SquashedGaussianActor, obs: torch.Tensor, noise: torch.Tensor,
                         alpha: torch.Tensor, *,
                         critics: QCritics) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``mean(alpha log pi(a|s) - min_i Q_i(s, a))`` with the reparameterised ``a = tanh(mean(s)
    + std(s) noise)`` (Haarnoja et al. 2018b §4.2, the minimum of both critics as SB3 and
    CleanRL), the critics' weights held constant. Returns ``(loss, (loss, log pi))``, ``log pi``
    ``(B,)`` without gradient (what the temperature's loss takes)."""
    action, logp = actor.sample(obs, noise)
    weights = {name: p.detach() for name, p in critics.named_parameters()}
    q = torch.func.functional_call(critics, weights, (obs, action), strict=True)
    loss = (alpha * logp - q.min(0).values).mean()
    return loss, (loss.detach(), logp.detach())


def alpha_objective(coef: EntropyCoefficient, logp: torch.Tensor, *,
                    target_entropy: float) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``-mean(log_alpha (log pi + target_entropy))`` for ``logp (B,)`` without gradient
    (Haarnoja et al. 2018b eq. 18 in ``log alpha``, as SB3 and CleanRL): alpha falls while the
    policy's entropy ``-log pi`` is below the target and rises above it. Returns ``(loss,
    (loss,))``."""
    loss = -(coef.log_alpha * (logp + target_entropy)).mean()
    return loss, (loss.detach(),)


class SquashedGaussianActing(BoundedActing):
    """The agent role of SAC: ``tanh(mean + std noise)`` (``deterministic``: ``tanh(mean)``)
    rescaled to the task's action bounds (`gmi_drl.algos.ddpg.BoundedActing`). The actor's MLP
    runs as `gmi_drl.rollout.acting.mlp_forward` chooses (NumPy on views of its weights on the
    CPU). Draws one standard normal per action dimension per env from the runner's generator.

    Raises:
        ValueError: an action space without finite bounds.
    """

    def __init__(self, actor: SquashedGaussianActor, critics: QCritics, space: gym.spaces.Box,
                 generator: torch.Generator, arrays: Arrays) -> None:
        super().__init__(critics, space, generator, arrays, "SAC needs")
        self.actor = actor
        self._mlp = mlp_forward(actor.mlp, actor.mlp, arrays)
        """the actor's MLP, ``(N, 2A)``: NumPy or torch as `mlp_forward` chooses"""

    def scaled(self, obs: Array, deterministic: bool = False) -> Array:
        """``(N, A) float32`` actions in ``[-1, 1]`` (what the replay stores)."""
        out = self._mlp(obs)
        if isinstance(self._mlp, NumpyForward):
            return self._squashed_numpy(out, deterministic)
        out = torch.from_numpy(out) if self._host else out
        with torch.no_grad():
            mean, raw = out.chunk(2, -1)
            log_std = bound_log_std(raw, self.actor.log_std_bounds, self.actor.log_std_tanh)
            if not deterministic:
                g = self.generator  # drawn on its device (the runner's)
                noise = torch.randn(mean.shape, generator=g, device=g.device)
                mean = mean + log_std.exp() * noise.to(mean.device)
            action = torch.tanh(mean)
        return action.numpy() if self._host else action

    def _squashed_numpy(self, out: np.ndarray, deterministic: bool) -> np.ndarray:
        mean, raw = np.split(out, 2, axis=1)
        if not deterministic:
            g = self.generator
            noise = torch.randn(mean.shape, generator=g, device=g.device).cpu().numpy()
            std = np.exp(bound_log_std(raw, self.actor.log_std_bounds, self.actor.log_std_tanh))
            mean = mean + std * noise
        return np.tanh(mean, dtype=np.float32)

    def _greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.actor(obs)[0])


class SAC(ReplayActorCritic):
    """The SAC learner (a `gmi_drl.algos.ddpg.ReplayActorCritic`: see there for the schedule):
    a `SquashedGaussianActor`, two critics and their targets (soft-updated after every critic
    step), and with ``autotune`` the `EntropyCoefficient`, each with its own `GradStep` (so
    alpha is reduced over the GMIs like the weights, and equal on all). Every draw of a
    gradient step (the target's next action, the actor's sample) is a standard normal from the
    learner's generator, in that order.

    Raises:
        ValueError: as `ReplayActorCritic`.
    """

    cfg: SACConfig
    actor_metrics = ("losses/actor_loss", "losses/alpha_loss", "losses/alpha",
                     "losses/entropy")

    def _build(self, obs_dim: int, act_dim: int) -> None:
        cfg, ctx, m = self.cfg, self.ctx, self.ctx.model
        self.actor = SquashedGaussianActor(
            obs_dim, act_dim, m.actor_hidden, m.activation,
            (cfg.log_std_min, cfg.log_std_max), cfg.log_std_tanh).to(ctx.device)
        self.critics = QCritics(obs_dim, act_dim, m.critic_hidden, m.activation,
                                cfg.n_critics).to(ctx.device)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.entropy = EntropyCoefficient(cfg.alpha).to(ctx.device)
        self.target_entropy = (-float(act_dim) if cfg.target_entropy is None
                               else cfg.target_entropy)
        critic_loss = functools.partial(soft_critic_objective, actor=self.actor,
                                        critics_target=self.critics_target)
        self.critic_step = ctx.make_grad_step(self.critics, critic_loss, cfg.learning_rate,
                                              cfg.max_grad_norm, cfg.adam_eps,
                                              weight_decay=cfg.weight_decay)
        self.actor_step = ctx.make_grad_step(
            self.actor, functools.partial(soft_actor_objective, critics=self.critics),
            cfg.policy_learning_rate or cfg.learning_rate, cfg.max_grad_norm, cfg.adam_eps,
            weight_decay=cfg.weight_decay)
        self._steps = {"critics": self.critic_step, "actor": self.actor_step}
        self.alpha_step = None
        if cfg.autotune:
            self.alpha_step = ctx.make_grad_step(
                self.entropy, functools.partial(alpha_objective,
                                                target_entropy=self.target_entropy),
                cfg.learning_rate, cfg.max_grad_norm, cfg.adam_eps)
            self._steps["entropy"] = self.alpha_step
        self.critic_step.follow(FlatParams(self.critics_target), cfg.tau)
        self._module_names = ("actor", "critics", "critics_target", "entropy")
        self.acting = self.make_acting(ctx.arrays)

    def make_acting(self, arrays: Arrays) -> SquashedGaussianActing:
        """The squashed Gaussian policy, on ``arrays``."""
        return SquashedGaussianActing(self.actor, self.critics, self.ctx.spec.action_space,
                                      self.ctx.action_generator, arrays)

    def _noise(self, like: torch.Tensor) -> torch.Tensor:
        """``(B, A)`` standard normal from the learner's generator, on ``like``'s device."""
        g = self.generator
        return torch.randn(like.shape, generator=g, device=g.device).to(like.device)

    def _critic_update(self, batch: ReplayBatch) -> tuple[torch.Tensor, ...]:
        return self.critic_step(*batch, self._noise(batch.actions), self.entropy.alpha())

    def _actor_steps(self, batch: ReplayBatch) -> torch.Tensor:
        """``policy_delay`` actor steps on ``batch.obs`` (fresh noise each), each followed by a
        step of the temperature on that step's ``log pi`` (SB3 and CleanRL)."""
        rows = []
        for _ in range(self.cfg.policy_delay):
            alpha = self.entropy.alpha()
            loss, logp = self.actor_step(batch.obs, self._noise(batch.actions), alpha)
            alpha_loss = (self.alpha_step(logp)[0] if self.alpha_step is not None
                          else torch.zeros((), device=loss.device))
            rows.append(torch.stack([loss, alpha_loss, alpha[0], -logp.mean()]))
        return torch.stack(rows).mean(0)
