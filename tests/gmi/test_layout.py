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


def test_emulated_cpu_devices_are_core_sets():
    from gmi_drl.gmi.backends import process_env

    four = Machine((), (0, 1, 2, 3), "no GPU: test")
    lay = plan(3, four, num_devices=2)  # devices {0, 1} and {2, 3}; GMIs 0, 1 share the first
    assert [s.cpu_cores for s in lay.specs] == [(0,), (1,), (2, 3)]
    assert [process_env(s, four, len(lay.mpl[s.device]))[1] for s in lay.specs] == [
        {0}, {1}, {2, 3}]
    assert [s.cpu_cores for s in plan(4, CPU, num_devices=2).specs] == [(0,), (0,), (1,), (1,)]
    assert all(s.cpu_cores is None for s in plan(2, four).specs)  # one device: the even split


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


def test_async_layouts_give_each_role_its_own_device_set():
    from gmi_drl.gmi.backends import BackendKind, process_env
    from gmi_drl.gmi.devices import Gpu, Machine
    from gmi_drl.gmi.layout import plan_async

    cpu = Machine((), (0, 1, 2, 3), "no GPU: test")
    shared = plan_async(1, 3, cpu)  # default on the CPU: every GMI an even share of the cores
    assert shared.mpl == ((0, 1, 2, 3),) and all(s.cpu_cores is None for s in shared.specs)
    split = plan_async(1, 3, cpu, trainer_share=0.25)
    assert split.mpl == ((0,), (1, 2, 3))
    assert [s.roles for s in split.specs] == [("trainer",)] + [("simulator", "agent")] * 3
    pinned = [process_env(s, cpu, len(split.mpl[s.device]))[1] for s in split.specs]
    assert pinned == [{0}, {1}, {2}, {3}]
    assert "trainer GMIs on cores [0], serving GMIs on [1, 2, 3]" in split.describe()
    two = plan_async(2, 2, Machine((), (0, 1, 2, 3, 4, 5), ""), trainer_share=0.5)
    assert [s.cpu_cores for s in two.specs] == [(0,), (1, 2), (3,), (4, 5)]
    gpus = tuple(Gpu(i, "A100", f"GPU-{i}", (8, 0), 40 << 30) for i in range(4))
    four = plan_async(2, 6, Machine(gpus, (0, 1), ""))  # trainers: 2/8 of the GPUs, at least one
    assert four.backend is BackendKind.CUDA_MPS
    assert four.mpl == ((0, 1), (2, 5), (3, 6), (4, 7))
    assert "trainer GMIs on GPUs 0..0, serving GMIs on GPUs 1..3" in four.describe()
    few = plan_async(1, 1, Machine(gpus, (0, 1), ""))  # more GPUs than GMIs: no idle device
    assert few.mpl == ((0,), (1,)) and "serving GMIs on GPUs 1..1" in few.describe()
    one = plan_async(1, 2, Machine(gpus[:1], (0, 1), ""))  # one GPU: shared by every GMI
    assert one.mpl == ((0, 1, 2),)
    with pytest.raises(ValueError, match="trainer_share=1.0 must be in"):
        plan_async(1, 1, cpu, trainer_share=1.0)


def test_the_local_placement_says_how_it_started_its_gmis():
    from gmi_drl.config import preset
    from gmi_drl.runner.placement import LocalPlacement
    from gmi_drl.runner.template import SyncTemplate

    cfg = preset("classic", "CartPole-v1", "ppo")
    place = LocalPlacement(cfg, SyncTemplate(cfg, plan(2, CPU), 1), CPU)
    assert "one process per GMI (2), forked by the fork server\n" in place.describe()
    place.prefixes = {1: ["nsys", "profile"]}
    assert ("one process per GMI (2), forked by the fork server, GMI 1 spawned under the "
            "profiler\n") in place.describe()
    place.prefixes = {0: ["nsys"], 1: ["nsys"]}
    assert "one process per GMI (2), spawned\n" in place.describe()
    cfg.gmi.start_method, place.prefixes = "spawn", {}
    assert "one process per GMI (2), spawned\n" in place.describe()


def test_more_cpu_gmis_than_cores_is_warned(caplog):
    from gmi_drl.runner.placement import _warn_shared_cores

    with caplog.at_level("WARNING", logger="gmi_drl.runner.placement"):
        _warn_shared_cores(2, 2)
        assert not caplog.text
        _warn_shared_cores(4, 2)
    assert "4 GMIs on 2 CPU core(s): GMIs share cores (2.0 GMIs per core)" in caplog.text
