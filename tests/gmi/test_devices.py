"""Device discovery: NVML on this machine, and `nvidia-smi -L` parsing from recorded output."""

import os

import pytest

from gmi_drl.gmi.devices import Gpu, discover, parse_nvidia_smi_list

# recorded from an A100 with MIG enabled and a V100 host (UUIDs shortened but well-formed)
A100_MIG = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.20gb     Device  0: (UUID: MIG-1f9d5c4a-7e1b-5a0c-9d7b-2f1c0e6b1a11)
  MIG 2g.10gb     Device  1: (UUID: MIG-6a3b2c1d-0e9f-5a8b-8c7d-6e5f4a3b2c22)
  MIG 1g.5gb      Device  2: (UUID: MIG-0b1c2d3e-4f5a-5b6c-9d8e-7f6a5b4c3d33)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-8e2b5f10-2c4d-4f6a-8b9c-0d1e2f3a4b5c)
"""
V100 = "GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d)\n"


def test_parses_mig_instances_per_gpu():
    gpus = parse_nvidia_smi_list(A100_MIG)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].mig_enabled and not gpus[1].mig_enabled
    assert [m.profile for m in gpus[0].mig_instances] == ["3g.20gb", "2g.10gb", "1g.5gb"]
    assert gpus[0].mig_instances[1].uuid == "MIG-6a3b2c1d-0e9f-5a8b-8c7d-6e5f4a3b2c22"
    assert gpus[0].name == "NVIDIA A100-SXM4-40GB"


def test_parses_plain_gpu_and_rejects_garbage():
    (g,) = parse_nvidia_smi_list(V100)
    assert g.uuid.startswith("GPU-0a1b") and g.mig_instances == ()
    with pytest.raises(ValueError, match="line 1"):
        parse_nvidia_smi_list("No devices were found\n")
    with pytest.raises(ValueError, match="MIG line before any GPU"):
        parse_nvidia_smi_list(A100_MIG.split("\n", 1)[1])


def test_sm_name():
    assert Gpu(0, "x", "GPU-1", (8, 0)).sm == "sm_80"
    assert Gpu(0, "x", "GPU-1").sm is None


def test_discover_never_raises_and_explains_missing_gpus():
    m = discover()
    assert set(m.cpu_cores) == os.sched_getaffinity(0)
    if not m.gpus:
        assert m.no_gpu_reason.startswith("no GPU")
    else:
        assert all(g.uuid.startswith("GPU-") for g in m.gpus)
