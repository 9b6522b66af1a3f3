"""Proximal Policy Optimization with a clipped surrogate objective.

Source: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (PPO paper), eq. 7 (the
clipped surrogate L^CLIP) and eq. 9 (``L^CLIP - c1 L^VF + c2 S``); the implementation details
(value clipping, per-minibatch advantage normalisation, global gradient clipping, linear learning
rate annealing, Adam eps 1e-5) follow CleanRL's ``ppo.py`` / ``ppo_continuous_action.py``
(Huang et al. 2022, "The 37 Implementation Details of PPO").
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from gmi_drl.algos.flat import FlatAdam, FlatParams
from gmi_drl.algos.ppo_fast import FastPPOGrad
from gmi_drl.comm.reducer import GradReducer, IdentityReducer
from gmi_drl.models.actor_critic import ActorCritic
from gmi_drl.rollout.storage import Batch
from gmi_drl.telemetry.timer import timer


@dataclass
class PPOConfig:
    """PPO hyper-parameters (defaults: CleanRL ``ppo.py``)."""

    num_steps: int = 128
    """steps per env per rollout (T); batch_size = env.num_envs * num_steps"""
    learning_rate: float = 2.5e-4
    """Adam step size (at the start, when annealed)"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per epoch; minibatch_size = batch_size // num_minibatches"""
    update_epochs: int = 4
    """passes over each batch"""
    norm_adv: bool = True
    """normalise advantages per minibatch (mean 0, std 1)"""
    clip_coef: float = 0.2
    """surrogate clipping epsilon (PPO paper eq. 7), also the value clipping range"""
    clip_vloss: bool = True
    """clip the value loss around the old values"""
    ent_coef: float = 0.01
    """entropy bonus coefficient (c2)"""
    vf_coef: float = 0.5
    """value loss coefficient (c1)"""
    max_grad_norm: float = 0.5
    """global gradient norm bound"""
    target_kl: float | None = None
    """stop the epochs of an update once the approximate KL exceeds this (None: never)"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    fast_path: bool = True
    """hand-derived loss gradient for tanh-MLP models (equal to autograd; False: autograd)"""
    norm_obs: bool = False
    """normalise observations with running statistics (CleanRL's NormalizeObservation)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return (CleanRL's NormalizeReward)"""
    obs_clip: float = 10.0
    """clip normalised observations to [-obs_clip, obs_clip]"""
    reward_clip: float = 10.0
    """clip normalised rewards to [-reward_clip, reward_clip]"""


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


class PPO:
    """The PPO learner: minibatch SGD epochs over one rollout per `update` call.

    Args:
        cfg: hyper-parameters.
        model: actor-critic; its parameters are re-homed into one flat buffer (`FlatParams`).
        batch_size: samples per `update` (``num_envs * num_steps``); must be a multiple of
            ``cfg.num_minibatches``.
        num_iterations: updates in the whole run (the learning rate reaches 0 after them).
        reducer: where gradients are averaged across trainers before each step.
        seed: seed of the minibatch-shuffling generator.
        staleness_bound: ``None``: synchronous, each minibatch's gradient is reduced, then the
            step is taken. An int ``S >= 0``: asynchronous through the switch (iSwitch §4.1,
            `gmi_drl.comm.switch.pipeline`): a minibatch's gradient is computed on weights that
            miss at most ``S`` of the steps before it; the steps are taken on a second copy of
            the weights by the pipeline's LWU thread, and every `update` ends drained, so
            rollouts and checkpoints see every step. ``S = 0`` gives the synchronous result bit
            for bit. Asynchronous updates also return ``comm/staleness_mean`` and ``_max``.

    Raises:
        ValueError: ``batch_size`` not a multiple of ``cfg.num_minibatches``; a staleness bound
            below 0, or without a `SwitchReducer`.
    """

    def __init__(self, cfg: PPOConfig, model: ActorCritic, batch_size: int, num_iterations: int,
                 reducer: GradReducer | None = None, seed: int = 0,
                 staleness_bound: int | None = None) -> None:
        if batch_size % cfg.num_minibatches:
            raise ValueError(f"batch_size={batch_size} must be a multiple of "
                             f"num_minibatches={cfg.num_minibatches}")
        self.cfg, self.model = cfg, model
        self.batch_size, self.num_iterations = batch_size, num_iterations
        self.minibatch_size = batch_size // cfg.num_minibatches
        self.reducer = reducer or IdentityReducer()
        self.flat = FlatParams(model)
        self.pipeline = None
        stepped = self.flat  # the weights the optimizer steps
        if staleness_bound is not None:
            from gmi_drl.comm.switch.pipeline import AsyncPipeline

            stepped = self._weights = FlatParams(copy.deepcopy(model))
            self.pipeline = AsyncPipeline(self.reducer, staleness_bound, self._apply_mean)
        self.optimizer = FlatAdam(stepped, cfg.learning_rate, eps=cfg.adam_eps)
        self.generator = torch.Generator().manual_seed(seed)
        self.fast = FastPPOGrad(model) if cfg.fast_path and FastPPOGrad.supports(model) else None
        self.iteration = 0
        self._shuffled: Batch | None = None

    def update(self, batch: Batch) -> dict[str, float]:
        """Run ``update_epochs`` epochs of minibatch SGD on ``batch`` (``batch_size`` samples).

        Each epoch permutes the batch once into preallocated tensors, so minibatches are
        contiguous views. Every minibatch is four timer sections: ``forward`` (loss),
        ``backward`` (gradients), ``allreduce`` (the reducer; a collective) and ``optimizer``
        (clipping and the Adam step); on a GPU they time the CPU side (kernels run async).
        Returns means over the minibatches run of ``losses/policy_loss``,
        ``value_loss``, ``entropy``, ``approx_kl`` and ``clipfrac`` (the last two from the
        log-ratios of every sample), plus ``losses/learning_rate`` and
        ``losses/explained_variance``. ``target_kl`` stops after the first epoch whose mean
        approximate KL exceeds it (CleanRL checks the epoch's last minibatch instead).
        """
        cfg, flat, opt = self.cfg, self.flat, self.optimizer
        device = flat.data.device
        if batch.obs.device != device:  # rollouts live on the CPU, the learner maybe on a GPU
            batch = Batch(*(x.to(device) for x in batch))
        if cfg.anneal_lr:
            opt.lr = cfg.learning_rate * (1.0 - self.iteration / self.num_iterations)
        if self._shuffled is None:
            self._shuffled = Batch(*(torch.empty_like(x) for x in batch))
            self._logratio = torch.zeros(cfg.update_epochs, self.batch_size, device=device)
            self._losses = torch.zeros(cfg.update_epochs * cfg.num_minibatches, 3, device=device)
            if self.fast is not None:  # NumPy views of the same memory (CPU only)
                self._np = (Batch(*(x.numpy() for x in self._shuffled)),
                            self._logratio.numpy(), self._losses.numpy())
        shuffled, mb, n_mb = self._shuffled, self.minibatch_size, cfg.num_minibatches
        pipe = self.pipeline
        if pipe is not None:
            counts_before = Counter(pipe.staleness_counts)
        epochs = 0
        for epoch in range(cfg.update_epochs):
            if n_mb > 1:  # one minibatch = the whole batch: its order does not matter
                perm = torch.randperm(self.batch_size, generator=self.generator).to(device)
                for src, dst in zip(batch, shuffled):
                    torch.index_select(src, 0, perm, out=dst)
            else:
                for src, dst in zip(batch, shuffled):
                    dst.copy_(src)
            if cfg.norm_adv:  # per minibatch, all minibatches of the epoch at once
                adv = shuffled.advantages.view(n_mb, mb)
                adv.copy_(normalize_advantages(adv))
            for i, start in enumerate(range(0, self.batch_size, mb)):
                if pipe is not None:
                    with timer("allreduce"):  # blocked by the staleness bound
                        pipe.fetch(self._pull)
                if self.fast is not None:
                    self._fast_grad(epoch * n_mb + i, epoch, start)
                else:
                    self._autograd_grad(epoch * n_mb + i, epoch, start)
                if pipe is not None:  # asynchronous: the pipeline's LWU thread steps
                    pipe.push(flat.grad)
                    continue
                with timer("allreduce"):
                    self.reducer.allreduce_([flat.grad])
                with timer("optimizer"):
                    flat.clip_grad_norm_(cfg.max_grad_norm)
                    opt.step()
            epochs += 1
            if cfg.target_kl is not None and approx_kl(self._logratio[epoch]).item() > cfg.target_kl:
                break
        comm = {}
        if pipe is not None:
            with timer("allreduce"):
                pipe.drain(self._pull)
            counts = pipe.staleness_counts - counts_before
            comm = {"comm/staleness_mean": sum(k * v for k, v in counts.items()) / counts.total(),
                    "comm/staleness_max": max(counts)}
        self.iteration += 1
        logratio = self._logratio[:epochs]
        means = self._losses[:epochs * n_mb].mean(0).tolist()
        var_y = batch.returns.var()
        explained = float("nan") if var_y == 0 else float(1 - (batch.returns - batch.values).var() / var_y)
        return {"losses/policy_loss": means[0], "losses/value_loss": means[1],
                "losses/entropy": means[2], "losses/approx_kl": float(approx_kl(logratio)),
                "losses/clipfrac": float(clip_fraction(logratio, cfg.clip_coef)),
                "losses/learning_rate": opt.lr, "losses/explained_variance": explained, **comm}

    def _pull(self) -> None:
        """Asynchronous mode: ``θ_local ← θ`` (the pipeline calls it under its lock)."""
        self.flat.data.copy_(self._weights.data)

    def _apply_mean(self, mean: np.ndarray) -> None:
        """Asynchronous mode, the LWU thread: the synchronous path's step on ``θ`` with the
        aggregated mean gradient ``(P,) float32``: clip the norm, one Adam step."""
        w = self._weights
        w.grad.copy_(torch.from_numpy(mean))
        w.clip_grad_norm_(self.cfg.max_grad_norm)
        self.optimizer.step()

    def close(self) -> None:
        """Stop the asynchronous pipeline's thread, if one still runs (after an error).
        Idempotent."""
        if self.pipeline is not None:
            self.pipeline.close()

    def _fast_grad(self, row: int, epoch: int, start: int) -> None:
        """Minibatch ``row``'s gradient through `FastPPOGrad` on NumPy views."""
        cfg, stop = self.cfg, start + self.minibatch_size
        shuffled, logratios, losses = self._np
        obs, actions, logprobs, values, adv, returns = (x[start:stop] for x in shuffled)
        *terms, logratio = self.fast(obs, actions, logprobs, adv, values, returns, cfg.clip_coef,
                                     cfg.clip_vloss, cfg.vf_coef, cfg.ent_coef)
        logratios[epoch, start:stop] = logratio
        losses[row] = terms

    def _autograd_grad(self, row: int, epoch: int, start: int) -> None:
        """Minibatch ``row``'s gradient through `ppo_loss` and autograd (any model, any device)."""
        cfg, stop = self.cfg, start + self.minibatch_size
        obs, actions, logprobs, values, adv, returns = (x[start:stop] for x in self._shuffled)
        with timer("forward"):
            new = self.model.evaluate(obs, actions)
            out = ppo_loss(new.logprob, logprobs, adv, new.value, values, returns, new.entropy,
                           cfg.clip_coef, cfg.clip_vloss, cfg.vf_coef, cfg.ent_coef,
                           norm_adv=False)
        with timer("backward"):
            self.flat.zero_grad()
            out.loss.backward()
        with torch.no_grad():
            self._logratio[epoch, start:stop] = out.logratio
            torch.stack(out[1:4], out=self._losses[row])

    def state_dict(self) -> dict:
        """Model weights, optimizer moments, the shuffling RNG and the update count."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output.

        Raises:
            ValueError: the stored weights do not fit this model (shapes or names differ).
        """
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as e:
            raise ValueError(f"checkpoint weights do not fit this model: {e}") from None
        self.optimizer.load_state_dict(state["optimizer"])
        if self.pipeline is not None:
            self._weights.data.copy_(self.flat.data)
        self.generator.set_state(state["generator"])
        self.iteration = int(state["iteration"])
