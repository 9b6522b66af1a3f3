"""PPO's loss and gradient for tanh-MLP actor-critics on a CPU, derived by hand and run in NumPy.

A fast path beside the plain reference (`gmi_drl.algos.ppo.ppo_loss` + ``loss.backward()``),
tested equal to it. On a CPU a 64-64 MLP minibatch step is bound by fixed per-op costs: autograd
dispatches ~500 small torch ops, the closed-form gradient needs ~70, and NumPy runs each of those
several times cheaper than torch (see `gmi_drl.models.fast_mlp`). Same objective as `ppo_loss`
(PPO paper eq. 7 and 9 with CleanRL's value clipping), advantages already normalised.

Gradients, per sample ``i`` of a minibatch of ``M`` (``r = exp(logp - logp_old)``):
  d pg / d logp_i = -A_i r_i [ -A_i r_i >= -A_i clip(r_i) ] / M   (the unclipped branch is active)
  d vloss / d V_i = (V_i - R_i) [ (V_i - R_i)^2 >= (V_clipped_i - R_i)^2 ] / M   (clip_vloss)
  Gaussian: d logp / d mu = (a - mu) / sigma^2,  d logp / d log sigma = z^2 - 1,  d H / d log sigma = 1
  Categorical: d logp / d logits = onehot(a) - p,  d H / d logits = -p (log p + H)
then back through each MLP layer (`NumpyTanhMLP.backward`).
"""

from __future__ import annotations

import math

import numpy as np

from gmi_drl.models.actor_critic import ActorCritic
from gmi_drl.models.fast_mlp import NumpyActing
from gmi_drl.telemetry.timer import timer

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_sum = np.add.reduce  # the ufunc itself: ndarray.sum/mean add ~3 us of Python per call


def _clip(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """``np.clip`` (same values, NaN kept) without its ~4 us Python wrapper; ``x`` is reused."""
    return np.minimum(np.maximum(x, low, out=x), high, out=x)


class FastPPOGrad(NumpyActing):
    """Hand-derived PPO loss and gradient for CPU `ActorCritic` models with separate tanh MLPs
    (the `NumpyActing` views, plus the gradient views).

    Args:
        model: built by `build_actor_critic` with ``encoder="mlp"`` and ``activation="tanh"``, on
            the CPU; its ``.grad`` tensors must exist (`FlatParams` makes them) and its
            parameters must not be re-homed afterwards (the NumPy views alias them).

    Raises:
        ValueError: the model is not supported (check `FastPPOGrad.supports` first).
    """

    def __init__(self, model: ActorCritic) -> None:
        super().__init__(model)
        if self.gaussian:
            self.logstd_grad = model.head.logstd.grad.numpy()  # (1, A)

    def __call__(self, obs: np.ndarray, actions: np.ndarray, old_logprob: np.ndarray,
                 advantages: np.ndarray, old_value: np.ndarray, returns: np.ndarray,
                 clip_coef: float, clip_vloss: bool, vf_coef: float, ent_coef: float,
                 ) -> tuple[float, float, float, np.ndarray]:
        """Overwrite every parameter's ``.grad`` with ``d loss / d theta`` for one minibatch.

        Args:
            obs: ``(M, D) float32``. actions: ``(M, A) float32`` (Gaussian) or ``(M,) int64``.
            old_logprob, advantages (already normalised), old_value, returns: ``(M,) float32``.

        Returns:
            ``(policy_loss, value_loss, entropy, logratio (M,) float32)``. Timer sections
            ``forward`` (loss terms) and ``backward`` (gradients), as the autograd path's.
        """
        with timer("forward"):
            m = obs.shape[0]
            ha, hc = self.actor.forward(obs), self.critic.forward(obs)
            out, value = ha[-1], hc[-1][:, 0]
            if self.gaussian:
                logstd = self.logstd
                inv_std = np.exp(-logstd)
                z = actions - out
                z *= inv_std
                zz = z * z
                logp = _sum(zz, 1)
                logp *= -0.5
                logp -= logstd.sum() + out.shape[1] * _HALF_LOG_2PI
                entropy = float(logstd.sum()) + out.shape[1] * (0.5 + _HALF_LOG_2PI)
            else:
                shifted = out - out.max(1, keepdims=True)
                logp_all = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
                p = np.exp(logp_all)
                rows = np.arange(m)
                logp = logp_all[rows, actions]
                ent_each = -(p * logp_all).sum(1)
                entropy = float(_sum(ent_each)) / m
            logratio = logp - old_logprob
            ratio = np.exp(logratio)
            s1 = -advantages * ratio
            s2 = -advantages * _clip(ratio, 1 - clip_coef, 1 + clip_coef)
            pg_loss = float(_sum(np.maximum(s1, s2))) / m
            u = value - returns
            if clip_vloss:
                v_clipped = _clip(value - old_value, -clip_coef, clip_coef)
                v_clipped += old_value
                v_clipped -= returns
                uu, cc = u * u, v_clipped * v_clipped
                v_loss = 0.5 * float(_sum(np.maximum(uu, cc))) / m
            else:
                v_loss = 0.5 * float(_sum(u * u)) / m
        with timer("backward"):
            dlogp = s1 * (s1 >= s2)
            dlogp /= m  # d pg / d logp
            g_value = u * (uu >= cc) if clip_vloss else u
            g_value *= vf_coef / m
            dl = dlogp[:, None]
            if self.gaussian:
                g_out = dl * z
                g_out *= inv_std
                _sum(dl * (zz - 1.0), 0, keepdims=True, out=self.logstd_grad)
                self.logstd_grad -= ent_coef
            else:
                g_out = p * -dl
                g_out[rows, actions] += dlogp
                if ent_coef:
                    g_out += (ent_coef / m) * p * (logp_all + ent_each[:, None])
            self.actor.backward(ha, g_out)
            self.critic.backward(hc, g_value[:, None])
        return pg_loss, v_loss, entropy, logratio
