from gmi_drl.comm.reduction import Reduction
from gmi_drl.gmi.backends import BackendKind
from gmi_drl.gmi.devices import Machine
from gmi_drl.gmi.layout import Template, plan

import pytest

CPU = Machine((), (0, 1), "no GPU: test")


def test_cpu_layout_packs_gmis_per_device_and_picks_the_reduction():
    lay = plan(4, CPU)
    assert lay.mpl == ((0, 1, 2, 3),) and lay.reduction is Reduction.MPR
    assert lay.backend is BackendKind.CPU and lay.specs[2].compute_share == 0.25
    assert plan(4, CPU, num_devices=2).reduction is Reduction.MRR
    lay = plan(5, CPU, num_devices=2)
    assert lay.mpl == ((0, 1, 2), (3, 4)) and lay.reduction is Reduction.HAR
    assert lay.device_of(4) == 1
    assert "mpl" in lay.describe() and "har" in lay.describe()


def test_invalid_plans():
    with pytest.raises(ValueError, match="every device needs a GMI"):
        plan(1, CPU, num_devices=2)
    assert plan(2, CPU, template=Template.SERVING).specs[0].roles == ("simulator", "agent")


def test_a_forced_reduction_is_kept_when_the_layout_allows_it():
    lay = plan(4, CPU, num_devices=2, reduction="har")
    assert lay.reduction is Reduction.HAR and "chosen with gmi.reduction har" in lay.describe()
    assert plan(4, CPU, reduction="ring").reduction is Reduction.RING
    with pytest.raises(ValueError, match="mrr needs"):
        plan(5, CPU, num_devices=2, reduction="mrr")
    assert "gradient reduction: none (one GMI)" in plan(1, CPU).describe()
