"""GMI backends: how a GMI spec becomes a process environment, set before CUDA initialises.

Source: GMI-DRL §3 ("GMI backend"): training GMIs use MPS (cheaper communication), serving GMIs
use MIG where it is enabled (stronger isolation); ``sm_70`` GPUs (V100) have MPS only; without a
GPU a GMI is a set of CPU cores. Backend names are never passed to ``torch.device`` (``"mps"``
means Apple Metal there).
"""

from __future__ import annotations

import enum
import os
import shutil
import subprocess
from dataclasses import dataclass

from gmi_drl.gmi.devices import Machine


class BackendKind(str, enum.Enum):
    CPU = "cpu"  # a core set and a thread count
    CUDA_SHARED = "cuda_shared"  # plain time-slicing of one GPU among processes
    CUDA_MPS = "cuda_mps"  # NVIDIA MPS with a compute share and pinned-memory limit per GMI
    MIG = "mig"  # an existing MIG instance per GMI


@dataclass(frozen=True)
class GMISpec:
    """One GMI: ``(gmi_id, device, backend, compute_share, memory_limit_bytes, roles)``.

    Attributes:
        gmi_id: the GMI's id (also its rank in reduction groups).
        device: GPU index for CUDA backends; for ``cpu``, the index of its core set.
        backend: a `BackendKind`.
        compute_share: fraction of the device in ``(0, 1]`` (MPS active-thread percentage; for
            ``cpu``, the share of the cores).
        memory_limit_bytes: MPS pinned device-memory limit, bytes (``None``: no limit).
        roles: subset of ``("simulator", "agent", "trainer")``.
        mig_uuid: ``MIG-<uuid>`` for the ``mig`` backend.
        cpu_cores: for ``cpu``, the cores this GMI is pinned to, chosen by the layout (``None``:
            an even share of the machine's cores by ``gmi_id``; ``()``: not pinned).
    """

    gmi_id: int
    device: int
    backend: BackendKind
    compute_share: float = 1.0
    memory_limit_bytes: int | None = None
    roles: tuple[str, ...] = ("simulator", "agent", "trainer")
    mig_uuid: str | None = None
    cpu_cores: tuple[int, ...] | None = None


def choose_backend(machine: Machine, training: bool,
                   override: str | None = None) -> tuple[BackendKind, str]:
    """Pick the backend for a run and say why (GMI-DRL §3).

    Args:
        machine: from `gmi_drl.gmi.devices.discover`.
        training: ``True`` for training templates, ``False`` for serving.
        override: a `BackendKind` value the user forces.

    Raises:
        ValueError: an unknown override, or a CUDA backend forced on a machine without GPUs.
    """
    if override is not None:
        kind = BackendKind(override)
        if kind is not BackendKind.CPU and not machine.gpus:
            raise ValueError(f"backend {kind.value!r} needs a GPU; {machine.no_gpu_reason}")
        return kind, f"forced by configuration ({kind.value})"
    if not machine.gpus:
        return BackendKind.CPU, f"{machine.no_gpu_reason}: GMIs are CPU core sets"
    sms = {g.sm for g in machine.gpus}
    if all(g.compute_capability and g.compute_capability[0] < 8 for g in machine.gpus):
        return BackendKind.CUDA_MPS, f"{'/'.join(sorted(s for s in sms if s))} has no MIG: MPS"
    if training:
        return BackendKind.CUDA_MPS, "training: MPS shares memory bandwidth for gradient exchange"
    if all(g.mig_enabled and g.mig_instances for g in machine.gpus):
        return BackendKind.MIG, "serving with MIG enabled: hardware isolation per GMI"
    return BackendKind.CUDA_MPS, "serving, but MIG is not enabled with instances: MPS"


