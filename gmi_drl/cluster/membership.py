"""Which Ray node holds which GMI, and the reduction layout that follows from it.

Node membership is what Ray reports after placement (each actor's node id), never configuration.
GMIs of one node reduce through host shared memory; across nodes the first GMI of each node (its
leader) joins a gloo ring of leaders: GMI-DRL's hierarchical reduction (HAR, §4.1, Fig. 4c) with
nodes in place of devices. With every GMI on one node, Algorithm 1 picks MPR (line 2).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

from gmi_drl.comm.reduction import Reduction
from gmi_drl.gmi.layout import Layout


class NodeInfo(NamedTuple):
    """Where one GMI actor runs."""

    node_id: str
    """Ray node id (hex)"""
    ip: str
    """the node's IP address"""
    pid: int
    """the actor's process id on that node"""

    def __str__(self) -> str:
        return f"node {self.node_id[:12]} at {self.ip}"


def node_mpl(nodes: Sequence[NodeInfo]) -> tuple[tuple[int, ...], ...]:
    """GMI ids grouped by node: ``nodes[g]`` is GMI ``g``'s node; nodes are ordered by their
    lowest GMI id, GMIs ascending within a node (so GMI 0 leads node 0).

    Raises:
        ValueError: ``nodes`` is empty.
    """
    if not nodes:
        raise ValueError("no GMIs: nodes is empty")
    groups: dict[str, list[int]] = {}
    for g, node in enumerate(nodes):
        groups.setdefault(node.node_id, []).append(g)
    return tuple(tuple(gmis) for gmis in groups.values())


def reduction_layout(layout: Layout, nodes: Sequence[NodeInfo]) -> Layout:
    """``layout`` with ``mpl`` grouped by Ray node (the shared-memory domain) and its reduction:
    MPR when one node holds every GMI (Algorithm 1, line 2), HAR otherwise; a ``switch`` or
    ``ps`` reduction (a service every GMI reaches) stays. Specs are unchanged.

    Raises:
        ValueError: ``nodes`` does not name a node for every GMI of ``layout``.
    """
    if len(nodes) != layout.num_gmis:
        raise ValueError(f"{len(nodes)} nodes for {layout.num_gmis} GMIs")
    mpl = node_mpl(nodes)
    if layout.reduction in (Reduction.SWITCH, Reduction.PS):
        return dataclasses.replace(layout, mpl=mpl)
    if len(mpl) == 1:
        why = "every GMI on one node: shared memory (Algorithm 1, line 2)"
        return dataclasses.replace(layout, mpl=mpl, reduction=Reduction.MPR, reduction_reason=why)
    why = (f"shared memory within each node, gloo among the node leaders "
           f"{[gmis[0] for gmis in mpl]}")
    return dataclasses.replace(layout, mpl=mpl, reduction=Reduction.HAR, reduction_reason=why)


def describe(reduction: Layout, nodes: Sequence[NodeInfo], restarts: int) -> str:
    """Markdown lines for `summary.md`: the Ray nodes with their GMIs (``reduction``: the layout
    `reduction_layout` made) and how many times the GMIs were restarted."""
    lines = [f"- placement: Ray, {len(reduction.mpl)} node(s), one actor per GMI "
             f"(placement group, one bundle per GMI, packed)"]
    for gmis in reduction.mpl:
        lines.append(f"- {nodes[gmis[0]]}: GMIs {list(gmis)}")
    lines.append(f"- restarts from the last checkpoint after a GMI failed: {restarts}")
    return "\n".join(lines) + "\n"
