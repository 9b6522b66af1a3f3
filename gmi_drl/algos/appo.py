"""Asynchronous PPO: the clipped objective on V-trace advantages, learned from fragments that
serving GMIs collected with older weights.

Sources: IMPALA (Espeholt et al. 2018, §4: V-trace targets ``v_s`` for the critic and
``rho_s (r_s + gamma v_{s+1} - V(x_s))`` as the policy-gradient advantage), with PPO's clipped
surrogate (Schulman et al. 2017, eq. 7) on the ratio to the behaviour policy, as Sample Factory's
APPO (Petrenko et al. 2020) combines them. The learner is the trainer role of the
``async_training`` template (`gmi_drl.runner.roles`; `gmi_drl.algos.async_learner`); serving GMIs
act with the weights it publishes (`weights`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated

import torch
from annotated_types import Ge, Gt, Interval

from gmi_drl.algos.async_learner import AsyncLearner, evaluate, normalized
from gmi_drl.models.actor_critic import ActorCritic
from gmi_drl.rollout.vtrace import vtrace


@dataclass
class APPOConfig:
    """APPO hyper-parameters (defaults: Sample Factory 2's rollout of 32, adam_eps 1e-6, one
    epoch of one minibatch and V-trace rho-bar and c-bar of 1; learning_rate, clip_coef,
    ent_coef and max_grad_norm are CleanRL's continuous-control PPO values)."""

    num_steps: Annotated[int, Ge(1)] = 32
    """T: steps per env in one fragment (Sample Factory's rollout)"""
    fragments_per_batch: Annotated[int, Ge(1)] = 4
    """fragments of one serving GMI's env.num_envs envs in one trainer batch (F); a trainer's
    batch is F * env.num_envs * num_steps samples"""
    learning_rate: Annotated[float, Gt(0)] = 3e-4
    """Adam step size"""
    gamma: Annotated[float, Interval(ge=0, le=1)] = 0.99
    """discount factor"""
    vtrace_rho: Annotated[float, Gt(0)] = 1.0
    """rho-bar of V-trace (truncation of the importance weight in the value target)"""
    vtrace_c: Annotated[float, Gt(0)] = 1.0
    """c-bar of V-trace (truncation of the trace coefficients)"""
    vtrace_lambda: Annotated[float, Interval(ge=0, le=1)] = 1.0
    """the trace's lambda (IMPALA Remark 2)"""
    num_minibatches: Annotated[int, Ge(1)] = 1
    """minibatches per epoch, each of whole trajectories (env columns)"""
    update_epochs: Annotated[int, Ge(1)] = 1
    """passes over each batch"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch (mean 0, std 1)"""
    clip_coef: Annotated[float, Gt(0)] = 0.2
    """surrogate clipping epsilon on the ratio to the behaviour policy"""
    ent_coef: Annotated[float, Ge(0)] = 0.0
    """entropy bonus coefficient"""
    vf_coef: Annotated[float, Ge(0)] = 0.5
    """value loss coefficient"""
    max_grad_norm: Annotated[float, Gt(0)] = 0.5
    """global gradient norm bound"""
    adam_eps: Annotated[float, Gt(0)] = 1e-6
    """Adam epsilon"""

    template = "async_training"
    """the GMI template this algorithm runs in (not a flag)"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """Samples of one trainer update: ``fragments_per_batch * num_envs * num_steps``."""
        return self.fragments_per_batch * num_envs * self.num_steps

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule between these hyper-parameters and pools of ``num_envs`` envs
        (each field's own bounds are declared on it)."""
        F, M = self.fragments_per_batch, self.num_minibatches
        if M < 1 or F < 1:
            return []
        checks = [
            ((F * num_envs) % M == 0,
             f"algo.num_minibatches={M} must divide the {F * num_envs} trajectories of a batch "
             "(fragments_per_batch * env.num_envs)"),
            (not self.norm_adv or F * num_envs * self.num_steps >= 2 * M,
             f"algo.num_minibatches={M} leaves minibatches of one sample "
             f"(a batch of {F * num_envs * self.num_steps}: fragments_per_batch * env.num_envs "
             "* algo.num_steps): normalising advantages needs 2 or more (their std); lower "
             "--algo.num-minibatches, raise the batch, or pass --algo.no-norm-adv"),
        ]
        return [msg for ok, msg in checks if not ok]


def appo_objective(model: ActorCritic, obs, actions, logprobs, rewards, terminated, truncated,
                   final_values, last_obs, *, gamma: float, rho_bar: float, c_bar: float,
                   lam: float, clip_coef: float, ent_coef: float, vf_coef: float,
                   norm_adv: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """APPO's loss on one minibatch of ``M`` trajectories (``(T, M, ...)`` tensors,
    ``last_obs (M, *obs_shape)``), in a `GradStep`'s shape: ``(loss, (policy_loss,
    value_loss, entropy, log_rhos))``.

    ``log_rhos = log pi(a|s) - log mu(a|s)``; V-trace (`gmi_drl.rollout.vtrace.vtrace`, on
    detached values) gives ``vs`` and the advantages; policy loss ``mean(max(-A rho,
    -A clip(rho, 1 - eps, 1 + eps)))``; value loss ``0.5 mean((V - vs)^2)``.
    """
    logprob, entropy, values, boot = evaluate(model, obs, actions, last_obs)
    log_rhos = logprob - logprobs
    vt = vtrace(log_rhos.detach(), rewards, values.detach(), boot.detach(), terminated,
                truncated, final_values, gamma, rho_bar=rho_bar, c_bar=c_bar, lam=lam)
    adv = normalized(vt.pg_advantages) if norm_adv else vt.pg_advantages
    ratio = log_rhos.exp()
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    v_loss = 0.5 * ((values - vt.vs) ** 2).mean()
    ent = entropy.mean()
    loss = pg_loss - ent_coef * ent + vf_coef * v_loss
    return loss, (pg_loss.detach(), v_loss.detach(), ent.detach(), log_rhos.detach())


class APPO(AsyncLearner):
    """The APPO learner: `appo_objective` with Adam, ``update_epochs`` passes of
    ``num_minibatches`` minibatches over each batch (`AsyncLearner`)."""

    def objective(self):
        c = self.cfg
        return functools.partial(appo_objective, gamma=c.gamma, rho_bar=c.vtrace_rho,
                                 c_bar=c.vtrace_c, lam=c.vtrace_lambda, clip_coef=c.clip_coef,
                                 ent_coef=c.ent_coef, vf_coef=c.vf_coef, norm_adv=c.norm_adv)

    def optimizer_eps(self) -> float:
        return self.cfg.adam_eps

    def passes(self) -> tuple[int, int]:
        return self.cfg.update_epochs, self.cfg.num_minibatches