def process_env(spec: GMISpec, machine: Machine, gmis_on_device: int,
                mps_dir: str | None = None) -> tuple[dict[str, str], set[int] | None, int]:
    """Environment variables, CPU affinity and torch thread count for one GMI process.

    Args:
        spec: the GMI.
        machine: discovered devices (GPU UUIDs, CPU cores).
        gmis_on_device: GMIs sharing ``spec.device`` (splits CPU cores among them).
        mps_dir: the private MPS directory (``cuda_mps``), holding ``pipe/`` and ``log/``.

    Returns:
        ``(env, cpu_affinity or None, torch_threads)``.

    Raises:
        ValueError: the device or MIG instance does not exist, or the spec is inconsistent.
    """
    if not 0 < spec.compute_share <= 1:
        raise ValueError(f"GMI {spec.gmi_id}: compute_share={spec.compute_share} not in (0, 1]")
    cores = list(machine.cpu_cores)
    if spec.backend is BackendKind.CPU:
        if spec.cpu_cores == ():  # not pinned: the OS places it, its threads an even share
            threads = max(1, len(cores) // max(1, gmis_on_device))
            return {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads)}, None, threads
        if spec.cpu_cores:  # the layout chose them
            mine = set(spec.cpu_cores)
        else:  # an even split of the machine among the GMIs of its "device"
            per = max(1, len(cores) // max(1, gmis_on_device))
            start = (spec.gmi_id % max(1, gmis_on_device)) * per % len(cores)
            mine = set(cores[start:start + per]) or {cores[0]}
        env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(len(mine))}
        return env, mine, len(mine)
    if not 0 <= spec.device < len(machine.gpus):
        raise ValueError(f"GMI {spec.gmi_id}: device {spec.device} does not exist "
                         f"({len(machine.gpus)} GPUs)")
    gpu = machine.gpus[spec.device]
    threads = max(1, len(cores) // max(1, gmis_on_device * len(machine.gpus)))
    env = {"CUDA_VISIBLE_DEVICES": gpu.uuid, "OMP_NUM_THREADS": str(threads)}
    if spec.backend is BackendKind.CUDA_MPS:
        env.update(mps_env(spec, mps_dir))
    elif spec.backend is BackendKind.MIG:
        uuids = {m.uuid for m in gpu.mig_instances}
        if spec.mig_uuid not in uuids:
            raise ValueError(f"GMI {spec.gmi_id}: MIG instance {spec.mig_uuid!r} does not exist "
                             f"on GPU {spec.device} (existing: {sorted(uuids)}); gmi-drl never "
                             "creates MIG instances: make them with nvidia-smi mig first")
        env["CUDA_VISIBLE_DEVICES"] = spec.mig_uuid
    return env, None, threads


def mps_env(spec: GMISpec, mps_dir: str | None) -> dict[str, str]:
    """The MPS client variables of one ``cuda_mps`` GMI: the daemon's pipe and log directories,
    its active-thread percentage (``compute_share`` in percent) and pinned device-memory limit
    (MB, for device 0: the one device a GMI process sees).

    Raises:
        ValueError: ``mps_dir`` is ``None``.
    """
    if mps_dir is None:
        raise ValueError(f"GMI {spec.gmi_id}: cuda_mps needs the MPS daemon's directory")
    env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(mps_dir, "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": os.path.join(mps_dir, "log"),
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(spec.compute_share * 100)))}
    if spec.memory_limit_bytes is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={spec.memory_limit_bytes // 2**20}M"
    return env


class MPSDaemon:
    """A private MPS control daemon (own pipe and log directories), started and stopped by us.

    Args:
        directory: holds ``pipe/`` and ``log/``.
        gpu_uuids: GPUs the daemon serves (``CUDA_VISIBLE_DEVICES`` of the daemon).

    Raises:
        RuntimeError: ``nvidia-cuda-mps-control`` is not on PATH, or the daemon did not start.
    """

    BINARY = "nvidia-cuda-mps-control"

    def __init__(self, directory: str, gpu_uuids: list[str]) -> None:
        self.directory = directory
        self.env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpu_uuids),
                    "CUDA_MPS_PIPE_DIRECTORY": os.path.join(directory, "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": os.path.join(directory, "log")}
        self.running = False

    @classmethod
    def available(cls) -> bool:
        return shutil.which(cls.BINARY) is not None

    def start(self) -> None:
        if not self.available():
            raise RuntimeError(f"{self.BINARY} not found: install the NVIDIA driver utilities "
                               "or choose --gmi.backend cuda_shared")
        for sub in ("pipe", "log"):
            os.makedirs(os.path.join(self.directory, sub), exist_ok=True)
        r = subprocess.run([self.BINARY, "-d"], env=self.env, capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"MPS daemon failed to start: {r.stderr.strip() or r.stdout}")
        self.running = True

    def terminate_clients(self, pids: set[int]) -> list[int]:
        """End the outstanding GPU work of the MPS clients ``pids`` through the control
        (``terminate_client <server> <client>`` on every server that lists them), so that the
        processes can then be killed without leaving work in flight on the shared GPU.

        Returns:
            the pids that were clients and got the command (others are ignored).
        """
        done = []
        if not self.running:
            return done
        for server in _pids(self._control("get_server_list")):
            clients = set(_pids(self._control(f"get_client_list {server}")))
            for pid in sorted(clients & set(pids)):
                self._control(f"terminate_client {server} {pid}")
                done.append(pid)
        return done

    def _control(self, command: str) -> str:
        r = subprocess.run([self.BINARY], input=command + "\n", env=self.env,
                           capture_output=True, text=True, timeout=30)
        return r.stdout

    def stop(self) -> None:
        """Ask the daemon to quit (clients must have synchronised and exited first)."""
        if self.running:
            self._control("quit")
            self.running = False


def _pids(text: str) -> list[int]:
    """The process ids an MPS control answer lists (one per line; other lines ignored)."""
    return [int(word) for word in text.split() if word.isdigit()]
