"""The reduction of a run: how trainers average gradients. One choice, six ways.

``mpr``, ``mrr`` and ``har`` are GMI-DRL §4.1's layout-aware strategies, and ``auto`` picks one
of them with its Algorithm 1 (`select_reduction`); ``ring`` is one gloo/NCCL ring over all
trainers (the iSwitch paper's AllReduce baseline); ``switch`` aggregates in the network (iSwitch);
``ps`` sends every gradient to a parameter server (iSwitch's PS baseline).
A run resolves the choice into its layout once (`gmi_drl.gmi.layout.plan`); the launchers build
each trainer's `GradReducer` from that.
"""

from __future__ import annotations

import enum
from typing import Sequence


class Reduction(str, enum.Enum):
    """How a run's trainers reduce gradients."""

    MPR = "mpr"  # multi-process reduction through host memory (GMI-DRL §4.1, Fig. 4a)
    MRR = "mrr"  # multi-ring: one ring per GMI slot across devices, then one more (Fig. 4b)
    HAR = "har"  # hierarchical: within a device via host memory, leaders across devices (Fig. 4c)
    RING = "ring"  # one ring over every trainer (torch.distributed)
    SWITCH = "switch"  # the iSwitch aggregation switch
    PS = "ps"  # a parameter server (iSwitch's PS baseline, `gmi_drl.comm.ps`)


def select_reduction(mpl: Sequence[Sequence[int]]) -> Reduction:
    """Algorithm 1 of GMI-DRL, exactly.

    Args:
        mpl: the GMI-to-device mapping list, one list of GMI ids per device, e.g.
            ``[[0, 1, 2], [3, 4, 5]]``.

    Returns:
        ``MPR`` when all GMIs sit on one device; ``HAR`` when devices hold different numbers of
        GMIs, or more GMIs per device than there are devices (the last ring of MRR would then
        hold two GMIs of one GPU, which NCCL forbids); ``MRR`` otherwise.

    Raises:
        ValueError: an empty mapping, an empty device list, or a GMI id listed twice.
    """
    check_mpl(mpl)
    if len(mpl) <= 1:
        return Reduction.MPR
    gmis_per_device = {len(gmis) for gmis in mpl}
    if len(gmis_per_device) > 1:
        return Reduction.HAR
    if gmis_per_device.pop() > len(mpl):
        return Reduction.HAR
    return Reduction.MRR


def check_mpl(mpl: Sequence[Sequence[int]]) -> None:
    """Raise ``ValueError`` for an empty mapping, an empty device or a GMI id listed twice."""
    if len(mpl) == 0 or any(len(gmis) == 0 for gmis in mpl):
        raise ValueError(f"mpl={mpl!r}: every device needs at least one GMI")
    ids = [g for gmis in mpl for g in gmis]
    if len(set(ids)) != len(ids):
        raise ValueError(f"mpl={mpl!r}: a GMI id appears more than once")


def why_not(reduction: Reduction, mpl: Sequence[Sequence[int]]) -> str | None:
    """Why ``reduction`` cannot serve layout ``mpl``, or ``None`` when it can: MRR's rings need
    the same number of GMIs on every device and at most as many as there are devices (Algorithm
    1, line 17); the others serve any layout."""
    check_mpl(mpl)
    if reduction is Reduction.MRR and select_reduction(mpl) is not Reduction.MRR:
        return (f"mrr needs the same number of GMIs on every device, at most as many as there "
                f"are devices; layout {[list(g) for g in mpl]} has not (Algorithm 1 picks "
                f"{select_reduction(mpl).value})")
    return None
