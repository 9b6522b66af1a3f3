"""Asynchronous PPO: the clipped objective on V-trace advantages, learned from fragments that
serving GMIs collected with older weights.

Sources: IMPALA (Espeholt et al. 2018, §4: V-trace targets ``v_s`` for the critic and
``rho_s (r_s + gamma v_{s+1} - V(x_s))`` as the policy-gradient advantage), with PPO's clipped
surrogate (Schulman et al. 2017, eq. 7) on the ratio to the behaviour policy, as Sample Factory's
APPO (Petrenko et al. 2020) combines them. The learner is the trainer role of the
``async_training`` template (`gmi_drl.runner.roles`); serving GMIs act with the weights it
publishes (`weights`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from gmi_drl.algos.base import AlgoContext, load_modules
from gmi_drl.models.actor_critic import ActorCritic, build_actor_critic
from gmi_drl.rollout.acting import make_acting
from gmi_drl.rollout.vtrace import vtrace


@dataclass
class APPOConfig:
    """APPO hyper-parameters (defaults: Sample Factory 2's rollout of 32, adam_eps 1e-6, one
    epoch of one minibatch and V-trace rho-bar and c-bar of 1; learning_rate, clip_coef,
    ent_coef and max_grad_norm are CleanRL's continuous-control PPO values)."""

    num_steps: int = 32
    """T: steps per env in one fragment (Sample Factory's rollout)"""
    fragments_per_batch: int = 4
    """fragments of one serving GMI's env.num_envs envs in one trainer batch (F); a trainer's
    batch is F * env.num_envs * num_steps samples"""
    learning_rate: float = 3e-4
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    vtrace_rho: float = 1.0
    """rho-bar of V-trace (truncation of the importance weight in the value target)"""
    vtrace_c: float = 1.0
    """c-bar of V-trace (truncation of the trace coefficients)"""
    vtrace_lambda: float = 1.0
    """the trace's lambda (IMPALA Remark 2)"""
    num_minibatches: int = 1
    """minibatches per epoch, each of whole trajectories (env columns)"""
    update_epochs: int = 1
    """passes over each batch"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch (mean 0, std 1)"""
    clip_coef: float = 0.2
    """surrogate clipping epsilon on the ratio to the behaviour policy"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm bound"""
    adam_eps: float = 1e-6
    """Adam epsilon"""

    template = "async_training"
    """the GMI template this algorithm runs in (not a flag)"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """Samples of one trainer update: ``fragments_per_batch * num_envs * num_steps``."""
        return self.fragments_per_batch * num_envs * self.num_steps

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule of these hyper-parameters."""
        F = self.fragments_per_batch
        checks = [
            (self.num_steps >= 1, f"algo.num_steps={self.num_steps} must be >= 1"),
            (F >= 1, f"algo.fragments_per_batch={F} must be >= 1"),
            (self.num_minibatches >= 1 and (F * num_envs) % self.num_minibatches == 0,
             f"algo.num_minibatches={self.num_minibatches} must divide the "
             f"{F * num_envs} trajectories of a batch (fragments_per_batch * env.num_envs)"),
            (not self.norm_adv or self.num_minibatches < 1 or F < 1
             or F * num_envs * self.num_steps >= 2 * self.num_minibatches,
             f"algo.num_minibatches={self.num_minibatches} leaves minibatches of one sample "
             f"(a batch of {F * num_envs * self.num_steps}: fragments_per_batch * env.num_envs "
             "* algo.num_steps): normalising advantages needs 2 or more (their std); lower "
             "--algo.num-minibatches, raise the batch, or pass --algo.no-norm-adv"),
            (self.update_epochs >= 1, f"algo.update_epochs={self.update_epochs} must be >= 1"),
            (self.learning_rate > 0, f"algo.learning_rate={self.learning_rate} must be > 0"),
            (0 <= self.gamma <= 1, f"algo.gamma={self.gamma} must be in [0, 1]"),
            (self.vtrace_rho > 0 and self.vtrace_c > 0,
             f"algo.vtrace_rho={self.vtrace_rho} and algo.vtrace_c={self.vtrace_c} must be > 0"),
            (0 <= self.vtrace_lambda <= 1,
             f"algo.vtrace_lambda={self.vtrace_lambda} must be in [0, 1]"),
            (self.clip_coef > 0, f"algo.clip_coef={self.clip_coef} must be > 0"),
            (self.ent_coef >= 0, f"algo.ent_coef={self.ent_coef} must be >= 0"),
            (self.vf_coef >= 0, f"algo.vf_coef={self.vf_coef} must be >= 0"),
            (self.max_grad_norm > 0, f"algo.max_grad_norm={self.max_grad_norm} must be > 0"),
            (self.adam_eps > 0, f"algo.adam_eps={self.adam_eps} must be > 0"),
        ]
        return [msg for ok, msg in checks if not ok]


def _evaluate(model: ActorCritic, obs, actions, last_obs):
    """Log-probabilities, entropies and values of a ``[T, M]`` minibatch, and ``V(last_obs)``."""
    T, M = obs.shape[:2]
    new = model.evaluate(obs.flatten(0, 1), actions.flatten(0, 1))
    return (new.logprob.view(T, M), new.entropy.view(T, M), new.value.view(T, M),
            model.value(last_obs))


def _normalized(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / (x.std() + 1e-8)


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
    logprob, entropy, values, boot = _evaluate(model, obs, actions, last_obs)
    log_rhos = logprob - logprobs
    vt = vtrace(log_rhos.detach(), rewards, values.detach(), boot.detach(), terminated,
                truncated, final_values, gamma, rho_bar=rho_bar, c_bar=c_bar, lam=lam)
    adv = _normalized(vt.pg_advantages) if norm_adv else vt.pg_advantages
    ratio = log_rhos.exp()
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    v_loss = 0.5 * ((values - vt.vs) ** 2).mean()
    ent = entropy.mean()
    loss = pg_loss - ent_coef * ent + vf_coef * v_loss
    return loss, (pg_loss.detach(), v_loss.detach(), ent.detach(), log_rhos.detach())


class APPO:
    """The APPO learner: `update` learns from one batch of fragments (`gmi_drl.comm.channels.
    Batcher`'s), then its weights are the next ``policy_version``.

    Args:
        cfg: hyper-parameters. ctx: the task and the trainer's parts (its gradient step
            factory reduces across trainer GMIs; ``ctx.num_envs`` is a serving GMI's envs).

    Raises:
        ValueError: spaces the actor-critic does not support.
    """

    optimizer = "adam"

    def __init__(self, cfg: APPOConfig, ctx: AlgoContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.steps_per_iteration = cfg.steps_per_iteration(ctx.num_envs)
        self.model = build_model(ctx.spec, ctx.model).to(ctx.device)
        self.grad_step = ctx.make_grad_step(self.model, self.objective(), cfg.learning_rate,
                                            cfg.max_grad_norm, self.optimizer_eps(),
                                            optimizer=self.optimizer)
        self.acting = make_acting(self.model, ctx.action_generator, ctx.arrays, ctx.compile)
        """the policy as the trainer's weights act (``gmi-drl eval``)"""
        self.generator = torch.Generator().manual_seed(ctx.seed)  # minibatch order
        self.policy_version = 0
        self.iteration = 0

    def objective(self):
        c = self.cfg
        return functools.partial(appo_objective, gamma=c.gamma, rho_bar=c.vtrace_rho,
                                 c_bar=c.vtrace_c, lam=c.vtrace_lambda, clip_coef=c.clip_coef,
                                 ent_coef=c.ent_coef, vf_coef=c.vf_coef, norm_adv=c.norm_adv)

    def optimizer_eps(self) -> float:
        return self.cfg.adam_eps

    def update(self, batch: dict[str, torch.Tensor],
               update_obs_stats: bool = True) -> dict[str, float]:
        """``update_epochs`` passes of minibatch steps over ``batch`` (every trajectory whole);
        the observations are normalised first when the run normalises them, folding the batch
        into the statistics when ``update_obs_stats`` (the trainer that publishes: its
        statistics are the ones `weights` sends; other trainers take them, `set_obs_stats`).
        Returns ``losses/...`` means and the gradient step's metrics."""
        cfg, step, norm = self.cfg, self.grad_step, self.ctx.obs_norm
        obs, last_obs = batch["obs"], batch["last_obs"]
        if norm is not None:
            T, N = obs.shape[:2]
            obs = _float(norm(_as_array(obs.flatten(0, 1)), update_obs_stats)).view(
                T, N, *obs.shape[2:])
            last_obs = _float(norm(_as_array(last_obs), update=False))
        fields = (obs, batch["actions"], batch["logprobs"], batch["rewards"],
                  batch["terminated"], batch["truncated"], batch["final_values"], last_obs)
        N = obs.shape[1]
        m = N // cfg.num_minibatches
        aux = []
        for _ in range(cfg.update_epochs):
            order = (torch.randperm(N, generator=self.generator) if cfg.num_minibatches > 1
                     else torch.arange(N))
            for i in range(cfg.num_minibatches):
                cols = order[i * m:(i + 1) * m].to(obs.device)
                mb = [x.index_select(0 if x is last_obs else 1, cols)
                      if cfg.num_minibatches > 1 else x for x in fields]
                aux.append(step(*mb))
        comm = step.drain()
        self.iteration += 1
        self.policy_version += 1
        log_rhos = torch.cat([a[3].reshape(-1) for a in aux])
        means = torch.stack([torch.stack(a[:3]) for a in aux]).mean(0).tolist()
        return {"losses/policy_loss": means[0], "losses/value_loss": means[1],
                "losses/entropy": means[2],
                "losses/importance_ratio": float(log_rhos.exp().mean()),
                "losses/learning_rate": step.lr, **comm}

    def weights(self) -> list[np.ndarray]:
        """What serving GMIs act with, as arrays in a fixed order: every tensor of the model's
        state, then the observation normaliser's mean and variance (when the run has one)."""
        out = [t.detach().cpu().numpy() for t in self.model.state_dict().values()]
        if self.ctx.obs_norm is not None:
            rms = self.ctx.obs_norm.rms  # NumPy on the CPU, tensors on a device
            out += [torch.as_tensor(x).cpu().numpy().astype(np.float64, copy=False)
                    for x in (rms.mean, rms.var)]
        return out

    def set_obs_stats(self, mean: np.ndarray, var: np.ndarray) -> None:
        """Take the observation statistics another trainer published (`weights`' last two
        arrays); no-op without observation normalisation."""
        norm = self.ctx.obs_norm
        if norm is not None:
            norm.rms.mean = norm.rms.arrays.from_torch(torch.from_numpy(mean.copy()))
            norm.rms.var = norm.rms.arrays.from_torch(torch.from_numpy(var.copy()))

    def state_dict(self) -> dict:
        """Weights (``modules``), optimizer moments, the shuffling RNG, the update count and
        the policy version."""
        return {"modules": {"actor_critic": self.model.state_dict()},
                "optimizers": {"actor_critic": self.grad_step.state_dict()},
                "generator": self.generator.get_state(), "iteration": self.iteration,
                "policy_version": self.policy_version}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output.

        Raises:
            ValueError: the stored weights or optimizer do not fit this model.
        """
        load_modules({"actor_critic": self.model}, state["modules"])
        self.grad_step.load_state_dict(state["optimizers"]["actor_critic"])
        self.generator.set_state(state["generator"])
        self.iteration = int(state["iteration"])
        self.policy_version = int(state["policy_version"])

    def close(self) -> None:
        self.grad_step.close()


def build_model(spec, m) -> ActorCritic:
    """The actor-critic of task ``spec`` (`EnvSpec`) and model config ``m`` (the trainer's,
    and each serving GMI's copy: both built after ``torch.manual_seed(seed)``, so they start
    equal)."""
    return build_actor_critic(spec.observation_space, spec.action_space, m.encoder,
                              m.actor_hidden, m.critic_hidden, m.activation, m.cnn_features)


def _as_array(x: torch.Tensor):
    return x.numpy() if x.device.type == "cpu" else x


def _float(x) -> torch.Tensor:
    t = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
    return t.to(torch.float32)
