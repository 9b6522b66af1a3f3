"""Episode bookkeeping of a collection: the episodes that ended, in completion order.

A collection records each step's episode ends through one `EpisodeEnds` interface in two
variants (`episode_ends` picks): `HostEnds` copies the ended rows' totals to the host at the
steps where an episode ended (a pool of NumPy arrays); `DeviceEnds` writes every step's totals
into ``(num_steps, num_envs)`` tensors on the pool's device (a pool of device tensors: no host
sync per step) and returns them as `DeviceEpisodes`, read to the host once, where a field is
first read: the runner's loop reads them at its logged iterations only, so an off-policy
iteration of one env step on thousands of worlds (FastTD3's schedule) does not wait for the
device every step.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NamedTuple, Protocol

import numpy as np
import torch

from gmi_drl.rollout.arrays import to_host


class Episodes(NamedTuple):
    """Episodes that finished during one collection, in completion order."""

    returns: np.ndarray
    """``(k,) float64``, undiscounted, unnormalised episode returns"""
    lengths: np.ndarray
    """``(k,) int64``, env steps per episode"""
    extras: Mapping[str, np.ndarray] = MappingProxyType({})
    """``{name: (k,) float64}``: a task's own per-episode totals, from the pool's
    ``info["episode_<name>"]`` (ShadowHand's ``successes``), logged as ``env/episodic_<name>``"""

    @staticmethod
    def concat(returns: list[np.ndarray], lengths: list[np.ndarray],
               extras: Mapping[str, list[np.ndarray]] | None = None) -> "Episodes":
        """One `Episodes` from per-step pieces (empty lists: no episode)."""
        def join(parts: list[np.ndarray], dtype) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        return Episodes(join(returns, np.float64), join(lengths, np.int64),
                        {k: join(v, np.float64) for k, v in (extras or {}).items()})

    @staticmethod
    def merge(parts: list["Episodes"]) -> "Episodes":
        """The episodes of several collections, in order (a logged row covers every iteration
        since the last one)."""
        names = {k for p in parts for k in p.extras}
        return Episodes.concat([p.returns for p in parts], [p.lengths for p in parts],
                               {k: [p.extras[k] for p in parts if k in p.extras]
                                for k in names})


_TOTALS = ("episode_return", "episode_length", "episode_end")


def extra_totals(info: dict) -> list[str]:
    """The ``info`` keys of a task's own per-episode totals: ``episode_<name>`` other than
    return, length and end."""
    return [k for k in info if k.startswith("episode_") and k not in _TOTALS]


class EpisodeEnds(Protocol):
    """The episode ends of one collection of ``num_steps`` steps of ``num_envs`` envs."""

    def record(self, t: int, cols: slice, info: dict, ended: bool) -> None:
        """Step ``t`` of the envs ``cols``: a ``same_step`` pool's ``info`` (``episode_end``,
        ``episode_return``, ``episode_length``, ``episode_<name>``: arrays of the pool's kind);
        ``ended``: whether an episode may have ended (``False``: none did)."""

    def episodes(self) -> Episodes:
        """The episodes that ended, step by step and env ids ascending."""


class HostEnds:
    """`EpisodeEnds` of a pool of NumPy arrays: the ended rows' totals copied at their step."""

    def __init__(self) -> None:
        self.returns: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.extras: dict[str, list[np.ndarray]] = {}

    def record(self, t: int, cols: slice, info: dict, ended: bool) -> None:
        if not ended:
            return
        end = info["episode_end"]  # Atari with episodic life: whole games only
        self.returns.append(to_host(info["episode_return"][end]))
        self.lengths.append(to_host(info["episode_length"][end]))
        for key in extra_totals(info):
            self.extras.setdefault(key[len("episode_"):], []).append(to_host(info[key][end]))

    def episodes(self) -> Episodes:
        return Episodes.concat(self.returns, self.lengths, self.extras)


class DeviceEnds:
    """`EpisodeEnds` kept on ``device``: ``(num_steps, num_envs)`` tensors written every step,
    read to the host once, by `episodes`."""

    def __init__(self, num_steps: int, num_envs: int, device: torch.device) -> None:
        self.end = torch.zeros(num_steps, num_envs, dtype=torch.bool, device=device)
        self.returns = torch.zeros(num_steps, num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_steps, num_envs, dtype=torch.int64, device=device)
        self.extras: dict[str, torch.Tensor] = {}  # key -> (num_steps, num_envs) float64

    def record(self, t: int, cols: slice, info: dict, ended: bool) -> None:
        self.end[t, cols] = info["episode_end"]
        self.returns[t, cols] = info["episode_return"]
        self.lengths[t, cols] = info["episode_length"]
        for key in extra_totals(info):
            if key not in self.extras:
                self.extras[key] = self.returns.new_zeros(self.returns.shape)
            self.extras[key][t, cols] = info[key]

    def episodes(self) -> "DeviceEpisodes":
        return DeviceEpisodes(self.end, self.returns, self.lengths,
                              {k[len("episode_"):]: v for k, v in self.extras.items()})


class DeviceEpisodes:
    """`Episodes` whose totals are still on the device: ``end`` ``(num_steps, num_envs) bool``
    and each total of the same shape, read to the host (one transfer of each) where a field
    is first read (``returns``, ``lengths``, ``extras``: as `Episodes`'s), then kept."""

    def __init__(self, end: torch.Tensor, returns: torch.Tensor, lengths: torch.Tensor,
                 extras: dict[str, torch.Tensor]) -> None:
        self._device = (end, returns, lengths, extras)
        self._host: Episodes | None = None

    def host(self) -> Episodes:
        """The episodes on the host (`Episodes`; the device's tensors are let go)."""
        if self._host is None:
            end, returns, lengths, extras = self._device
            end = end.cpu()
            self._host = Episodes(returns.cpu()[end].numpy(), lengths.cpu()[end].numpy(),
                                  {k: v.cpu()[end].numpy() for k, v in extras.items()})
            self._device = None
        return self._host

    @property
    def returns(self) -> np.ndarray:
        return self.host().returns

    @property
    def lengths(self) -> np.ndarray:
        return self.host().lengths

    @property
    def extras(self) -> Mapping[str, np.ndarray]:
        return self.host().extras


def episode_ends(on_device: bool, num_steps: int, num_envs: int,
                 device: torch.device) -> HostEnds | DeviceEnds:
    """`DeviceEnds` for a pool of device tensors (``on_device``), else `HostEnds`."""
    return DeviceEnds(num_steps, num_envs, device) if on_device else HostEnds()
