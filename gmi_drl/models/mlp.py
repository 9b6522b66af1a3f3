"""Multi-layer perceptrons built from a layer string (GMI-DRL paper, Table 6 notation).

``"11:64:64:3"`` is an MLP with 11 inputs, two hidden layers of 64 units and 3 outputs; the
activation follows every layer but the last. Source: the GMI-DRL paper, Table 6.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Tanh(nn.Module):
    """``tanh(x)`` computed as ``2 sigmoid(2x) - 1`` (same function, |error| < 2e-7 in float32).

    Why: torch's CPU ``tanh`` kernel is several times slower than its ``sigmoid`` kernel, and
    eager activations are a large compute cost of small-MLP training on a CPU.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(2.0 * x) * 2.0 - 1.0


ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def parse_layers(layers: str) -> list[int]:
    """Parse ``"11:64:64:3"`` into ``[11, 64, 64, 3]``.

    Raises:
        ValueError: fewer than two sizes, or a size that is not a positive integer.
    """
    parts = layers.split(":")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"layer string {layers!r} must be two or more positive ints joined by "
                         "':' (e.g. '11:64:64:3')")
    return sizes


def layer_init(layer: nn.Linear | nn.Conv2d, gain: float = math.sqrt(2.0)) -> nn.Module:
    """Orthogonal weights with ``gain``, zero bias (CleanRL's ``layer_init``; PPO paper's setup)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class MLP(nn.Sequential):
    """``Linear -> act -> ... -> Linear`` from a layer string.

    Args:
        layers: e.g. ``"11:64:64:3"`` (input size first, output size last).
        activation: ``"tanh"``, ``"relu"`` or ``"elu"``, after every hidden layer.
        out_gain: orthogonal-init gain of the last layer (CleanRL: 0.01 policy, 1.0 value).
        orthogonal: orthogonal weights and zero biases (`layer_init`; PPO, A2C, DQN); ``False``
            keeps torch's default init (what DDPG/TD3 implementations use).

    Input ``(N, in)`` float32, output ``(N, out)`` float32.

    Raises:
        ValueError: a bad layer string or an unknown activation.
    """

    def __init__(self, layers: str, activation: str = "tanh", out_gain: float = 1.0,
                 orthogonal: bool = True) -> None:
        sizes = parse_layers(layers)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} must be one of {sorted(ACTIVATIONS)}")
        modules: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            linear = nn.Linear(n_in, n_out)
            if orthogonal:
                layer_init(linear, out_gain if last else math.sqrt(2))
            modules.append(linear)
            if not last:
                modules.append(ACTIVATIONS[activation]())
        super().__init__(*modules)
        self.layers = layers

    def extra_repr(self) -> str:
        return f"layers={self.layers!r}"
