"""Backend choice (GMI-DRL §3) and the process environment each backend builds."""

import os

import pytest

from gmi_drl.gmi.backends import BackendKind, GMISpec, MPSDaemon, choose_backend, process_env
from gmi_drl.gmi.devices import Gpu, Machine, MigInstance

MIG = (MigInstance("MIG-aaaa", "3g.20gb", 0), MigInstance("MIG-bbbb", "3g.20gb", 1))
A100 = Gpu(0, "A100", "GPU-a100", (8, 0), 40 << 30, True, MIG)
A100_NOMIG = Gpu(0, "A100", "GPU-a100", (8, 0), 40 << 30)
V100 = Gpu(0, "V100", "GPU-v100", (7, 0), 16 << 30)
CORES = (0, 1, 2, 3)


def m(*gpus):
    return Machine(tuple(gpus), CORES, "" if gpus else "no GPU: test")


def test_choice_rules():
    assert choose_backend(m(), training=True)[0] is BackendKind.CPU
    assert choose_backend(m(V100), training=False)[0] is BackendKind.CUDA_MPS
    assert choose_backend(m(A100), training=True)[0] is BackendKind.CUDA_MPS
    assert choose_backend(m(A100), training=False)[0] is BackendKind.MIG
    assert choose_backend(m(A100_NOMIG), training=False)[0] is BackendKind.CUDA_MPS
    kind, why = choose_backend(m(A100), training=True, override="cuda_shared")
    assert kind is BackendKind.CUDA_SHARED and "forced" in why
    with pytest.raises(ValueError, match="needs a GPU"):
        choose_backend(m(), training=True, override="cuda_mps")
    with pytest.raises(ValueError):
        choose_backend(m(), training=True, override="mps")


def test_mps_env():
    spec = GMISpec(3, 0, BackendKind.CUDA_MPS, compute_share=0.33, memory_limit_bytes=3 << 30)
    env, aff, threads = process_env(spec, m(A100), gmis_on_device=3, mps_dir="/tmp/mps")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a100"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/mps/pipe" and aff is None and threads >= 1


def test_mig_env_uses_existing_instances_only():
    env, _, _ = process_env(GMISpec(0, 0, BackendKind.MIG, mig_uuid="MIG-bbbb"), m(A100), 2)
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb"
    with pytest.raises(ValueError, match="never creates MIG instances"):
        process_env(GMISpec(0, 0, BackendKind.MIG, mig_uuid="MIG-zzzz"), m(A100), 2)


def test_cpu_env_splits_cores():
    envs = [process_env(GMISpec(i, 0, BackendKind.CPU), m(), gmis_on_device=2) for i in range(2)]
    (e0, a0, t0), (e1, a1, t1) = envs
    assert a0 == {0, 1} and a1 == {2, 3} and t0 == t1 == 2
    assert e0["CUDA_VISIBLE_DEVICES"] == ""


def test_invalid_specs():
    with pytest.raises(ValueError, match="compute_share"):
        process_env(GMISpec(0, 0, BackendKind.CPU, compute_share=0), m(), 1)
    with pytest.raises(ValueError, match="device 1 does not exist"):
        process_env(GMISpec(0, 1, BackendKind.CUDA_SHARED), m(A100), 1)
    with pytest.raises(ValueError, match="MPS daemon"):
        process_env(GMISpec(0, 0, BackendKind.CUDA_MPS), m(A100), 1)


def test_dist_backend_uses_nccl_only_for_cuda_tensors_on_distinct_gpus():
    from gmi_drl.gmi.context import dist_backend
    from gmi_drl.gmi.layout import plan

    two = m(A100_NOMIG, Gpu(1, "A100", "GPU-a100-2", (8, 0), 40 << 30))
    assert dist_backend(plan(2, m())) == dist_backend(plan(2, m()), flat_ring=True) == "gloo"
    shared = plan(2, m(A100_NOMIG), backend="cuda_shared")  # both GMIs on GPU 0
    assert dist_backend(shared, flat_ring=True) == "gloo"
    assert dist_backend(plan(2, two, backend="cuda_mps"), flat_ring=True) == "cpu:gloo,cuda:nccl"
    assert dist_backend(plan(4, two, backend="cuda_mps")) == "cpu:gloo,cuda:nccl"  # MRR rings


@pytest.mark.gpu
@pytest.mark.skipif(not MPSDaemon.available(), reason="needs nvidia-cuda-mps-control and a GPU")
def test_mps_daemon_starts_and_stops(tmp_path):
    from gmi_drl.gmi.devices import discover

    d = MPSDaemon(str(tmp_path), [g.uuid for g in discover().gpus])
    d.start()
    assert (tmp_path / "pipe" / "control").exists()
    d.stop()
    assert not d.running


FAKE_MPS_CONTROL = """#!/bin/sh
# stands in for nvidia-cuda-mps-control: logs every command, one server (111), clients 5 and 6
[ "$1" = "-d" ] && { echo "-d" >> "$MPS_LOG"; exit 0; }
read cmd
echo "$cmd" >> "$MPS_LOG"
case "$cmd" in
  get_server_list) echo 111 ;;
  "get_client_list 111") printf '5\\n6\\n' ;;
esac
"""


def test_mps_clients_are_terminated_through_the_control_before_quit(tmp_path, monkeypatch):
    binary = tmp_path / "bin" / MPSDaemon.BINARY
    binary.parent.mkdir()
    binary.write_text(FAKE_MPS_CONTROL)
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{binary.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("MPS_LOG", str(tmp_path / "log.txt"))
    d = MPSDaemon(str(tmp_path / "mps"), ["GPU-a"])
    assert d.terminate_clients({6}) == []  # not started: nothing to ask
    d.start()
    assert d.terminate_clients({6, 7}) == [6]  # 7 is no client of the daemon
    d.stop()
    assert (tmp_path / "log.txt").read_text().splitlines() == [
        "-d", "get_server_list", "get_client_list 111", "terminate_client 111 6", "quit"]
