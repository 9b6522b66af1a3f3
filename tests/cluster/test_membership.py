"""Node membership from Ray → reduction layout (Algorithm 1 on one node, HAR across nodes)."""

import pytest

from gmi_drl.cluster.membership import NodeInfo, describe, node_mpl, reduction_layout
from gmi_drl.comm.reduction import Reduction
from gmi_drl.gmi.devices import Machine
from gmi_drl.gmi.layout import plan

A, B = NodeInfo("a" * 56, "10.0.0.1", 11), NodeInfo("b" * 56, "10.0.0.2", 12)
CPU_ONLY = Machine((), (0, 1), "no GPU: test")


def test_gmis_are_grouped_by_node_in_order_of_their_lowest_id():
    assert node_mpl([A, B, A, B, B]) == ((0, 2), (1, 3, 4))
    assert node_mpl([B, A]) == ((0,), (1,))  # GMI 0 always leads the first group
    with pytest.raises(ValueError, match="empty"):
        node_mpl([])


@pytest.mark.parametrize("nodes, mpl, reduction", [
    ([A, A, A], ((0, 1, 2),), Reduction.MPR),            # one node: Algorithm 1, line 2
    ([A, B], ((0,), (1,)), Reduction.HAR),               # Algorithm 1 alone would say MRR
    ([A, A, B], ((0, 1), (2,)), Reduction.HAR),
])
def test_reduction_layout(nodes, mpl, reduction):
    planned = plan(len(nodes), CPU_ONLY, num_devices=len(nodes))
    got = reduction_layout(planned, nodes)
    assert got.mpl == mpl and got.reduction is reduction and got.specs == planned.specs
    assert [got.device_of(g) for g in range(len(nodes))] == [
        next(k for k, gmis in enumerate(mpl) if g in gmis) for g in range(len(nodes))]


def test_reduction_layout_needs_a_node_per_gmi():
    with pytest.raises(ValueError, match="1 nodes for 2 GMIs"):
        reduction_layout(plan(2, CPU_ONLY), [A])


def test_describe_names_nodes_leaders_and_restarts():
    layout = reduction_layout(plan(3, CPU_ONLY), [A, A, B])
    text = layout.describe() + describe(layout, [A, A, B], restarts=1)
    assert f"node {'a' * 12} at 10.0.0.1: GMIs [0, 1]" in text
    assert "`har`" in text and "node leaders [0, 2]" in text and "GMI failed: 1" in text


def test_a_switch_reduction_stays_on_ray():
    layout = reduction_layout(plan(3, CPU_ONLY, reduction="switch"), [A, A, B])
    assert layout.reduction is Reduction.SWITCH and layout.mpl == ((0, 1), (2,))
