"""Choice of reduction strategy from the GMI layout: GMI-DRL Algorithm 1 (§4.1)."""

from __future__ import annotations

import enum
from typing import Sequence


class Strategy(str, enum.Enum):
    """GMI-DRL §4.1's three layout-aware gradient reduction strategies."""

    MPR = "mpr"  # multi-process reduction through host memory
    MRR = "mrr"  # multi-ring reduction: one ring per GMI slot across devices, then one more
    HAR = "har"  # hierarchical: intra-device via host memory, leaders across devices, broadcast


def select_strategy(mpl: Sequence[Sequence[int]]) -> Strategy:
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
    if len(mpl) == 0 or any(len(gmis) == 0 for gmis in mpl):
        raise ValueError(f"mpl={mpl!r}: every device needs at least one GMI")
    ids = [g for gmis in mpl for g in gmis]
    if len(set(ids)) != len(ids):
        raise ValueError(f"mpl={mpl!r}: a GMI id appears more than once")
    if len(mpl) <= 1:
        return Strategy.MPR
    gmis_per_device = {len(gmis) for gmis in mpl}
    if len(gmis_per_device) > 1:
        return Strategy.HAR
    if gmis_per_device.pop() > len(mpl):
        return Strategy.HAR
    return Strategy.MRR
