"""The NVML GPU-utilisation sampler, against a fake NVML and on this machine."""

import csv
import time
from types import SimpleNamespace

import pytest

from gmi_drl.gmi.devices import discover
from gmi_drl.telemetry.gpu_util import COLUMNS, start_gpu_sampler


class FakeNvml:
    """The slice of pynvml the sampler uses: ``count`` GPUs, GPU i busy ``10 * (i + 1)`` %."""

    class NVMLError(Exception):
        pass

    def __init__(self, count, fail_init=False):
        self.count, self.fail_init, self.shutdowns = count, fail_init, 0

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=10 * (h + 1), memory=h)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h + 1) * 2**30)


def test_samples_every_gpu_each_period_until_stopped(tmp_path):
    nv = FakeNvml(2)
    path = tmp_path / "run" / "gpu_util.csv"
    sampler = start_gpu_sampler(path, 0.05, nvml=nv)
    time.sleep(0.3)
    sampler.stop()
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert len(rows) >= 4 and len(rows) % 2 == 0  # both GPUs at every sample time
    assert {(r["gpu"], r["util_pct"], r["mem_used_mib"]) for r in rows} == {
        ("0", "10", "1024.0"), ("1", "20", "2048.0")}
    times = sorted({float(r["unix_s"]) for r in rows})
    assert all(b - a >= 0.04 for a, b in zip(times, times[1:]))
    assert nv.shutdowns == 1
    n = len(rows)
    time.sleep(0.15)
    with open(path) as f:
        assert len(list(csv.DictReader(f))) == n  # nothing after stop


def test_without_gpus_there_is_no_sampler(tmp_path):
    assert start_gpu_sampler(tmp_path / "a.csv", 1.0, nvml=FakeNvml(0)) is None
    assert start_gpu_sampler(tmp_path / "b.csv", 1.0, nvml=FakeNvml(1, fail_init=True)) is None
    assert not list(tmp_path.iterdir())
    if not discover().gpus:  # this machine: the real NVML finds nothing either
        assert start_gpu_sampler(tmp_path / "c.csv", 1.0) is None
    with pytest.raises(ValueError, match="interval_s=0 must be > 0"):
        start_gpu_sampler(tmp_path / "d.csv", 0)
