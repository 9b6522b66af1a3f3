"""Actor-critic networks: an encoder, a policy output, a value output and an action head."""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import torch
from torch import nn

from gmi_drl.models.cnn import NatureCNN
from gmi_drl.models.heads import CategoricalHead, DiagGaussianHead
from gmi_drl.models.mlp import MLP, layer_init


class ActResult(NamedTuple):
    """One acting step for a batch of ``N`` observations."""

    action: torch.Tensor
    """``(N, A) float32`` (Box) or ``(N,) int64`` (Discrete)"""
    logprob: torch.Tensor
    """``(N,) float32``, log pi(action | obs)"""
    value: torch.Tensor
    """``(N,) float32``, V(obs)"""


class EvalResult(NamedTuple):
    """Re-evaluation of stored ``(obs, action)`` pairs under the current weights (with grad)."""

    logprob: torch.Tensor
    """``(N,)``"""
    entropy: torch.Tensor
    """``(N,)``"""
    value: torch.Tensor
    """``(N,)``"""


class ActorCritic(nn.Module):
    """``trunk`` (shared encoder) feeds ``actor`` (policy output) and ``critic`` (value).

    Args:
        trunk: ``(N, *obs_shape) -> (N, F)``; ``nn.Identity`` when actor and critic are separate MLPs.
        actor: ``(N, F) -> (N, A)`` means (Gaussian) or logits (categorical).
        critic: ``(N, F) -> (N, 1)``.
        head: `DiagGaussianHead` or `CategoricalHead`.
    """

    def __init__(self, trunk: nn.Module, actor: nn.Module, critic: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.trunk, self.actor, self.critic, self.head = trunk, actor, critic, head

    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None,
            deterministic: bool = False) -> ActResult:
        """Sample (or, ``deterministic``, take the mode of) an action for ``obs (N, *obs_shape)``."""
        z = self.trunk(obs)
        out = self.actor(z)
        if deterministic:
            action = self.head.mode(out)
        else:
            action = self.head.sample_with(out, self.head.noise(len(out), generator, out.device))
        return ActResult(action, self.head.log_prob(out, action), self.critic(z).squeeze(-1))

    def act_with(self, obs: torch.Tensor, noise: torch.Tensor) -> ActResult:
        """`act` with the head's draws given (``noise (N, head.out_dim)``, from
        ``head.noise``): a pure function, what a compiled policy runs."""
        z = self.trunk(obs)
        out = self.actor(z)
        action = self.head.sample_with(out, noise)
        return ActResult(action, self.head.log_prob(out, action), self.critic(z).squeeze(-1))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``V(obs)``: ``(N,) float32``."""
        return self.critic(self.trunk(obs)).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> EvalResult:
        """Log-probability of ``action``, entropy and value under the current weights."""
        z = self.trunk(obs)
        out = self.actor(z)
        return EvalResult(self.head.log_prob(out, action), self.head.entropy(out),
                          self.critic(z).squeeze(-1))


def build_actor_critic(observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                       encoder: str = "mlp", actor_hidden: str = "64:64",
                       critic_hidden: str = "64:64", activation: str = "tanh",
                       cnn_features: int = 512) -> ActorCritic:
    """Build CleanRL's PPO networks for a single-env observation and action space.

    ``encoder="mlp"``: separate actor ``"<obs>:<actor_hidden>:<A>"`` and critic
    ``"<obs>:<critic_hidden>:1"`` MLPs (``ppo.py``, ``ppo_continuous_action.py``), flat obs only.
    ``encoder="nature_cnn"``: a shared `NatureCNN` trunk with linear policy and value outputs
    (``ppo_atari.py``), obs ``(C, 84, 84)``, its last layer ``cnn_features`` wide. Output layers use orthogonal gain 0.01 (policy) and
    1.0 (value).

    Raises:
        ValueError: unsupported spaces, a bad layer string, or an observation shape the encoder
            cannot take.
    """
    if isinstance(action_space, gym.spaces.Discrete):
        n_out, head = int(action_space.n), CategoricalHead(int(action_space.n))
    elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        n_out, head = int(action_space.shape[0]), DiagGaussianHead(int(action_space.shape[0]))
    else:
        raise ValueError(f"action space {action_space} is not supported (Discrete or 1-d Box)")
    shape = observation_space.shape
    if encoder == "mlp":
        if len(shape) != 1:
            raise ValueError(f"encoder 'mlp' needs flat observations, got shape {shape}")
        actor = MLP(f"{shape[0]}:{actor_hidden}:{n_out}", activation, out_gain=0.01)
        critic = MLP(f"{shape[0]}:{critic_hidden}:1", activation, out_gain=1.0)
        return ActorCritic(nn.Identity(), actor, critic, head)
    if encoder == "nature_cnn":
        trunk = NatureCNN.for_observations(shape, cnn_features)
        actor = layer_init(nn.Linear(trunk.out_features, n_out), 0.01)
        critic = layer_init(nn.Linear(trunk.out_features, 1), 1.0)
        return ActorCritic(trunk, actor, critic, head)
    raise ValueError(f"encoder {encoder!r} must be 'mlp' or 'nature_cnn'")
