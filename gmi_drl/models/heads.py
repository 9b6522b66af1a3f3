"""Action distributions of a policy, as plain tensor formulas (no ``torch.distributions`` overhead).

Each head maps the actor network's output ``out`` to log-probabilities, entropies and samples.
A sample is drawn in two steps, ``noise(n, generator)`` then the pure ``sample_with(out,
noise)``, so a compiled policy can take the draws as an input and stay deterministic.
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
        self.out_dim = action_dim
        self.logstd = nn.Parameter(torch.zeros(1, action_dim))

    def log_prob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``(N,)``: sum over action dims of ``-(a-mu)^2 / (2 sigma^2) - log sigma - log(2 pi)/2``."""
        z = (action - mean) * torch.exp(-self.logstd)
        return (-0.5 * z * z - self.logstd - _HALF_LOG_2PI).sum(-1)

    def entropy(self, mean: torch.Tensor) -> torch.Tensor:
        """``(N,)``: ``sum(1/2 + log(2 pi)/2 + log sigma)``, the same for every state."""
        return (0.5 + _HALF_LOG_2PI + self.logstd).sum(-1).expand(mean.shape[0])

    def noise(self, n: int, generator: torch.Generator | None,
              device: torch.device | str = "cpu") -> torch.Tensor:
        """``(n, A) float32`` standard normal draws (what `sample_with` turns into actions)."""
        return torch.randn((n, self.out_dim), generator=generator, device=device)

    def sample_with(self, mean: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """``mean + sigma * noise``: a sample, given `noise`'s draws (a pure function)."""
        return mean + torch.exp(self.logstd) * noise

    def mode(self, mean: torch.Tensor) -> torch.Tensor:
        return mean


class CategoricalHead(nn.Module):
    """Categorical over ``n`` discrete actions; ``out`` is logits ``(N, n)``, actions ``(N,) int64``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.out_dim = n

    def log_prob(self, logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, -1).gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, -1)
        return -(logp.exp() * logp).sum(-1)

    def noise(self, n: int, generator: torch.Generator | None,
              device: torch.device | str = "cpu") -> torch.Tensor:
        """``(n, out_dim) float32`` uniform draws ``U`` (what `sample_with` turns into actions)."""
        return torch.rand((n, self.out_dim), generator=generator, device=device)

    def sample_with(self, logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Gumbel-max: ``argmax(logits + G)``, ``G = -log(-log U)``, an exact sample of the
        softmax distribution (cheaper than ``torch.multinomial`` for small batches)."""
        return (logits - noise.log().neg().log()).argmax(-1)

    def mode(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)
