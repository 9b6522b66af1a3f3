"""Where the rollout path's arrays live: NumPy views on the CPU, torch tensors on a device.

The collector and the normalisers are written once, with operators and methods that NumPy
arrays and torch tensors share (``+ - * / ** | & ~``, ``x[i] = y``, ``.sum(0)``, ``.clip``,
``.any()``); the few operations that differ go through one `Arrays` object chosen at
construction. On the CPU every array is a NumPy view of a torch tensor's memory (zero copy), so
the hot path pays NumPy's per-op cost, several times smaller than torch's for the small arrays
of a step; on a GPU they are the tensors themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Array = Any
"""``np.ndarray`` (`HostArrays`) or ``torch.Tensor`` (`DeviceArrays`)"""


class HostArrays:
    """Arrays on the CPU, as NumPy views of torch tensors (zero copy both ways)."""

    device = torch.device("cpu")

    def from_pool(self, x: np.ndarray) -> np.ndarray:
        """A pool's output as an array of this kind: the view itself (valid until the pool's
        next step)."""
        return x

    def to_pool(self, x: np.ndarray) -> np.ndarray:
        """An array as the NumPy a pool takes."""
        return x

    def view(self, t: torch.Tensor) -> np.ndarray:
        """A CPU tensor's memory as an array (writes go into the tensor)."""
        return t.numpy()

    def float32(self, x: np.ndarray) -> np.ndarray:
        """A new float32 array with ``x``'s values."""
        return x.astype(np.float32)

    def copy(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def nonzero(self, mask: np.ndarray) -> np.ndarray:
        """Indices ``(k,) int64`` where the 1-d ``mask`` is true."""
        return np.flatnonzero(mask)

    def full(self, shape: tuple[int, ...], value: float) -> np.ndarray:
        """A float64 array of ``value``."""
        return np.full(shape, value, np.float64)

    def to_torch(self, x: np.ndarray) -> torch.Tensor:
        """A CPU tensor copy of ``x`` (for checkpoints)."""
        return torch.from_numpy(np.array(x))

    def from_torch(self, t: torch.Tensor) -> np.ndarray:
        """A float64 array copy of the tensor ``t`` (from a checkpoint)."""
        return t.detach().cpu().numpy().astype(np.float64)


class DeviceArrays:
    """Arrays as torch tensors on ``device``. A CPU pool's NumPy crosses to the device and back
    each step; a pool whose outputs are already tensors there (the warp engine on a GPU,
    ``pool_tensors=True``) hands them over and takes its actions as tensors: no host copy."""

    def __init__(self, device: torch.device | str, pool_tensors: bool = False) -> None:
        self.device = torch.device(device)
        self.pool_tensors = pool_tensors

    def from_pool(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x.to(self.device, non_blocking=True)  # the tensor itself when on the device
        return torch.from_numpy(x).to(self.device, non_blocking=True)

    def to_pool(self, x: torch.Tensor) -> np.ndarray | torch.Tensor:
        return x if self.pool_tensors else x.cpu().numpy()

    def view(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def float32(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32, copy=True)

    def copy(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def nonzero(self, mask: torch.Tensor) -> torch.Tensor:
        return mask.nonzero().squeeze(1)

    def full(self, shape: tuple[int, ...], value: float) -> torch.Tensor:
        return torch.full(shape, value, dtype=torch.float64, device=self.device)

    def to_torch(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().cpu().clone()

    def from_torch(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(self.device, torch.float64)


Arrays = HostArrays | DeviceArrays


def to_host(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """A NumPy copy of a pool's output or an array of either kind (for episode statistics)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.array(x)


def flatnonzero(mask: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Indices ``(k,) int64`` where the 1-d ``mask`` is true, of the same kind as ``mask``."""
    if isinstance(mask, torch.Tensor):
        return mask.nonzero().squeeze(1)
    return np.flatnonzero(mask)


def arrays_for(device: torch.device | str, pool_tensors: bool = False) -> Arrays:
    """`HostArrays` for the CPU, `DeviceArrays` for any other torch device, or for any device
    where the pool's outputs are torch tensors (``pool_tensors``: a pool's ``tensors``)."""
    device = torch.device(device)
    if device.type == "cpu" and not pool_tensors:
        return HostArrays()
    return DeviceArrays(device, pool_tensors)


def pool_arrays(arrays: Arrays, pool) -> Arrays:
    """The arrays a collection over ``pool`` uses: ``arrays``, or for a pool whose outputs are
    torch tensors (``pool.tensors``: the warp engine) its tensor-pool `DeviceArrays` on the
    pool's ``device``, so that nothing of a step crosses to the host."""
    if not getattr(pool, "tensors", False):
        return arrays
    return DeviceArrays(getattr(pool, "device", arrays.device), pool_tensors=True)
