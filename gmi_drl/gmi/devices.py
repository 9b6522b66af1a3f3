"""What the machine offers GMIs: GPUs through NVML (with MIG instances) and CPU cores.

Source: GMI-DRL §3 (backend choice depends on the GPU architecture, ``sm_70`` vs ``sm_80``, and on
whether MIG is enabled).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigInstance:
    """An existing MIG instance: its ``MIG-<uuid>`` (for ``CUDA_VISIBLE_DEVICES``) and profile."""

    uuid: str
    profile: str  # e.g. "3g.20gb"
    index: int


@dataclass(frozen=True)
class Gpu:
    """One physical GPU.

    Attributes:
        index: NVML index. name: marketing name. uuid: ``GPU-<uuid>``.
        compute_capability: ``(major, minor)``, e.g. ``(8, 0)`` for A100.
        memory_bytes: total device memory, bytes (0 when unknown, e.g. parsed from ``-L``).
        mig_enabled: MIG mode is on. mig_instances: existing instances (never created here).
        memory_free_bytes: device memory free when it was read, bytes (0 when unknown).
    """

    index: int
    name: str
    uuid: str
    compute_capability: tuple[int, int] | None = None
    memory_bytes: int = 0
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = field(default_factory=tuple)
    memory_free_bytes: int = 0

    @property
    def sm(self) -> str | None:
        """``"sm_80"``-style architecture name, or ``None`` when unknown."""
        if self.compute_capability is None:
            return None
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


@dataclass(frozen=True)
class Machine:
    """GPUs and CPU cores visible to this process; ``no_gpu_reason`` says why there are none."""

    gpus: tuple[Gpu, ...]
    cpu_cores: tuple[int, ...]
    no_gpu_reason: str = ""


def for_device(machine: Machine, device: str) -> Machine:
    """``machine`` as a run whose GMIs compute on ``device`` uses it: on ``"cpu"`` without its
    GPUs, so the planner makes the GMIs CPU core sets (GMI-DRL §3's CPU case) whatever GPUs the
    host has, and starts no MPS daemon for them."""
    if device != "cpu" or not machine.gpus:
        return machine
    return Machine((), machine.cpu_cores, "the run's device is the CPU (--device cpu)")


def discover() -> Machine:
    """GPUs through NVML (``nvidia-ml-py``) and the CPU cores this process may run on.

    Never raises: without NVML or a driver, ``gpus`` is empty and ``no_gpu_reason`` explains.
    """
    cores = tuple(sorted(os.sched_getaffinity(0)))
    try:
        import pynvml
    except ImportError:
        return Machine((), cores, "no GPU: nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return Machine((), cores, f"no GPU: NVML unavailable ({e})")
    try:
        gpus = tuple(_nvml_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount()))
    finally:
        pynvml.nvmlShutdown()
    return Machine(gpus, cores, "" if gpus else "no GPU: NVML reports 0 devices")


def _nvml_gpu(nv, i: int) -> Gpu:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    cc = nv.nvmlDeviceGetCudaComputeCapability(h)
    info = nv.nvmlDeviceGetMemoryInfo(h)
    mem = info.total
    try:
        mig_on = nv.nvmlDeviceGetMigMode(h)[0] == nv.NVML_DEVICE_MIG_ENABLE
    except nv.NVMLError:  # pre-Ampere GPUs have no MIG mode
        mig_on = False
    instances = []
    if mig_on:
        for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except nv.NVMLError:
                continue
            mem_mig = nv.nvmlDeviceGetMemoryInfo(mh).total
            instances.append(MigInstance(_str(nv.nvmlDeviceGetUUID(mh)),
                                         f"{mem_mig / 2**30:.0f}gb", k))
    return Gpu(i, _str(nv.nvmlDeviceGetName(h)), _str(nv.nvmlDeviceGetUUID(h)), tuple(cc), mem,
               mig_on, tuple(instances), info.free)


def _str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-fA-F/-]+)\)\s*$")


def parse_nvidia_smi_list(text: str) -> tuple[Gpu, ...]:
    """Parse ``nvidia-smi -L`` output, MIG instance lines included.

    Example input::

        GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-...)
          MIG 3g.20gb     Device  0: (UUID: MIG-1f9d...)

    Raises:
        ValueError: a line that is neither a GPU nor a MIG line, or a MIG line before any GPU.
    """
    gpus: list[dict] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if m := _GPU_LINE.match(line):
            gpus.append({"index": int(m[1]), "name": m[2], "uuid": m[3], "migs": []})
        elif m := _MIG_LINE.match(line):
            if not gpus:
                raise ValueError(f"line {n}: MIG line before any GPU line: {line!r}")
            gpus[-1]["migs"].append(MigInstance(m[3], m[1], int(m[2])))
        else:
            raise ValueError(f"line {n}: not an `nvidia-smi -L` GPU or MIG line: {line!r}")
    return tuple(Gpu(g["index"], g["name"], g["uuid"], mig_enabled=bool(g["migs"]),
                     mig_instances=tuple(g["migs"])) for g in gpus)
