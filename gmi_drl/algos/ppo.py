"""Proximal Policy Optimization with a clipped surrogate objective.

Source: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (PPO paper), eq. 7 (the
clipped surrogate L^CLIP) and eq. 9 (``L^CLIP - c1 L^VF + c2 S``); the implementation details
(value clipping, per-minibatch advantage normalisation, global gradient clipping, linear learning
rate annealing, Adam eps 1e-5) follow CleanRL's ``ppo.py`` / ``ppo_continuous_action.py``
(Huang et al. 2022, "The 37 Implementation Details of PPO").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, NamedTuple

import torch
from annotated_types import Ge, Gt, Interval

from gmi_drl.algos.base import AlgoContext, actor_critic_state, load_actor_critic_state
from gmi_drl.models.actor_critic import ActorCritic, build_actor_critic
from gmi_drl.rollout.acting import make_acting
from gmi_drl.rollout.collector import Collector, Episodes
from gmi_drl.rollout.storage import Batch, RolloutBuffer


@dataclass
class PPOConfig:
    """PPO hyper-parameters (defaults: CleanRL ``ppo.py``)."""

    num_steps: Annotated[int, Ge(1)] = 128
    """steps per env per rollout (T); a GMI's batch is env.num_envs * num_steps samples"""
    learning_rate: Annotated[float, Gt(0)] = 2.5e-4
    """Adam step size (at the start, when annealed)"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run"""
    gamma: Annotated[float, Interval(ge=0, le=1)] = 0.99
    """discount factor"""
    gae_lambda: Annotated[float, Interval(ge=0, le=1)] = 0.95
    """GAE lambda"""
    num_minibatches: Annotated[int, Ge(1)] = 4
    """minibatches per epoch (every GMI cuts its batch into as many)"""
    update_epochs: Annotated[int, Ge(1)] = 4
    """passes over each batch"""
    norm_adv: bool = True
    """normalise advantages per minibatch (mean 0, std 1)"""
    clip_coef: Annotated[float, Gt(0)] = 0.2
    """surrogate clipping epsilon (PPO paper eq. 7), also the value clipping range"""
    clip_vloss: bool = True
    """clip the value loss around the old values"""
    ent_coef: Annotated[float, Ge(0)] = 0.01
    """entropy bonus coefficient (c2)"""
    vf_coef: Annotated[float, Ge(0)] = 0.5
    """value loss coefficient (c1)"""
    max_grad_norm: Annotated[float, Gt(0)] = 0.5
    """global gradient norm bound"""
    target_kl: Annotated[float, Gt(0)] | None = None
    """stop the epochs of an update once the approximate KL exceeds this (None: never)"""
    adam_eps: Annotated[float, Gt(0)] = 1e-5
    """Adam epsilon"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """``num_envs * num_steps``: the samples of one GMI's rollout (its batch)."""
        return num_envs * self.num_steps

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule between these hyper-parameters, pools of ``num_envs`` envs and
        ``num_gmis`` GMIs (each field's own bounds are declared on it)."""
        errors = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                errors.append(msg)

        batch = self.steps_per_iteration(num_envs)
        if self.num_minibatches >= 1 and batch >= 1:
            need(batch % self.num_minibatches == 0,
                 f"env.num_envs * algo.num_steps={batch} must be a multiple of "
                 f"algo.num_minibatches={self.num_minibatches}")
            need(not self.norm_adv or batch >= 2 * self.num_minibatches,
                 f"algo.num_minibatches={self.num_minibatches} leaves minibatches of "
                 f"{batch // self.num_minibatches} sample (env.num_envs * algo.num_steps="
                 f"{batch}): normalising advantages needs 2 or more (their std); lower "
                 "--algo.num-minibatches, raise the batch, or pass --algo.no-norm-adv")
        need(num_gmis == 1 or self.target_kl is None,
             f"algo.target_kl={self.target_kl} with gmi.num_gmis={num_gmis}: GMIs would stop "
             "their epochs at different points and break the gradient collective; use "
             "target_kl None")
        return errors


class PPOLoss(NamedTuple):
    """Loss terms of one minibatch."""

    loss: torch.Tensor
    """0-d, ``policy_loss - ent_coef * entropy + vf_coef * value_loss`` (with grad)"""
    policy_loss: torch.Tensor
    """0-d"""
    value_loss: torch.Tensor
    """0-d"""
    entropy: torch.Tensor
    """0-d, mean policy entropy"""
    logratio: torch.Tensor
    """``(M,)``, ``log pi_new - log pi_old`` (feed to `approx_kl` / `clip_fraction`)"""


def normalize_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """``(A - mean) / (std + 1e-8)`` over the last dim (unbiased std, as CleanRL)."""
    return (advantages - advantages.mean(-1, keepdim=True)) / (advantages.std(-1, keepdim=True) + 1e-8)


def ppo_loss(new_logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor,
             new_value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor,
             entropy: torch.Tensor, clip_coef: float, clip_vloss: bool, vf_coef: float,
             ent_coef: float, norm_adv: bool) -> PPOLoss:
    """PPO's loss for one minibatch of ``M`` samples (every input ``(M,) float32``).

    ``ratio = exp(new_logprob - old_logprob)``; policy loss ``mean(max(-A ratio,
    -A clip(ratio, 1-eps, 1+eps)))`` (the negated L^CLIP of eq. 7); value loss
    ``0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))`` when ``clip_vloss``,
    else ``0.5 mean((V - R)^2)``; ``A`` normalised within the minibatch when ``norm_adv``
    (`PPO.update` normalises all minibatches of an epoch at once and passes ``False``).
    """
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    if norm_adv:
        advantages = normalize_advantages(advantages)
    pg_loss = torch.max(-advantages * ratio,
                        -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        v_clipped = old_value + torch.clamp(new_value - old_value, -clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    entropy_mean = entropy.mean()
    loss = pg_loss - ent_coef * entropy_mean + vf_coef * v_loss
    return PPOLoss(loss, pg_loss, v_loss, entropy_mean, logratio)


def approx_kl(logratio: torch.Tensor) -> torch.Tensor:
    """``mean((ratio - 1) - log ratio)``: Schulman's low-variance estimator of KL(old || new)."""
    return (torch.expm1(logratio) - logratio).mean()


def clip_fraction(logratio: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """Fraction of samples whose ratio left ``[1 - clip_coef, 1 + clip_coef]``."""
    return (torch.expm1(logratio).abs() > clip_coef).float().mean()


def ppo_objective(model: ActorCritic, obs: torch.Tensor, actions: torch.Tensor,
                  logprobs: torch.Tensor, values: torch.Tensor, advantages: torch.Tensor,
                  returns: torch.Tensor, *, clip_coef: float, clip_vloss: bool, vf_coef: float,
                  ent_coef: float) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """`ppo_loss` of ``model`` on one minibatch (advantages already normalised), in the shape a
    `gmi_drl.optim.grad_step.GradStep` takes: ``(loss, (policy_loss, value_loss, entropy,
    logratio))``."""
    new = model.evaluate(obs, actions)
    out = ppo_loss(new.logprob, logprobs, advantages, new.value, values, returns, new.entropy,
                   clip_coef, clip_vloss, vf_coef, ent_coef, norm_adv=False)
    return out.loss, (out.policy_loss, out.value_loss, out.entropy, out.logratio)


class PPO:
    """The PPO learner (an `gmi_drl.algos.base.Algorithm`): one rollout per `collect`, then GAE;
    minibatch SGD epochs over it per `update`.

    Args:
        cfg: hyper-parameters; ``env.num_envs * num_steps`` must be a multiple of
            ``num_minibatches``.
        ctx: the task, the trainer's gradient step factory and the runner's parts.

    Raises:
        ValueError: the batch is not a multiple of ``num_minibatches``; spaces the actor-critic
            does not support.
    """

    def __init__(self, cfg: PPOConfig, ctx: AlgoContext) -> None:
        self.steps_per_iteration = cfg.steps_per_iteration(ctx.num_envs)
        if self.steps_per_iteration % cfg.num_minibatches:
            raise ValueError(f"batch of {self.steps_per_iteration} samples must be a multiple "
                             f"of num_minibatches={cfg.num_minibatches}")
        self.cfg, self.ctx = cfg, ctx
        m, spec = ctx.model, ctx.spec
        self.model = build_actor_critic(spec.observation_space, spec.action_space, m.encoder,
                                        m.actor_hidden, m.critic_hidden, m.activation,
                                        m.cnn_features).to(ctx.device)
        loss = functools.partial(ppo_objective, clip_coef=cfg.clip_coef,
                                 clip_vloss=cfg.clip_vloss, vf_coef=cfg.vf_coef,
                                 ent_coef=cfg.ent_coef)
        self.grad_step = ctx.make_grad_step(self.model, loss, cfg.learning_rate,
                                            cfg.max_grad_norm, cfg.adam_eps)
        self.acting = make_acting(self.model, ctx.action_generator, ctx.arrays, ctx.compile)
        self.buf = RolloutBuffer(cfg.num_steps, ctx.num_envs, spec.observation_space,
                                 spec.action_space, ctx.device)
        self.gmi_minibatch_size = self.steps_per_iteration // cfg.num_minibatches
        self.generator = torch.Generator().manual_seed(ctx.seed)  # minibatch order
        self.iteration = 0
        self._collector: Collector | None = None
        self._shuffled: Batch | None = None

    def collect(self, pool) -> Episodes:
        """One rollout of ``num_steps`` steps of every env (phase ``rollout``), then its
        advantages and returns (phase ``advantages``)."""
        if self._collector is None:
            c = self.ctx
            self._collector = Collector(pool, self.acting, c.arrays, c.obs_norm, c.reward_norm)
        with self.ctx.phase("rollout"):
            episodes = self._collector.collect(self.buf)
        with self.ctx.phase("advantages"):
            self.buf.compute_advantages(self.cfg.gamma, self.cfg.gae_lambda)
        return episodes

    def update(self) -> dict[str, float]:
        """``update_epochs`` epochs of minibatch SGD on the last rollout.

        Each epoch permutes the batch once into preallocated tensors, so minibatches are
        contiguous views, and normalises the advantages of all its minibatches at once (each
        within its own minibatch). Returns means over the minibatches run of
        ``losses/policy_loss``, ``value_loss``, ``entropy``, ``approx_kl`` and ``clipfrac`` (the
        last two from the log-ratios of every sample), plus ``losses/learning_rate``,
        ``losses/explained_variance`` and the gradient step's metrics. ``target_kl`` stops after
        the first epoch whose mean approximate KL exceeds it (CleanRL checks the epoch's last
        minibatch instead).
        """
        cfg, batch, step = self.cfg, self.buf.flatten(), self.grad_step
        n, mb, n_mb = self.steps_per_iteration, self.gmi_minibatch_size, cfg.num_minibatches
        if cfg.anneal_lr:
            step.lr = cfg.learning_rate * (1.0 - self.iteration / self.ctx.num_iterations)
        if self._shuffled is None:
            self._shuffled = Batch(*(torch.empty_like(x) for x in batch))
            self._minibatches = [tuple(x[start:start + mb] for x in self._shuffled)
                                 for start in range(0, n, mb)]
        shuffled, aux = self._shuffled, []
        for epoch in range(cfg.update_epochs):
            if n_mb > 1:  # one minibatch = the whole batch: its order does not matter
                perm = torch.randperm(n, generator=self.generator).to(self.ctx.device)
                for src, dst in zip(batch, shuffled):
                    torch.index_select(src, 0, perm, out=dst)
            else:
                for src, dst in zip(batch, shuffled):
                    dst.copy_(src)
            if cfg.norm_adv:
                adv = shuffled.advantages.view(n_mb, mb)
                adv.copy_(normalize_advantages(adv))
            aux += [step(*minibatch) for minibatch in self._minibatches]
            if cfg.target_kl is not None:
                kl = approx_kl(torch.cat([a[3] for a in aux[-n_mb:]]))
                if kl.item() > cfg.target_kl:
                    break
        comm = step.drain()
        self.iteration += 1
        logratio = torch.cat([a[3] for a in aux])
        means = torch.stack([torch.stack(a[:3]) for a in aux]).mean(0).tolist()
        var_y = batch.returns.var()
        explained = float("nan") if var_y == 0 else float(1 - (batch.returns - batch.values).var() / var_y)
        return {"losses/policy_loss": means[0], "losses/value_loss": means[1],
                "losses/entropy": means[2], "losses/approx_kl": float(approx_kl(logratio)),
                "losses/clipfrac": float(clip_fraction(logratio, cfg.clip_coef)),
                "losses/learning_rate": step.lr, "losses/explained_variance": explained, **comm}

    def state_dict(self) -> dict:
        """Weights (``modules``), optimizer moments, the shuffling RNG and the update count."""
        return actor_critic_state(self.model, self.grad_step, self.iteration, self.generator)

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output (`load_actor_critic_state`)."""
        self.iteration = load_actor_critic_state(state, self.model, self.grad_step,
                                                 self.generator)

    def close(self) -> None:
        self.grad_step.close()
