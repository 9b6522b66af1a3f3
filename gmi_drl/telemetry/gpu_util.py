"""GPU utilisation over time through NVML, sampled while a run trains (GMI-DRL Fig. 1b).

``gpu_util.csv`` columns: ``unix_s`` (sample time, Unix seconds), ``gpu`` (NVML index),
``util_pct`` (percent of NVML's last sample period, 1/6 s to 1 s by product, in which a kernel ran
on the GPU), ``mem_util_pct`` (same, for device-memory reads/writes), ``mem_used_mib``. One row
per GPU per period; rows are flushed as they are taken, so a crashed run keeps its samples.
"""

from __future__ import annotations

import csv
import logging
import threading
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

COLUMNS = ("unix_s", "gpu", "util_pct", "mem_util_pct", "mem_used_mib")


class GpuUtilSampler:
    """Samples every GPU NVML sees on a daemon thread until `stop`; use `start_gpu_sampler`.

    Cost: one NVML query pair per GPU per period (tens of microseconds), off the training thread.
    """

    def __init__(self, path: Path, interval_s: float, nvml: ModuleType, handles: list) -> None:
        self.path, self.interval_s, self._nvml, self._handles = path, interval_s, nvml, handles
        self._file = open(path, "a", newline="")
        self._csv = csv.writer(self._file)
        if self._file.tell() == 0:
            self._csv.writerow(COLUMNS)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-util-sampler")
        self._thread.start()

    def _run(self) -> None:
        nv = self._nvml
        while True:
            now = round(time.time(), 3)
            try:
                rows = [(nv.nvmlDeviceGetUtilizationRates(h), nv.nvmlDeviceGetMemoryInfo(h).used)
                        for h in self._handles]
            except nv.NVMLError as e:
                log.warning("GPU utilisation: sampling stopped: NVML failed (%s)", e)
                return
            for i, (u, used) in enumerate(rows):
                self._csv.writerow([now, i, u.gpu, u.memory, round(used / 2**20, 1)])
            self._file.flush()
            if self._done.wait(self.interval_s):
                return

    def stop(self) -> None:
        """Take no more samples; close the file and NVML (blocks at most one NVML query)."""
        self._done.set()
        self._thread.join()
        self._file.close()
        self._nvml.nvmlShutdown()


def start_gpu_sampler(path: str | Path, interval_s: float,
                      nvml: ModuleType | None = None) -> GpuUtilSampler | None:
    """Start sampling into ``path`` every ``interval_s`` seconds; ``None`` (with the reason
    logged) without NVML or GPUs. ``nvml`` defaults to ``pynvml`` (nvidia-ml-py).

    Raises:
        ValueError: ``interval_s <= 0``.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s={interval_s} must be > 0")
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            log.debug("GPU utilisation: not sampled: nvidia-ml-py is not installed")
            return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        log.debug("GPU utilisation: not sampled: no GPU (NVML unavailable: %s)", e)
        return None
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        nvml.nvmlShutdown()
        log.debug("GPU utilisation: not sampled: NVML reports no GPU")
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    return GpuUtilSampler(path, interval_s, nvml, handles)
