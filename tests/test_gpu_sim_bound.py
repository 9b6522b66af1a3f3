"""`benchmarks/gpu_sim.py --parts bound` (the warp pool against its physics bound) on Warp's CPU
device: the figures it returns and the pool limits it keeps (the CUDA graph path runs only on a
GPU)."""

import importlib.util
import math
from pathlib import Path

import pytest

from gmi_drl.envs.warp.pool import warp_error

pytestmark = [pytest.mark.skipif(warp_error() is not None, reason=str(warp_error())),
              pytest.mark.warp]


def _gpu_sim():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_sim.py"
    spec = importlib.util.spec_from_file_location("gpu_sim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bound_measures_the_pools_own_physics_and_step():
    r = _gpu_sim().bound("Ant-gmi-v0", 2, "cpu", seconds=0.01, repeats=1, njmax=200)
    assert (r["frame_skip"], r["nconmax"], r["njmax"]) == (2, 48, 200)  # the task's; the given
    for key in ("physics", "pool", "graph", "task"):
        assert math.isfinite(r[key]) and r[key] > 0, key
    assert 0.0 <= r["ended"] <= 1.0


def test_bound_refuses_figures_from_worlds_that_dropped_contacts():
    """The bound steps the pool's own data, with its buffers: too few contacts per world
    overflow there too, and the measurement raises instead of reporting a rate."""
    with pytest.raises(RuntimeError, match="overflowed .* nconmax="):
        _gpu_sim().bound("Ant-gmi-v0", 2, "cpu", seconds=0.01, repeats=1, nconmax=1, njmax=4)
