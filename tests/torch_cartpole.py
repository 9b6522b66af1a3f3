"""A discrete-action pool of tensors for tests: CartPole-v1's dynamics (Gymnasium's
``cartpole.py``, Euler; as `gmi_drl.envs.classic_control.CartPole`) for ``num_envs`` envs as
torch tensors on one device, with the pool API of a ``same_step`` pool whose outputs are tensors
(``tensors = True``, as the warp engine on a GPU). No warp task has discrete actions; this one
steps wherever its tensors are, so DQN's collection can be checked on a device without a
tensor face over a NumPy pool (which would take every step to the host)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from gmi_drl.envs.spec import AutoresetMode, EnvSpec

_THETA_LIMIT = 12 * 2 * math.pi / 360


class TorchCartPole:
    """``num_envs`` CartPoles stepped together in float64 tensors on ``device``; episodes
    truncated after ``max_episode_steps``. Outputs as `gmi_drl.envs.warp.pool.WarpPool`'s
    (``info``: ``final_obs``, ``episode_return``, ``episode_length``, ``episode_end``,
    ``env_id``), fresh tensors each step; with ``tensors=False`` the same as NumPy arrays
    (actions taken as NumPy too), for comparisons with the host path."""

    def __init__(self, num_envs: int, seed: int = 0, device: str = "cpu",
                 max_episode_steps: int = 500, tensors: bool = True) -> None:
        self.tensors = tensors
        self.num_envs = self.env_batch_size = num_envs
        self.autoreset = AutoresetMode.SAME_STEP
        self.device = torch.device(device)
        high = np.array([4.8, np.inf, 2 * _THETA_LIMIT, np.inf], np.float32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.spec = EnvSpec("CartPole-torch", self.observation_space, self.action_space,
                            max_episode_steps)
        self.max_episode_steps = max_episode_steps
        self._rng = torch.Generator(self.device).manual_seed(seed)
        self._ids = torch.arange(num_envs, device=self.device)
        self._actions: torch.Tensor | None = None

    def _draw(self) -> torch.Tensor:
        u = torch.rand((self.num_envs, 4), generator=self._rng, device=self.device,
                       dtype=torch.float64)
        return u * 0.1 - 0.05

    def reset(self):
        self.state = self._draw()
        self.returns = torch.zeros(self.num_envs, dtype=torch.float64, device=self.device)
        self.lengths = torch.zeros(self.num_envs, dtype=torch.int32, device=self.device)
        return self._out(self.state.float()), {"env_id": self._out(self._ids)}

    def _out(self, x: torch.Tensor):
        return x if self.tensors else x.numpy()

    def send(self, actions) -> None:
        self._actions = torch.as_tensor(actions, device=self.device)

    def recv(self):
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(self._actions == 1, 10.0, -10.0).double()
        cos, sin = theta.cos(), theta.sin()
        temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
        thetaacc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        xacc = temp - 0.05 * thetaacc * cos / 1.1
        state = torch.stack([x + 0.02 * x_dot, x_dot + 0.02 * xacc,
                             theta + 0.02 * theta_dot, theta_dot + 0.02 * thetaacc], 1)
        terminated = (state[:, 0].abs() > 2.4) | (state[:, 2].abs() > _THETA_LIMIT)
        self.returns += 1.0
        self.lengths += 1
        truncated = (self.lengths >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        info = {"env_id": self._ids, "final_obs": state.float(), "episode_end": done,
                "episode_return": self.returns.clone(), "episode_length": self.lengths.clone()}
        self.state = torch.where(done[:, None], self._draw(), state)
        self.returns = self.returns.where(~done, 0.0)
        self.lengths = self.lengths.where(~done, 0)
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        info = {k: self._out(v) for k, v in info.items()}
        return (self._out(self.state.float()), self._out(reward), self._out(terminated),
                self._out(truncated), info)

    def step(self, actions: torch.Tensor):
        self.send(actions)
        return self.recv()

    def check_limits(self) -> None:
        """Nothing to check."""

    def close(self) -> None:
        """Nothing to free."""
