"""`GradReducer`: how gradients leave a trainer. In place, averaging, collective.

Every member of a group calls `allreduce_` in the same order with tensors of the same shapes;
on return each tensor holds the element-wise mean over the group. Implementations differ only in
where the sum is formed (GMI-DRL §4.1: host shared memory, rings, a hierarchy; iSwitch: the
network).
"""

from __future__ import annotations

import abc
from typing import Sequence

import torch


class GradReducer(abc.ABC):
    """A member of a reduction group of ``world_size`` trainers, this one being ``rank``."""

    rank: int
    world_size: int

    @abc.abstractmethod
    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace every tensor by its mean over the group, in place. Blocking, collective.

        Args:
            tensors: float32 tensors (any shapes, contiguous or not); the same shapes in the same
                order on every member.

        Raises:
            RuntimeError: the group broke (a member died or timed out).
        """

    def close(self) -> None:
        """Leave the group and free its resources. Idempotent."""


class IdentityReducer(GradReducer):
    """The group of one trainer: nothing to reduce."""

    rank, world_size = 0, 1

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        return None


def flatten_into(tensors: Sequence[torch.Tensor], out: torch.Tensor) -> None:
    """Copy ``tensors`` one after another into the 1-d float32 ``out[:total numel]``."""
    offset = 0
    for t in tensors:
        n = t.numel()
        out[offset:offset + n].view_as(t).copy_(t)
        offset += n


def unflatten_from(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Inverse of `flatten_into`: copy consecutive slices of ``flat`` back into ``tensors``."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n
