"""Budgets of independent GMIs (`gmi_drl.gmi.budget`): the planner's even shares, the budgets
each GMI's environment gets, sums that do not fit refused naming the device, MIG instances from
a recorded `nvidia-smi -L` listing; and, where NVML sees a GPU, the same plan of this machine."""

import dataclasses

import pytest

from gmi_drl.config import ConfigError
from gmi_drl.gmi.backends import BackendKind, process_env
from gmi_drl.gmi.budget import (Budget, assign_mig, core_sets, describe, even_percentage,
                                plan_runs)
from gmi_drl.gmi.devices import Machine, discover, for_device, parse_nvidia_smi_list
from gmi_drl.gmi.layout import Template
from tests.gmi.test_devices import A100_MIG

H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-3b8a1c2d-4e5f-6a7b-8c9d-0e1f2a3b4c5d)\n"
TWO_MIG = A100_MIG + """\
  MIG 3g.20gb     Device  0: (UUID: MIG-2a9d5c4a-7e1b-5a0c-9d7b-2f1c0e6b1a44)
  MIG 3g.20gb     Device  1: (UUID: MIG-3b9d5c4a-7e1b-5a0c-9d7b-2f1c0e6b1a55)
"""
"""both A100s with MIG on: GPU 0 with 3 instances, GPU 1 with 2"""
GIB = 2**30


def _machine(listing: str, memory_gib: int = 80, cores=tuple(range(16))) -> Machine:
    """A machine of the GPUs of a recorded listing, each with ``memory_gib`` (what NVML
    reports; ``nvidia-smi -L`` does not say it) and compute capability 9.0."""
    gpus = tuple(dataclasses.replace(g, memory_bytes=memory_gib * GIB, compute_capability=(9, 0))
                 for g in parse_nvidia_smi_list(listing))
    return Machine(gpus, cores)


def test_cpu_gmis_get_core_sets_an_even_share_by_default():
    two = Machine((), (0, 1), "no GPU: test")
    assert core_sets((0, 1, 2, 3), 2, None) == [(0, 1), (2, 3)]
    assert core_sets((0, 1), 4, None) == [(0,), (1,), (0,), (1,)]  # more GMIs: in turn
    assert core_sets((0, 1, 2, 3), 2, 1) == [(0,), (1,)]
    assert core_sets((0, 1), 3, 0) == [(), (), ()]
    lay = plan_runs(2, two)
    assert lay.backend is BackendKind.CPU and [s.cpu_cores for s in lay.specs] == [(0,), (1,)]
    assert [process_env(s, two, 2)[1] for s in lay.specs] == [{0}, {1}]
    free = plan_runs(2, two, budget=Budget(cores=0))
    assert [process_env(s, two, 2)[1:] for s in free.specs] == [(None, 1), (None, 1)]
    assert "GMI 0: not pinned" in describe(free, two)
    with pytest.raises(ConfigError, match=r"budget does not fit the CPU: 2 GMIs x 2 cores = 4 "
                                          r"cores > the 2 this process may run on \[0, 1\]"):
        plan_runs(2, two, budget=Budget(cores=2))
    with pytest.raises(ConfigError, match="cores per GMI >= 0"):
        plan_runs(2, two, budget=Budget(cores=-1))
    with pytest.raises(ConfigError, match="MPS budgets of GMIs on a GPU; these GMIs are CPU"):
        plan_runs(2, two, budget=Budget(threads_pct=50))
    gpus = _machine(H100 + H100.replace("GPU 0", "GPU 1"), cores=(0, 1, 2, 3))
    serving = plan_runs(2, gpus, Template.SERVING, backend="cpu")  # (eval's: on the CPU)
    assert serving.mpl == ((0, 1),) and [s.cpu_cores for s in serving.specs] == [(0, 1), (2, 3)]


