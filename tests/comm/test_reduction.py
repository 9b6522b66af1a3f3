"""Algorithm 1 (GMI-DRL §4.1): one test per branch, plus input errors."""

import pytest

from gmi_drl.comm import Reduction, select_reduction
from gmi_drl.comm.reduction import why_not


def test_one_device_is_multi_process_reduction():
    assert select_reduction([[0, 1, 2, 3]]) is Reduction.MPR
    assert select_reduction([[0]]) is Reduction.MPR


def test_uneven_gmis_per_device_is_hierarchical():
    assert select_reduction([[0, 1, 2], [3, 4]]) is Reduction.HAR


def test_more_gmis_per_device_than_devices_is_hierarchical():
    assert select_reduction([[0, 1, 2], [3, 4, 5]]) is Reduction.HAR


def test_even_layout_with_enough_devices_is_multi_ring():
    assert select_reduction([[0, 1], [2, 3]]) is Reduction.MRR
    assert select_reduction([[0, 1], [2, 3], [4, 5]]) is Reduction.MRR
    assert select_reduction([[0], [1], [2], [3]]) is Reduction.MRR


@pytest.mark.parametrize("mpl", [[], [[0], []], [[0, 1], [1, 2]]])
def test_invalid_layouts_raise(mpl):
    with pytest.raises(ValueError, match="mpl="):
        select_reduction(mpl)


def test_a_forced_reduction_must_fit_the_layout():
    assert why_not(Reduction.MRR, [[0, 1], [2, 3]]) is None
    assert "mrr needs the same number of GMIs on every device" in why_not(Reduction.MRR,
                                                                        [[0, 1, 2], [3]])
    for other in (Reduction.MPR, Reduction.HAR, Reduction.RING, Reduction.SWITCH):
        assert why_not(other, [[0, 1, 2], [3]]) is None
