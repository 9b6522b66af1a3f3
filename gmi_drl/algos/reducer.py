"""`GradReducer`: how gradients leave a learner (DESIGN.md §4).

The multi-trainer reducers (shared memory, ring, hierarchical, iSwitch) live in ``gmi_drl.comm``
and satisfy this protocol; a learner only ever calls `GradReducer.allreduce_`.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch


class GradReducer(Protocol):
    """Averages gradients over every trainer of a group."""

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its mean over all trainers of the group.

        A collective: every member calls it in the same order with the same shapes and dtypes;
        blocks until the result is in ``tensors``.
        """


class IdentityReducer:
    """The reducer of a group of one trainer: the mean of one value is itself (no-op)."""

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Leaves ``tensors`` as they are."""
