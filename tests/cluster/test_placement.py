"""Bundles, actor resources and runtime_env of the Ray launcher (pure functions), and the node
agent's start (no Ray)."""

import pytest

from gmi_drl.cluster.placement import (RAY_KEEPS_CUDA_VISIBLE_DEVICES, actor_env,
                                       actor_resources, bundles, runtime_env)
from gmi_drl.gmi.backends import BackendKind, GMISpec
from gmi_drl.gmi.devices import Gpu, Machine, MigInstance
from gmi_drl.gmi.layout import plan

MIGS = (MigInstance("MIG-aaaa", "3g.20gb", 0), MigInstance("MIG-bbbb", "3g.20gb", 1))
A100 = Gpu(0, "A100", "GPU-a", (8, 0), 40 << 30, True, MIGS)
A100_2 = Gpu(1, "A100", "GPU-b", (8, 0), 40 << 30, True, MIGS)
CPU_ONLY = Machine((), (0, 1, 2, 3), "no GPU: test")


def test_cpu_bundles_hold_cpus_only():
    assert bundles(plan(3, CPU_ONLY), 2) == [{"CPU": 2.0}] * 3


def test_gpu_bundles_split_each_device_among_its_gmis():
    lay = plan(5, Machine((A100, A100_2), (0, 1)))  # mpl [[0, 1, 2], [3, 4]], MPS
    assert lay.backend is BackendKind.CUDA_MPS
    got = bundles(lay, 1)
    assert [b["GPU"] for b in got] == pytest.approx([1 / 3] * 3 + [1 / 2] * 2)
    assert sum(b["GPU"] for b in got) == pytest.approx(2.0)  # exactly the two GPUs


def test_mig_bundles_are_pinned_to_the_planning_node():
    lay = plan(2, Machine((A100,), (0,)), backend="mig")
    got = bundles(lay, 1, pin_node_ip="10.0.0.7")
    assert all(b["node:10.0.0.7"] == pytest.approx(0.001) for b in got)
    assert actor_resources(got[0]) == {"num_cpus": 1.0, "num_gpus": 0.5,
                                       "resources": {"node:10.0.0.7": 0.001}}


def test_bad_cpu_count_is_refused():
    with pytest.raises(ValueError, match="num_cpus_per_gmi=0"):
        bundles(plan(2, CPU_ONLY), 0)


def test_actor_env_carries_each_backends_variables():
    cpu = actor_env(GMISpec(0, 0, BackendKind.CPU), 2, None)
    assert cpu == {"OMP_NUM_THREADS": "2", "GMI_NUM_CPUS": "2", "CUDA_VISIBLE_DEVICES": ""}
    mps = actor_env(GMISpec(1, 0, BackendKind.CUDA_MPS, 0.25, 2 << 30), 1, "/tmp/m")
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert mps["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/m/pipe"
    assert "CUDA_VISIBLE_DEVICES" not in mps  # Ray assigns the GPU from the bundle
    assert "CUDA_VISIBLE_DEVICES" not in actor_env(GMISpec(0, 0, BackendKind.CUDA_SHARED), 1, None)
    mig = actor_env(GMISpec(0, 0, BackendKind.MIG, mig_uuid="MIG-bbbb"), 1, None)
    assert mig["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb" and mig[RAY_KEEPS_CUDA_VISIBLE_DEVICES] == "1"
    with pytest.raises(ValueError, match="MPS daemon"):
        actor_env(GMISpec(0, 0, BackendKind.CUDA_MPS), 1, None)
    with pytest.raises(ValueError, match="MIG instance"):
        actor_env(GMISpec(0, 0, BackendKind.MIG), 1, None)


def test_runtime_env_merges_extra_settings_but_keeps_the_backends_variables():
    env = runtime_env({"OMP_NUM_THREADS": "1"}, "/src",
                      {"nsight": {"t": "cuda,nvtx"}, "env_vars": {"TAG": "x"}})
    assert env == {"nsight": {"t": "cuda,nvtx"},
                   "env_vars": {"TAG": "x", "OMP_NUM_THREADS": "1",
                                "PYTHONPATH": "/src:${PYTHONPATH}"}}
    assert runtime_env({}, "/src")["env_vars"] == {"PYTHONPATH": "/src:${PYTHONPATH}"}
    with pytest.raises(ValueError, match=r"\['OMP_NUM_THREADS'\]"):
        runtime_env({"OMP_NUM_THREADS": "1"}, "/src", {"env_vars": {"OMP_NUM_THREADS": "8"}})


def test_a_node_agent_unlinks_what_killed_runs_left_on_its_node_when_it_starts():
    """The agent of a killed driver dies with it; the next run's agent on that node (which may
    not be the driver's machine, where the driver reclaims) unlinks the block."""
    import multiprocessing as mp
    import os

    from gmi_drl import blocks
    from gmi_drl.cluster.node_agent import NodeAgent

    from multiprocessing import resource_tracker

    def leave_a_block(conn):
        shm = blocks.create(64)
        resource_tracker.unregister(shm._name, "shared_memory")  # the tracker died with it
        conn.send(shm.name)
        shm.close()  # not unlinked: what SIGKILL leaves
        os._exit(0)

    ours, theirs = mp.get_context("fork").Pipe()
    child = mp.get_context("fork").Process(target=leave_a_block, args=(theirs,))
    child.start()
    assert ours.poll(30), "the child made no block"
    left = ours.recv()
    child.join(30)
    assert os.path.exists(f"/dev/shm/{left}")
    agent = NodeAgent()
    try:
        assert agent.setup(None, 1, None) is None
        assert not os.path.exists(f"/dev/shm/{left}")
    finally:
        agent.close()
