"""V-trace off-policy targets (IMPALA: Espeholt et al. 2018, §4.1, eq. 1 and the recursion
``v_s - V(x_s) = delta_s V + gamma c_s (v_{s+1} - V(x_{s+1}))`` of Remark 1).

Trajectories are time-major ``[T, B]`` fragments that may hold episode ends. Where env ``b``'s
episode ends at step ``t`` the correction of the next episode is not carried back across it;
``terminated`` ends bootstrap nothing, ``truncated`` ends bootstrap from ``V(final_obs)`` (given
in ``next_values``), as `gmi_drl.rollout.gae` does for GAE.

`vtrace` is the learner's (no Python loop over T: a triangular product of the trace
coefficients, ``O(T^2 B)`` of work, differentiable-free); `vtrace_reference` is the plain
backward recursion it is tested against.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class VTraceReturns(NamedTuple):
    """V-trace targets of a ``[T, B]`` fragment."""

    vs: torch.Tensor
    """``(T, B) float32``: the value targets ``v_s`` (eq. 1)"""
    pg_advantages: torch.Tensor
    """``(T, B) float32``: ``rho_s (r_s + gamma_s v_{s+1} - V(x_s))``, the policy-gradient
    advantage of IMPALA §4.2 (``v_{s+1}`` is the next V-trace target within the episode, the
    given next value at an episode end or the fragment's last step)"""


def _next_values(values: torch.Tensor, bootstrap: torch.Tensor, done: torch.Tensor,
                 final_values: torch.Tensor) -> torch.Tensor:
    """``V(x_{t+1})`` within each episode: the next row's value, ``bootstrap`` after the last
    step, ``final_values`` where an episode ended (0 there for terminations)."""
    shifted = torch.cat([values[1:], bootstrap.unsqueeze(0)])
    return torch.where(done, final_values, shifted)


def vtrace(log_rhos: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           bootstrap_value: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
           final_values: torch.Tensor, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           pg_rho_bar: float | None = None, lam: float = 1.0) -> VTraceReturns:
    """V-trace targets for one batch of fragments (every tensor ``(T, B)`` unless said).

    Args:
        log_rhos: ``log pi(a_t|x_t) - log mu(a_t|x_t)`` (target minus behaviour policy).
        rewards: ``r_t``.
        values: ``V(x_t)`` under the current value function (no gradient needed).
        bootstrap_value: ``(B,)``: ``V(x_T)``, the observation after the last step.
        terminated, truncated: ``bool``, episode ends at step ``t``.
        final_values: ``V(final_obs)`` where an episode was truncated at ``t`` (ignored
            elsewhere).
        gamma: discount. rho_bar, c_bar: the truncation levels of eq. 1 (IMPALA: 1, 1).
        pg_rho_bar: truncation of the policy-gradient ``rho`` (default ``rho_bar``).
        lam: the trace's lambda (IMPALA Remark 2: ``c_i = lam min(c_bar, rho_i)``).

    Returns:
        `VTraceReturns` (no gradient).
    """
    with torch.no_grad():
        T = rewards.shape[0]
        done = terminated | truncated
        final = torch.where(terminated, torch.zeros_like(final_values), final_values)
        next_values = _next_values(values, bootstrap_value, done, final)
        discounts = gamma * (~terminated).to(rewards.dtype)
        rhos = log_rhos.exp()
        clipped_rhos = rhos.clamp(max=rho_bar)
        cs = lam * rhos.clamp(max=c_bar)
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        # v_s - V(x_s) = sum_{k >= s} (prod_{s <= j < k} g_j) delta_k,
        # g_j = gamma_j c_j where step j ends no episode, else 0
        g = discounts * cs * (~done).to(rewards.dtype)
        upper = torch.ones(T, T, *g.shape[1:], dtype=g.dtype, device=g.device)
        idx = torch.arange(T, device=g.device)
        mask = (idx.view(T, 1) <= idx.view(1, T))  # [s, j]: j >= s
        upper = torch.where(mask.view(T, T, *([1] * (g.dim() - 1))), g.unsqueeze(0), upper)
        # prod_{s <= j < k} g_j = cumprod over j of row s, shifted by one (k = s: empty product)
        prods = torch.cumprod(upper, dim=1)
        coef = torch.cat([torch.ones_like(prods[:, :1]), prods[:, :-1]], dim=1)
        coef = coef * mask.view(T, T, *([1] * (g.dim() - 1)))
        vs_minus_v = (coef * deltas.unsqueeze(0)).sum(1)
        vs = values + vs_minus_v
        next_vs = _next_values(vs, bootstrap_value, done, final)
        pg_rhos = rhos.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
        pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
    return VTraceReturns(vs, pg_advantages)


def vtrace_reference(log_rhos: np.ndarray, rewards: np.ndarray, values: np.ndarray,
                     bootstrap_value: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                     final_values: np.ndarray, gamma: float, rho_bar: float = 1.0,
                     c_bar: float = 1.0, pg_rho_bar: float | None = None,
                     lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """`vtrace` as IMPALA's backward recursion, one element at a time in float64 (the
    reference); same arguments as NumPy arrays; returns ``(vs, pg_advantages)``."""
    T, B = rewards.shape
    pg_rho_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    for b in range(B):
        acc = 0.0  # v_{t+1} - V(x_{t+1}) within the episode
        for t in reversed(range(T)):
            rho = float(np.exp(log_rhos[t, b]))
            if terminated[t, b]:
                nv, disc, carry = 0.0, 0.0, 0.0
            elif truncated[t, b]:
                nv, disc, carry = float(final_values[t, b]), gamma, 0.0
            else:
                nv = float(bootstrap_value[b] if t == T - 1 else values[t + 1, b])
                disc, carry = gamma, (0.0 if t == T - 1 else acc)
            delta = min(rho_bar, rho) * (rewards[t, b] + disc * nv - values[t, b])
            acc = delta + disc * lam * min(c_bar, rho) * carry
            vs[t, b] = values[t, b] + acc
            next_vs = nv if (terminated[t, b] or truncated[t, b] or t == T - 1) else vs[t + 1, b]
            adv[t, b] = min(pg_rho_bar, rho) * (rewards[t, b] + disc * next_vs - values[t, b])
    return vs, adv