def test_gpu_gmis_share_by_mps_an_even_share_where_mig_is_off():
    h100 = _machine(H100)
    lay = plan_runs(3, h100)
    assert lay.backend is BackendKind.CUDA_MPS and lay.mpl == ((0, 1, 2),)
    assert "MIG is off (no MIG instances) on GPU 0 (NVIDIA H100 80GB HBM3)" in lay.backend_reason
    assert even_percentage(3) == 33
    env, _, _ = process_env(lay.specs[1], h100, 3, mps_dir="/tmp/mps")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={80 * 1024 // 3}M"
    assert "active threads 33%/33%/33% (sum 99%)" in describe(lay, h100)
    given = plan_runs(2, h100, budget=Budget(threads_pct=40, mem_mib=20_000))
    env, _, _ = process_env(given.specs[0], h100, 2, mps_dir="/tmp/mps")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"
    serving = plan_runs(2, h100, Template.SERVING)
    assert serving.specs[0].roles == ("simulator", "agent")


def test_runs_on_the_cpu_of_a_gpu_machine_are_core_sets_and_cores_need_the_cpu():
    """``--device cpu`` on a host with GPUs: the GMIs are CPU core sets (no MPS daemon), and
    ``--budget.cores`` on GMIs that share a GPU is refused rather than dropped."""
    gpus = _machine(H100, cores=(0, 1, 2, 3))
    cpu = for_device(gpus, "cpu")
    assert cpu.gpus == () and cpu.cpu_cores == (0, 1, 2, 3)
    assert for_device(gpus, "cuda") is gpus
    lay = plan_runs(2, cpu, budget=Budget(cores=1))
    assert lay.backend is BackendKind.CPU and [s.cpu_cores for s in lay.specs] == [(0,), (1,)]
    assert "the run's device is the CPU (--device cpu): GMIs are CPU core sets" \
        in lay.backend_reason
    with pytest.raises(ConfigError, match=r"--budget.cores are core sets of GMIs on the CPU; "
                                          r"these GMIs run on GPUs \(cuda_mps\)"):
        plan_runs(2, gpus, budget=Budget(cores=1))


def test_a_budget_that_does_not_fit_its_gpu_is_refused_naming_it_and_the_sum():
    h100 = _machine(H100)
    with pytest.raises(ConfigError, match=r"budget does not fit GPU 0 \(NVIDIA H100 80GB HBM3\): "
                                          r"3 GMIs' active-thread percentages sum to 150% > 100%"):
        plan_runs(3, h100, budget=Budget(threads_pct=50))
    with pytest.raises(ConfigError, match=r"GPU 0 \(NVIDIA H100 80GB HBM3\): 3 GMIs' "
                                          r"pinned-memory limits sum to 90,000 MiB > its 81,920"):
        plan_runs(3, h100, budget=Budget(mem_mib=30_000))
    with pytest.raises(ConfigError, match="percentage in 1-100"):
        plan_runs(1, h100, budget=Budget(threads_pct=0))
    for mib in (0, -5):  # (no limit of its own would be a wrong MPS variable: "0=-5M")
        with pytest.raises(ConfigError, match=rf"--budget.mem-mib {mib}: give a limit of at "
                                              "least 1 MiB"):
            plan_runs(2, h100, budget=Budget(mem_mib=mib))
    two = _machine(H100 + H100.replace("GPU 0", "GPU 1").replace("3b8a", "4c9b"))
    lay = plan_runs(4, two, budget=Budget(threads_pct=50))  # 2 GMIs on each GPU: fits
    assert lay.mpl == ((0, 1), (2, 3))
    with pytest.raises(ConfigError, match="MPS budgets"):
        plan_runs(2, h100, budget=Budget(threads_pct=50), backend="cuda_shared")


def test_mig_gmis_go_on_existing_instances_in_turn_over_the_gpus():
    mig = _machine(TWO_MIG, 40)
    slots = assign_mig(4, mig.gpus)
    assert [(d, m.uuid[:8]) for d, m in slots] == [(0, "MIG-1f9d"), (0, "MIG-6a3b"),
                                                    (1, "MIG-2a9d"), (1, "MIG-3b9d")]
    lay = plan_runs(4, mig, Template.SERVING)
    assert lay.backend is BackendKind.MIG and lay.mpl == ((0, 1), (2, 3))
    assert "MIG is on" in lay.backend_reason
    env, _, _ = process_env(lay.specs[2], mig, 2)
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-2a9d5c4a-7e1b-5a0c-9d7b-2f1c0e6b1a44"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    with pytest.raises(ConfigError, match=r"6 GMIs for 5 MIG instances \(GPU 0: 3, GPU 1: 2\)"):
        plan_runs(6, mig)
    with pytest.raises(ConfigError, match="on MIG each GMI's instance is its budget"):
        plan_runs(2, mig, budget=Budget(mem_mib=1000))
    # GPU 0 has MIG on, GPU 1 off: MPS on GPU 0's whole GPU would fail where a GMI starts
    half = _machine(A100_MIG, 40)
    with pytest.raises(ConfigError, match=r"MIG is on on GPU 0 \(3 instances\): .* "
                                          "--gmi.backend mig places the GMIs on the existing "
                                          "instances"):
        plan_runs(2, half)
    with pytest.raises(ConfigError, match=r"MIG is on on GPU 0 .*not GMIs on the whole GPU"):
        plan_runs(2, half, backend="cuda_shared")  # (time slicing: the same whole GPU)
    lay = plan_runs(2, half, backend="mig")
    assert lay.backend is BackendKind.MIG and lay.mpl == ((0, 1),)


def test_this_machines_gpus_are_planned_from_nvml():
    """Where NVML sees GPUs: their MIG mode and instances as NVML reports them, each GMI on an
    instance or sharing through MPS within the GPU's memory."""
    machine = discover()
    if not machine.gpus:
        pytest.skip(f"{machine.no_gpu_reason}: the GPU budgets are planned from a recorded "
                    "listing above")
    n = 2 * len(machine.gpus)
    lay = plan_runs(n, machine)
    mig_everywhere = all(g.mig_enabled and g.mig_instances for g in machine.gpus)
    if mig_everywhere and sum(len(g.mig_instances) for g in machine.gpus) >= n:
        assert lay.backend is BackendKind.MIG
        assert {s.mig_uuid for s in lay.specs} <= {m.uuid for g in machine.gpus
                                                     for m in g.mig_instances}
    else:
        assert lay.backend is BackendKind.CUDA_MPS and "MIG is off" in lay.backend_reason
        for d, gmis in enumerate(lay.mpl):
            limits = [lay.specs[g].memory_limit_bytes for g in gmis]
            assert sum(limits) <= machine.gpus[d].memory_bytes
            assert sum(round(lay.specs[g].compute_share * 100) for g in gmis) <= 100
        with pytest.raises(ConfigError, match=f"budget does not fit GPU {machine.gpus[0].index}"):
            plan_runs(n, machine, budget=Budget(mem_mib=machine.gpus[0].memory_bytes // 2**20))
