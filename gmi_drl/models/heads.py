"""Action distributions of a policy, as plain tensor formulas (no ``torch.distributions`` overhead).

Each head maps the actor network's output ``out`` to log-probabilities, entropies and samples.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class DiagGaussianHead(nn.Module):
    """Diagonal Gaussian with a state-independent log standard deviation (PPO paper §6.1;
    CleanRL ``ppo_continuous_action.py``: ``actor_logstd`` initialised to 0).

    ``out`` is the mean ``(N, A) float32``; actions are ``(N, A) float32`` (unclipped: clip to the
    action space only when sending them to the environment).
    """

    def __init__(self, action_dim: int) -> None:
        super().__init__()
        self.logstd = nn.Parameter(torch.zeros(1, action_dim))

    def log_prob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``(N,)``: sum over action dims of ``-(a-mu)^2 / (2 sigma^2) - log sigma - log(2 pi)/2``."""
        z = (action - mean) * torch.exp(-self.logstd)
        return (-0.5 * z * z - self.logstd - _HALF_LOG_2PI).sum(-1)

    def entropy(self, mean: torch.Tensor) -> torch.Tensor:
        """``(N,)``: ``sum(1/2 + log(2 pi)/2 + log sigma)``, the same for every state."""
        return (0.5 + _HALF_LOG_2PI + self.logstd).sum(-1).expand(mean.shape[0])

    def sample(self, mean: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        return mean + torch.exp(self.logstd) * noise

    def mode(self, mean: torch.Tensor) -> torch.Tensor:
        return mean


class CategoricalHead(nn.Module):
    """Categorical over ``n`` discrete actions; ``out`` is logits ``(N, n)``, actions ``(N,) int64``."""

    def log_prob(self, logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, -1).gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, -1)
        return -(logp.exp() * logp).sum(-1)

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Gumbel-max: ``argmax(logits + G)``, ``G = -log(-log U)``, an exact sample of the
        softmax distribution (2x cheaper than ``torch.multinomial`` for small batches)."""
        u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype)
        return (logits - u.log_().neg_().log_()).argmax(-1)

    def mode(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)
