"""The Nature DQN convolutional encoder (Mnih et al. 2015), as CleanRL's ``ppo_atari.py`` uses it."""

from __future__ import annotations

import torch
from torch import nn

from gmi_drl.models.mlp import layer_init


class NatureCNN(nn.Module):
    """Three conv layers and a 512-unit linear layer, ReLU after each.

    Input ``(N, C, 84, 84) uint8`` (stacked grey frames, pixel values 0-255; any float dtype works
    too), scaled by 1/255 inside; output ``(N, 512) float32``.

    Args:
        in_channels: stacked frames ``C`` (4 in the Atari preset).
        out_features: width of the final linear layer.
    """

    def __init__(self, in_channels: int = 4, out_features: int = 512) -> None:
        super().__init__()
        self.net = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, out_features)), nn.ReLU(),
        )
        self.out_features = out_features

    @classmethod
    def for_observations(cls, shape: tuple[int, ...], out_features: int = 512) -> "NatureCNN":
        """The encoder of observations of ``shape`` ``(C, 84, 84)``.

        Raises:
            ValueError: another shape (e.g. raw ``(210, 160, 3)`` frames of ``ALE/...`` ids).
        """
        shape = tuple(shape)
        if len(shape) != 3 or shape[1:] != (84, 84):
            raise ValueError(f"encoder 'nature_cnn' needs observations (C, 84, 84), got {shape}")
        return cls(shape[0], out_features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / 255.0)
