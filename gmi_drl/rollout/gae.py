"""Generalised advantage estimation with termination and truncation kept apart.

Source: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", eqs. 11-16: ``delta_t = r_t + gamma V(s_{t+1}) - V(s_t)``,
``A_t = sum_l (gamma lambda)^l delta_{t+l}``. At an episode end the sum stops; the value of the
state reached is 0 when the episode *terminated* and ``V(final_obs)`` when it was *truncated*
(time limit: the MDP did not end, so its value is bootstrapped; Pardo et al. 2018).

`gae_reference` is the plain torch version (any device); `gae_numpy` is the CPU kernel (NumPy
views, vectorised ``delta``), tested equal to it. `compute_gae` picks by device.
"""

from __future__ import annotations

import numpy as np
import torch


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor,
                truncated: torch.Tensor, final_values: torch.Tensor, last_values: torch.Tensor,
                gamma: float, gae_lambda: float, advantages: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and value targets of one rollout, in ``same_step`` autoreset convention.

    Args:
        rewards: ``(T, B) float32``, reward of step ``t``.
        values: ``(T, B) float32``, ``V(s_t)`` of the observation acted on at step ``t``.
        terminated: ``(T, B) bool``, the episode reached a terminal state at step ``t``.
        truncated: ``(T, B) bool``, the episode was cut (time limit) at step ``t``; where both are
            set, ``terminated`` wins.
        final_values: ``(T, B) float32``, ``V(final_obs)`` of the state reached at step ``t``;
            read only where ``truncated & ~terminated``.
        last_values: ``(B,) float32``, ``V(s_T)`` of the observation after the last step.
        gamma: discount. gae_lambda: GAE's lambda.
        advantages: optional ``(T, B)`` output tensor (written in place).

    All tensors on one device; CPU tensors go through `gae_numpy`, others `gae_reference`.

    Returns:
        ``(advantages, returns)``, both ``(T, B) float32``; ``returns = advantages + values``.
    """
    out = torch.empty_like(rewards) if advantages is None else advantages
    kernel = gae_numpy if rewards.device.type == "cpu" else gae_reference
    kernel(rewards, values, terminated, truncated, final_values, last_values, gamma, gae_lambda,
           out)
    return out, out + values


def gae_reference(rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor,
                  truncated: torch.Tensor, final_values: torch.Tensor, last_values: torch.Tensor,
                  gamma: float, gae_lambda: float, out: torch.Tensor) -> None:
    """`compute_gae` in plain torch, step by step backwards in time; writes ``out (T, B)``."""
    last = torch.zeros_like(last_values)
    for t in range(rewards.shape[0] - 1, -1, -1):
        next_value = values[t + 1] if t + 1 < rewards.shape[0] else last_values
        done = terminated[t] | truncated[t]
        next_value = torch.where(terminated[t], 0.0,
                                 torch.where(truncated[t], final_values[t], next_value))
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * gae_lambda * (~done) * last
        out[t] = last


def gae_numpy(rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor,
              truncated: torch.Tensor, final_values: torch.Tensor, last_values: torch.Tensor,
              gamma: float, gae_lambda: float, out: torch.Tensor) -> None:
    """`compute_gae` on NumPy views of CPU tensors: ``delta`` for all steps at once, then one
    multiply-add per step; writes ``out (T, B)``."""
    r, v = rewards.numpy(), values.numpy()
    term, trunc = terminated.numpy(), truncated.numpy()
    done = term | trunc
    next_v = np.empty_like(v)
    next_v[:-1] = v[1:]
    next_v[-1] = last_values.numpy()
    next_v = np.where(done, np.where(term, 0.0, final_values.numpy()), next_v)
    delta = r + gamma * next_v - v
    carry = (gamma * gae_lambda) * ~done
    adv = out.numpy()
    last = np.zeros(v.shape[1], dtype=v.dtype)
    for t in range(v.shape[0] - 1, -1, -1):
        last = delta[t] + carry[t] * last
        adv[t] = last
