"""A check that collection keeps a tensor pool's per-step arrays on the device: counts the
calls that take a tensor to the host (`host_transfers`)."""

from __future__ import annotations

import contextlib
import sys

import torch

_TO_HOST = ("numpy", "__array__", "cpu", "tolist", "item", "__bool__", "__float__", "__int__")
"""the tensor methods through which a value leaves a device (``bool(t)``: ``if t.any():``)"""


_WARP_POOL = "gmi_drl/envs/warp/pool.py"
"""not counted: on Warp's CPU device the pool checks the actions for NaN (``bool(...)``), a
check it skips on a CUDA device, where its tensors would have to leave the device"""


@contextlib.contextmanager
def host_transfers():
    """Counts, in the yielded list's one element, the calls of `_TO_HOST` methods on tensors
    and of ``torch.from_numpy`` (host memory as a tensor: what a copy between the device and
    the host goes through) while the block runs, from any Python code but the warp pool's
    (`_WARP_POOL`)."""
    count = [0]
    saved = {name: getattr(torch.Tensor, name) for name in _TO_HOST}

    def counting(original):
        def method(self, *args, **kwargs):
            if not sys._getframe(1).f_code.co_filename.endswith(_WARP_POOL):
                count[0] += 1
            return original(self, *args, **kwargs)
        return method

    for name, original in saved.items():
        setattr(torch.Tensor, name, counting(original))
    from_numpy = torch.from_numpy
    torch.from_numpy = counting(from_numpy)
    try:
        yield count
    finally:
        torch.from_numpy = from_numpy
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


def per_step_transfers(collect) -> int:
    """Host transfers that grow with the steps of a collection: ``collect(k)`` runs ``k``
    steps; the count of ``collect(4)`` minus that of ``collect(2)`` (0 when a collection takes
    to the host only a fixed number of arrays, at its end)."""
    collect(2)  # (first calls build what later ones reuse)
    counts = []
    for k in (2, 4):
        with host_transfers() as n:
            collect(k)
        counts.append(n[0])
    return counts[1] - counts[0]
