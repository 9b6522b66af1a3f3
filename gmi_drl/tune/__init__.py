"""`gmi-drl tune`: workload-aware GMI selection (GMI-DRL §5.2, Algorithm 2) on measured points.

`search` is Algorithm 2's control flow, line for line, over any ``profile`` and ``estimate``.
`Tuner` supplies the real ones: ``profile`` trains the configured job for a few iterations with
that many GMIs on one device and ``num_envs`` envs each, in a process group of its own with a
time limit (`gmi_drl.tune.probe`, run by `gmi_drl.tune.processes`); ``estimate`` projects a
measured point to every device with the cost model (`gmi_drl.gmi.cost`, equation 3 of TCG_EX).
Every measured point goes to a cache file as soon as it is measured (`gmi_drl.tune.cache`), so an
interrupted search resumes where it stopped and a second search with the same config and machine
measures nothing.

This package sits above `gmi_drl.train`: a probe is a short training run.
"""

from gmi_drl.tune.cache import PointCache, cache_key
from gmi_drl.tune.model import Prediction, compare, predict
from gmi_drl.tune.plan import (Plan, TuneOptions, check_options, envs_on_device, gmi_field,
                               gmi_role, plan, top_unit)
from gmi_drl.tune.processes import ProbeFailed, run_probe
from gmi_drl.tune.search import Point, SearchResult, envs_grid, saturation, search
from gmi_drl.tune.tuner import Tuner, TuneReport, plot, tune

__all__ = ["Plan", "Point", "PointCache", "Prediction", "ProbeFailed", "SearchResult",
           "TuneOptions", "TuneReport", "Tuner", "cache_key", "check_options", "compare",
           "envs_grid", "envs_on_device", "gmi_field", "gmi_role", "plan", "plot", "predict",
           "run_probe", "saturation", "search", "top_unit", "tune"]
