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


class _Nvml:
    """NVML's Python API (``pynvml``, the calls `discover` makes) over a recorded machine: an
    A100 with MIG on and instances in slots 0 and 2 (slot 1 empty, as NVML reports a destroyed
    one), and a V100, whose MIG-mode query fails as on pre-Ampere GPUs."""

    class NVMLError(Exception):
        pass

    NVML_DEVICE_MIG_ENABLE = 1
    GIB = 2**30

    def __init__(self):
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA A100-SXM4-40GB" if h[1] == 0 else "Tesla V100-SXM2-16GB"

    def nvmlDeviceGetUUID(self, h):
        if h[0] == "mig":
            return f"MIG-{h[1]}-{h[2]}"
        return "GPU-a100" if h[1] == 0 else "GPU-v100"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (8, 0) if h[1] == 0 else (7, 0)

    def nvmlDeviceGetMemoryInfo(self, h):
        import types

        if h[0] == "mig":
            total = (20 if h[2] == 0 else 10) * self.GIB
        else:
            total = (40 if h[1] == 0 else 16) * self.GIB
        return types.SimpleNamespace(total=total, free=total // 2)

    def nvmlDeviceGetMigMode(self, h):
        if h[1] == 1:
            raise self.NVMLError("Not Supported")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        if k not in (0, 2):
            raise self.NVMLError("Not Found")
        return ("mig", h[1], k)


def test_discover_reads_mig_mode_and_instances_from_nvml(monkeypatch):
    """The NVML path (what a GPU host takes; `nvidia-smi -L` parsing is the recorded form):
    each GPU's MIG mode, its existing instances by slot, memory and compute capability; NVML
    shut down after."""
    import sys

    from gmi_drl.gmi.backends import BackendKind
    from gmi_drl.gmi.budget import plan_runs

    nvml = _Nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    machine = discover()
    a100, v100 = machine.gpus
    assert (a100.name, a100.uuid, a100.compute_capability) == ("NVIDIA A100-SXM4-40GB",
                                                               "GPU-a100", (8, 0))
    assert a100.mig_enabled and [(m.index, m.uuid, m.profile) for m in a100.mig_instances] == [
        (0, "MIG-0-0", "20gb"), (2, "MIG-0-2", "10gb")]
    assert (a100.memory_bytes, a100.memory_free_bytes) == (40 * 2**30, 20 * 2**30)
    assert not v100.mig_enabled and v100.mig_instances == () and v100.sm == "sm_70"
    assert nvml.inits == nvml.shutdowns == 1
    only_a100 = type(machine)((a100,), machine.cpu_cores)
    lay = plan_runs(2, only_a100)  # MIG on with instances: one GMI on each, never created
    assert lay.backend is BackendKind.MIG
    assert [s.mig_uuid for s in lay.specs] == ["MIG-0-0", "MIG-0-2"]
