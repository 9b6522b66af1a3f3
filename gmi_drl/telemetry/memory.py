"""Peak memory of one GMI: what `gmi-drl tune` (GMI-DRL Algorithm 2's ``mem``) compares.

On the CPU it is the process's peak resident set size (``getrusage``; a GMI that runs as a thread
of another GMI's process reports that process's). On a CUDA device it is the larger of the bytes
PyTorch's caching allocator reserved at its peak and the bytes NVML reports in use by this process
on the device (the CUDA context included; NVML reports the current figure, which at the end of a
run is the peak since the allocator does not give memory back).
"""

from __future__ import annotations

import os
import resource
import sys


def peak_memory_bytes(device: str = "cpu") -> int:
    """Peak memory of this process on ``device`` (``"cpu"`` or ``"cuda[:k]"``), bytes."""
    if not device.startswith("cuda"):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB
    import torch

    reserved = int(torch.cuda.max_memory_reserved(device))
    return max(reserved, _nvml_process_bytes())


def _nvml_process_bytes() -> int:
    """Bytes NVML reports in use by this process over every GPU it sees (a GMI's visible device
    numbering differs from NVML's, so every device is asked); 0 where NVML is missing or does
    not report per-process memory, as under MPS on some drivers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            total = 0
            for i in range(pynvml.nvmlDeviceGetCount()):
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(
                    pynvml.nvmlDeviceGetHandleByIndex(i))
                total += sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == os.getpid())
            return total
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML absent or refusing is "unknown", never an error
        return 0
