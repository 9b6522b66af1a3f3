"""A uniform experience-replay buffer for off-policy algorithms (DQN; Mnih et al. 2015, §Methods
"experience replay").

Preallocated torch tensors on the learner's device, written through NumPy views on the CPU.
Observations keep the pool's dtype (Atari frames stay ``uint8``); each transition stores its
observation and the observation that followed it (the final observation where an episode ended,
so a truncated episode is bootstrapped from its real last state).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

log = logging.getLogger(__name__)


class ReplayBatch(NamedTuple):
    """A sampled minibatch of ``B`` transitions (tensors on the buffer's device)."""

    obs: torch.Tensor
    """``(B, *obs_shape)``, the pool's dtype"""
    actions: torch.Tensor
    """``(B,) int64`` (Discrete) or ``(B, A) float32`` (Box)"""
    rewards: torch.Tensor
    """``(B,) float32``"""
    next_obs: torch.Tensor
    """``(B, *obs_shape)``"""
    terminated: torch.Tensor
    """``(B,) float32``: 1 where the episode terminated (no bootstrap), 0 otherwise"""


class ReplayBuffer:
    """A circular buffer of ``capacity`` transitions, filled ``num_envs`` at a time.

    Args:
        capacity: transitions held (the oldest are overwritten first).
        observation_space, action_space: the task's single-env spaces.
        device: where the tensors live (sampling returns tensors there).

    Raises:
        ValueError: ``capacity < 1``; an action space that is neither Discrete nor Box.
    """

    def __init__(self, capacity: int, observation_space: gym.spaces.Box,
                 action_space: gym.spaces.Space, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity={capacity} must be >= 1")
        self.capacity, self.device = capacity, torch.device(device)
        obs_dtype = torch.from_numpy(np.zeros(0, observation_space.dtype)).dtype
        if obs_dtype != torch.uint8:
            obs_dtype = torch.float32
        shape = (capacity, *observation_space.shape)
        if isinstance(action_space, gym.spaces.Discrete):
            act_shape, act_dtype = (capacity,), torch.int64
        elif isinstance(action_space, gym.spaces.Box):
            act_shape, act_dtype = (capacity, *action_space.shape), torch.float32
        else:
            raise ValueError(f"replay of {type(action_space).__name__} actions is not supported "
                             "(Discrete or Box)")
        d = self.device
        self.obs = torch.zeros(shape, dtype=obs_dtype, device=d)
        self.next_obs = torch.zeros(shape, dtype=obs_dtype, device=d)
        self.actions = torch.zeros(act_shape, dtype=act_dtype, device=d)
        self.rewards = torch.zeros(capacity, dtype=torch.float32, device=d)
        self.terminated = torch.zeros(capacity, dtype=torch.float32, device=d)
        self._tensors = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated)
        self._host = [t.numpy() for t in self._tensors] if d.type == "cpu" else None
        self.pos, self.size = 0, 0

    @classmethod
    def for_spec(cls, capacity: int, spec, device: torch.device | str,
                 state: dict | None = None) -> "ReplayBuffer":
        """A buffer for the spaces of ``spec`` (an `gmi_drl.envs.spec.EnvSpec`), holding
        ``state`` (`state_dict` output) when given; logs its size in bytes.

        Raises:
            ValueError: as the constructor and `load_state_dict`.
        """
        buf = cls(capacity, spec.observation_space, spec.action_space, device)
        log.info("replay buffer: %d transitions, %.1f MB", capacity, buf.nbytes / 1e6)
        if state is not None:
            buf.load_state_dict(state)
        return buf

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds (all of it is allocated up front)."""
        return sum(t.numel() * t.element_size() for t in self._tensors)

    def add(self, obs, actions, rewards, next_obs, terminated) -> None:
        """Append ``n`` transitions (NumPy arrays or tensors with a leading ``n`` dim): the
        oldest are overwritten once the buffer is full."""
        data = (obs, actions, rewards, next_obs, terminated)
        n = len(rewards)
        idx = (self.pos + np.arange(n)) % self.capacity
        if self._host is not None:
            for dst, src in zip(self._host, data):
                dst[idx] = src.numpy() if isinstance(src, torch.Tensor) else src
        else:
            index = torch.from_numpy(idx).to(self.device)
            for dst, src in zip(self._tensors, data):
                src = torch.as_tensor(src).to(self.device, dst.dtype)
                dst.index_copy_(0, index, src)
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> ReplayBatch:
        """``batch_size`` transitions drawn uniformly with replacement from those held.

        Raises:
            ValueError: the buffer is empty.
        """
        if self.size == 0:
            raise ValueError("sample from an empty replay buffer")
        idx = torch.randint(self.size, (batch_size,), generator=generator).to(self.device)
        return ReplayBatch(*(t.index_select(0, idx) for t in self._tensors))

    def state_dict(self) -> dict:
        """The held transitions (``size`` rows of each tensor, on the CPU) and the write
        position."""
        return {"pos": self.pos, "size": self.size,
                "tensors": [t[:self.size].cpu() for t in self._tensors]}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output.

        Raises:
            ValueError: the stored transitions do not fit this buffer (capacity or shapes).
        """
        size = int(state["size"])
        stored = state["tensors"]
        if size > self.capacity or len(stored) != len(self._tensors) or any(
                s.shape[1:] != t.shape[1:] for s, t in zip(stored, self._tensors)):
            raise ValueError(f"stored replay of {size} transitions does not fit a buffer of "
                             f"capacity {self.capacity} with these spaces")
        for dst, src in zip(self._tensors, stored):
            dst[:size].copy_(src)
        self.pos, self.size = int(state["pos"]), size
