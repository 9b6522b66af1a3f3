"""Advantage Actor-Critic, synchronous: one gradient step per short rollout of every env.

Source: Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning", Algorithm S3
(n-step returns bootstrapped from ``V(s_{t+n})``, the policy gradient ``log pi(a|s) A`` with an
entropy bonus, RMSprop), in its synchronous form (A2C) as Stable-Baselines3 implements it:
advantages by GAE with ``gae_lambda = 1`` (exactly the n-step advantages of the rollout),
``loss = -mean(A log pi) - ent_coef H + vf_coef mean((R - V)^2)``, RMSprop with alpha 0.99 and
eps 1e-5, global gradient clipping. Rollouts and advantages are PPO's (`gmi_drl.rollout`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from annotated_types import Ge, Gt, Interval

from gmi_drl.algos.base import AlgoContext, actor_critic_state, load_actor_critic_state
from gmi_drl.models.actor_critic import ActorCritic, build_actor_critic
from gmi_drl.rollout.acting import make_acting
from gmi_drl.rollout.collector import Collector, Episodes
from gmi_drl.rollout.storage import RolloutBuffer


@dataclass
class A2CConfig:
    """A2C hyper-parameters (defaults: Stable-Baselines3's A2C)."""

    num_steps: Annotated[int, Ge(1)] = 5
    """steps per env per rollout (n of the n-step return); a GMI's batch is
    env.num_envs * num_steps samples, one gradient step"""
    learning_rate: Annotated[float, Gt(0)] = 7e-4
    """optimizer step size (at the start, when annealed)"""
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over the run"""
    gamma: Annotated[float, Interval(ge=0, le=1)] = 0.99
    """discount factor"""
    gae_lambda: Annotated[float, Interval(ge=0, le=1)] = 1.0
    """GAE lambda (1: the n-step advantages of A2C)"""
    ent_coef: Annotated[float, Ge(0)] = 0.0
    """entropy bonus coefficient"""
    vf_coef: Annotated[float, Ge(0)] = 0.5
    """value loss coefficient"""
    max_grad_norm: Annotated[float, Gt(0)] = 0.5
    """global gradient norm bound"""
    normalize_advantage: bool = False
    """normalise the advantages of each batch (mean 0, std 1)"""
    optimizer: Literal["rmsprop", "rmsprop_tf", "adam"] = "rmsprop"
    """RMSprop (alpha 0.99, Mnih et al. 2016) in torch's form as SB3's A2C, rmsprop_tf: in
    TensorFlow's form (SB3's RMSpropTFLike, which RL-Zoo's Atari A2C sets), or Adam"""
    optimizer_eps: Annotated[float, Gt(0)] = 1e-5
    """the optimizer's epsilon"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """``num_envs * num_steps``: the samples of one GMI's rollout (its batch)."""
        return num_envs * self.num_steps

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule between these hyper-parameters and pools of ``num_envs`` envs
        (each field's own bounds are declared on it)."""
        if self.normalize_advantage and num_envs * self.num_steps <= 1:
            return ["algo.normalize_advantage needs a batch of more than one sample"]
        return []


def a2c_loss(logprob: torch.Tensor, advantages: torch.Tensor, value: torch.Tensor,
             returns: torch.Tensor, entropy: torch.Tensor, ent_coef: float,
             vf_coef: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A2C's loss for ``M`` samples (every input ``(M,) float32``): policy loss
    ``-mean(A log pi(a|s))``, value loss ``mean((R - V)^2)``, entropy ``mean H``; returns
    ``(policy_loss - ent_coef entropy + vf_coef value_loss, policy_loss, value_loss, entropy)``."""
    policy_loss = -(advantages * logprob).mean()
    value_loss = ((returns - value) ** 2).mean()
    entropy_mean = entropy.mean()
    return (policy_loss - ent_coef * entropy_mean + vf_coef * value_loss, policy_loss,
            value_loss, entropy_mean)


def a2c_objective(model: ActorCritic, obs: torch.Tensor, actions: torch.Tensor,
                  advantages: torch.Tensor, returns: torch.Tensor, *, ent_coef: float,
                  vf_coef: float) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """`a2c_loss` of ``model`` on one batch, in a `GradStep`'s shape:
    ``(loss, (policy_loss, value_loss, entropy))``."""
    new = model.evaluate(obs, actions)
    loss, pg, v, ent = a2c_loss(new.logprob, advantages, new.value, returns, new.entropy,
                                ent_coef, vf_coef)
    return loss, (pg.detach(), v.detach(), ent.detach())


class A2C:
    """The A2C learner (an `gmi_drl.algos.base.Algorithm`): one rollout of ``num_steps`` steps
    per `collect`, then its advantages; one gradient step on the whole rollout per `update`.

    Raises:
        ValueError: spaces the actor-critic does not support.
    """

    def __init__(self, cfg: A2CConfig, ctx: AlgoContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.steps_per_iteration = cfg.steps_per_iteration(ctx.num_envs)
        m, spec = ctx.model, ctx.spec
        self.model = build_actor_critic(spec.observation_space, spec.action_space, m.encoder,
                                        m.actor_hidden, m.critic_hidden, m.activation,
                                        m.cnn_features).to(ctx.device)
        loss = functools.partial(a2c_objective, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef)
        self.grad_step = ctx.make_grad_step(self.model, loss, cfg.learning_rate,
                                            cfg.max_grad_norm, cfg.optimizer_eps,
                                            optimizer=cfg.optimizer)
        self.acting = make_acting(self.model, ctx.action_generator, ctx.arrays, ctx.compile)
        self.buf = RolloutBuffer(cfg.num_steps, ctx.num_envs, spec.observation_space,
                                 spec.action_space, ctx.device)
        self.iteration = 0
        self._collector: Collector | None = None

    def collect(self, pool) -> Episodes:
        """One rollout (phase ``rollout``), then its advantages and returns (phase
        ``advantages``)."""
        if self._collector is None:
            c = self.ctx
            self._collector = Collector(pool, self.acting, c.arrays, c.obs_norm, c.reward_norm)
        with self.ctx.phase("rollout"):
            episodes = self._collector.collect(self.buf)
        with self.ctx.phase("advantages"):
            self.buf.compute_advantages(self.cfg.gamma, self.cfg.gae_lambda)
        return episodes

    def update(self) -> dict[str, float]:
        """One gradient step on the rollout. Returns ``losses/policy_loss``, ``value_loss``,
        ``entropy``, ``learning_rate``, ``explained_variance`` and the step's metrics."""
        cfg, batch, step = self.cfg, self.buf.flatten(), self.grad_step
        if cfg.anneal_lr:
            step.lr = cfg.learning_rate * (1.0 - self.iteration / self.ctx.num_iterations)
        advantages = batch.advantages
        if cfg.normalize_advantage:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        aux = step(batch.obs, batch.actions, advantages, batch.returns)
        comm = step.drain()
        self.iteration += 1
        pg, v, ent = torch.stack(aux).tolist()
        var_y = batch.returns.var()
        explained = float("nan") if var_y == 0 else float(
            1 - (batch.returns - batch.values).var() / var_y)
        return {"losses/policy_loss": pg, "losses/value_loss": v, "losses/entropy": ent,
                "losses/learning_rate": step.lr, "losses/explained_variance": explained, **comm}

    def state_dict(self) -> dict:
        """Weights (``modules``), the optimizer's state and the update count."""
        return actor_critic_state(self.model, self.grad_step, self.iteration)

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output (`load_actor_critic_state`)."""
        self.iteration = load_actor_critic_state(state, self.model, self.grad_step)

    def close(self) -> None:
        self.grad_step.close()
