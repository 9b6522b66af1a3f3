"""Asynchronous advantage actor-critic in GA3C form: serving GMIs act, trainer GMIs learn.

Sources: Mnih et al. 2016, Algorithm S3 (n-step returns bootstrapped from ``V(s_{t+n})``, the
policy gradient ``log pi(a|s) A`` with an entropy bonus, RMSprop); Babaeizadeh et al. 2017,
"GA3C" (the GMI-DRL paper ref. [2]): agents queue experience to a central trainer on the GPU
instead of each holding a copy of the network, and the policy lag this leaves is not corrected.
Here the agents are serving GMIs and the queues are the experience channels; returns are the n-step
returns of each fragment (V-trace with every ratio 1, `gmi_drl.rollout.vtrace`), the loss is
A2C's (`gmi_drl.algos.a2c.a2c_loss`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from annotated_types import Ge, Gt, Interval

from gmi_drl.algos.a2c import a2c_loss
from gmi_drl.algos.async_learner import AsyncLearner, evaluate, normalized
from gmi_drl.models.actor_critic import ActorCritic
from gmi_drl.rollout.vtrace import vtrace


@dataclass
class A3CConfig:
    """A3C hyper-parameters (defaults: Mnih et al. 2016's t_max 5, RMSprop and entropy beta 0.01;
    the rest SB3's A2C values)."""

    num_steps: Annotated[int, Ge(1)] = 5
    """T: steps per env in one fragment (t_max, the n of the n-step return)"""
    fragments_per_batch: Annotated[int, Ge(1)] = 4
    """fragments in one trainer batch (F); one gradient step per batch"""
    learning_rate: Annotated[float, Gt(0)] = 7e-4
    """optimizer step size"""
    gamma: Annotated[float, Interval(ge=0, le=1)] = 0.99
    """discount factor"""
    ent_coef: Annotated[float, Ge(0)] = 0.01
    """entropy bonus coefficient (0.01: Mnih et al. 2016's beta)"""
    vf_coef: Annotated[float, Ge(0)] = 0.5
    """value loss coefficient"""
    max_grad_norm: Annotated[float, Gt(0)] = 0.5
    """global gradient norm bound"""
    normalize_advantage: bool = False
    """normalise the advantages of each batch"""
    optimizer: Literal["rmsprop", "rmsprop_tf", "adam"] = "rmsprop"
    """RMSprop (alpha 0.99; torch's form), rmsprop_tf (TensorFlow's form, SB3's RMSpropTFLike)
    or Adam"""
    optimizer_eps: Annotated[float, Gt(0)] = 1e-5
    """the optimizer's epsilon"""

    template = "async_training"
    """the GMI template this algorithm runs in (not a flag)"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """Samples of one trainer update: ``fragments_per_batch * num_envs * num_steps``."""
        return self.fragments_per_batch * num_envs * self.num_steps

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule between these hyper-parameters and pools of ``num_envs`` envs
        (each field's own bounds are declared on it)."""
        if self.normalize_advantage and self.steps_per_iteration(num_envs) == 1:
            return ["algo.normalize_advantage needs a batch of more than one sample "
                    "(fragments_per_batch * env.num_envs * algo.num_steps); raise one of them"]
        return []


def a3c_objective(model: ActorCritic, obs, actions, logprobs, rewards, terminated, truncated,
                  final_values, last_obs, *, gamma: float, ent_coef: float, vf_coef: float,
                  normalize_advantage: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """A3C's loss on ``M`` trajectories (`appo_objective`'s arguments): n-step returns ``R``
    of each fragment under the current critic, advantages ``R - V``, `a2c_loss`. The
    behaviour log-probabilities only give the ratio reported (GA3C corrects nothing)."""
    logprob, entropy, values, boot = evaluate(model, obs, actions, last_obs)
    vt = vtrace(torch.zeros_like(rewards), rewards, values.detach(), boot.detach(), terminated,
                truncated, final_values, gamma)
    adv = normalized(vt.pg_advantages) if normalize_advantage else vt.pg_advantages
    loss, pg, v, ent = a2c_loss(logprob.reshape(-1), adv.reshape(-1), values.reshape(-1),
                                vt.vs.reshape(-1), entropy.reshape(-1), ent_coef, vf_coef)
    return loss, (pg.detach(), v.detach(), ent.detach(), (logprob - logprobs).detach())


class A3C(AsyncLearner):
    """The A3C learner: `a3c_objective`, one gradient step per batch (`AsyncLearner`'s
    passes), RMSprop by default."""

    @property
    def optimizer(self) -> str:
        return self.cfg.optimizer

    def objective(self):
        c = self.cfg
        return functools.partial(a3c_objective, gamma=c.gamma, ent_coef=c.ent_coef,
                                 vf_coef=c.vf_coef, normalize_advantage=c.normalize_advantage)

    def optimizer_eps(self) -> float:
        return self.cfg.optimizer_eps
