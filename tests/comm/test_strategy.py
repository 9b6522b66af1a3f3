"""Algorithm 1 (GMI-DRL §4.1): one test per branch, plus input errors."""

import pytest

from gmi_drl.comm import Strategy, select_strategy


def test_one_device_is_multi_process_reduction():
    assert select_strategy([[0, 1, 2, 3]]) is Strategy.MPR
    assert select_strategy([[0]]) is Strategy.MPR


def test_uneven_gmis_per_device_is_hierarchical():
    assert select_strategy([[0, 1, 2], [3, 4]]) is Strategy.HAR


def test_more_gmis_per_device_than_devices_is_hierarchical():
    assert select_strategy([[0, 1, 2], [3, 4, 5]]) is Strategy.HAR


def test_even_layout_with_enough_devices_is_multi_ring():
    assert select_strategy([[0, 1], [2, 3]]) is Strategy.MRR
    assert select_strategy([[0, 1], [2, 3], [4, 5]]) is Strategy.MRR
    assert select_strategy([[0], [1], [2], [3]]) is Strategy.MRR


@pytest.mark.parametrize("mpl", [[], [[0], []], [[0, 1], [1, 2]]])
def test_invalid_layouts_raise(mpl):
    with pytest.raises(ValueError, match="mpl="):
        select_strategy(mpl)
