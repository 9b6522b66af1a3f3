"""PPO's loss and gradient for tanh-MLP actor-critics, derived by hand (no autograd graph).

A fast path beside the plain reference (`gmi_drl.algos.ppo.ppo_loss` + ``loss.backward()``),
tested equal to it: on a CPU, a 64-64 MLP minibatch step is dominated by the fixed cost of ~500
small tensor ops that autograd dispatches; the closed-form gradient needs ~70. Same objective as
`ppo_loss` (PPO paper eq. 7 and 9 with CleanRL's value clipping), advantages already normalised.

Gradients, per sample ``i`` of a minibatch of ``M`` (``r = exp(logp - logp_old)``):
  d pg / d logp_i = -A_i r_i [ -A_i r_i >= -A_i clip(r_i) ] / M   (the unclipped branch is active)
  d vloss / d V_i = (V_i - R_i) [ (V_i - R_i)^2 >= (V_clipped_i - R_i)^2 ] / M   (clip_vloss)
  Gaussian: d logp / d mu = (a - mu) / sigma^2,  d logp / d log sigma = z^2 - 1,  d H / d log sigma = 1
  Categorical: d logp / d logits = onehot(a) - p,  d H / d logits = -p (log p + H)
then back through each MLP layer: ``dW = g^T h``, ``db = sum g``, ``g <- (g W) * (1 - h^2)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gmi_drl.models.actor_critic import ActorCritic
from gmi_drl.models.heads import CategoricalHead, DiagGaussianHead
from gmi_drl.models.mlp import MLP, Tanh, tanh_
from gmi_drl.telemetry.timer import timer

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _linears(mlp: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of a tanh `MLP`, or ``None`` when it is anything else."""
    if not isinstance(mlp, MLP):
        return None
    if not all(isinstance(m, (nn.Linear, Tanh)) for m in mlp):
        return None
    return [m for m in mlp if isinstance(m, nn.Linear)]


def _forward(layers: list[nn.Linear], x: torch.Tensor) -> list[torch.Tensor]:
    hs = [x]
    for i, layer in enumerate(layers):
        y = torch.addmm(layer.bias, hs[-1], layer.weight.t())
        hs.append(tanh_(y) if i < len(layers) - 1 else y)
    return hs


def _backward(layers: list[nn.Linear], hs: list[torch.Tensor], g: torch.Tensor) -> None:
    """Write ``dL/dW``, ``dL/db`` of every layer into ``.grad`` (overwritten) from ``g = dL/d out``."""
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        torch.mm(g.t(), hs[i], out=layer.weight.grad)
        torch.sum(g, 0, out=layer.bias.grad)
        if i:
            g = g.mm(layer.weight)
            h = hs[i]
            g.addcmul_(g * h, h, value=-1.0)  # tanh'(x) = 1 - tanh(x)^2


class FastPPOGrad:
    """Hand-derived PPO loss and gradient for `ActorCritic` models with separate tanh MLPs.

    Args:
        model: built by `build_actor_critic` with ``encoder="mlp"`` and ``activation="tanh"``;
            its ``.grad`` tensors must exist (`FlatParams` makes them).

    Raises:
        ValueError: the model is not supported (check `FastPPOGrad.supports` first).
    """

    def __init__(self, model: ActorCritic) -> None:
        if not self.supports(model):
            raise ValueError("FastPPOGrad needs separate tanh MLPs and a Gaussian or categorical head")
        self.actor, self.critic = _linears(model.actor), _linears(model.critic)
        self.head = model.head

    @staticmethod
    def supports(model: ActorCritic) -> bool:
        return (isinstance(model.trunk, nn.Identity) and _linears(model.actor) is not None
                and _linears(model.critic) is not None
                and isinstance(model.head, (DiagGaussianHead, CategoricalHead)))

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, actions: torch.Tensor, old_logprob: torch.Tensor,
                 advantages: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor,
                 clip_coef: float, clip_vloss: bool, vf_coef: float, ent_coef: float,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Overwrite every parameter's ``.grad`` with ``d loss / d theta`` for one minibatch.

        Inputs as `ppo_loss` (``obs (M, D)``, actions ``(M, A)`` or ``(M,)``, the rest ``(M,)``;
        advantages already normalised). Returns ``(policy_loss, value_loss, entropy)`` (0-d) and
        ``logratio (M,)``. Timer sections ``forward`` (loss terms) and ``backward`` (gradients),
        as the autograd path's.
        """
        m = obs.shape[0]
        with timer("forward"):
            ha, hc = _forward(self.actor, obs), _forward(self.critic, obs)
            out, value = ha[-1], hc[-1].squeeze(1)
            if isinstance(self.head, DiagGaussianHead):
                logstd = self.head.logstd
                inv_std = torch.exp(-logstd)
                z = (actions - out) * inv_std
                zz = z * z
                logp = zz.sum(1).mul_(-0.5).sub_(logstd.sum() + out.shape[1] * _HALF_LOG_2PI)
                entropy = logstd.sum() + out.shape[1] * (0.5 + _HALF_LOG_2PI)
            else:
                logp_all = torch.log_softmax(out, 1)
                p = logp_all.exp()
                logp = logp_all.gather(1, actions.unsqueeze(1)).squeeze(1)
                ent_each = -(p * logp_all).sum(1)
                entropy = ent_each.mean()
            logratio = logp - old_logprob
            ratio = logratio.exp()
            s1 = -advantages * ratio
            s2 = -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)
            pg_loss = torch.max(s1, s2).mean()
            u = value - returns
            if clip_vloss:
                v_clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef) - returns
                uu, cc = u * u, v_clipped * v_clipped
                v_loss = 0.5 * torch.max(uu, cc).mean()
            else:
                v_loss = 0.5 * (u * u).mean()
        with timer("backward"):
            dlogp = (s1 * (s1 >= s2)).div_(m)  # d pg / d logp
            g_value = (u * (uu >= cc) if clip_vloss else u).mul_(vf_coef / m).unsqueeze(1)
            if isinstance(self.head, DiagGaussianHead):
                dl = dlogp.unsqueeze(1)
                g_out = dl * z * inv_std
                torch.sum(dl * (zz - 1.0), 0, keepdim=True, out=self.head.logstd.grad)
                self.head.logstd.grad.sub_(ent_coef)
            else:
                g_out = p * -dlogp.unsqueeze(1)
                g_out.scatter_add_(1, actions.unsqueeze(1), dlogp.unsqueeze(1))
                if ent_coef:
                    g_out.addcmul_(p, logp_all + ent_each.unsqueeze(1), value=ent_coef / m)
            _backward(self.actor, ha, g_out)
            _backward(self.critic, hc, g_value)
        return pg_loss, v_loss, entropy, logratio
