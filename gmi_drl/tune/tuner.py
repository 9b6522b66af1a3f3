"""`tune`: Algorithm 2 on real probes of a training job, its output files, and the plot."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gmi_drl.files import replace_atomically
from gmi_drl.gmi import cost
from gmi_drl.tune.cache import PointCache, cache_key
from gmi_drl.tune.model import Prediction, compare
from gmi_drl.tune.plan import Plan, TuneOptions, gmi_field, gmi_role, plan, top_unit
from gmi_drl.tune.processes import ProbeFailed, run_probe
from gmi_drl.tune.search import Point, SearchResult, choose, search


@dataclass
class Tuner:
    """Algorithm 2 on real runs of ``config`` (a `TrainConfig`).

    Args:
        config: the job; its ``env.num_envs`` and ``gmi.num_gmis`` (async_training:
            ``gmi.serving_gmis``, `gmi_field`) are what the search sets.
        num_devices: devices of the system the estimate projects to.
        device_cores: CPU cores of one device (CPU) or of the whole machine (CUDA), for the
            resource shares.
        warmup, iterations: iterations each probe leaves out, then measures (at least).
        min_steps: env steps (every GMI's) each probe measures at least.
        min_seconds: seconds each probe measures at least, judged from the throughput of the
            nearest runnable point measured (`_prior_top`; the search's first point measures
            ``min_steps``).
        timeout_s: a probe that runs longer is killed and not runnable.
        bw_bytes_per_s: BW between devices for the estimate's allreduce term (None: the
            bandwidth the probes' own reductions reached).
        cache: where measured points are kept (None: nowhere).
    """

    config: object
    num_devices: int = 1
    device_cores: int = 1
    warmup: int = 1
    iterations: int = 1
    min_steps: int = 0
    timeout_s: float = 180.0
    bw_bytes_per_s: float | None = None
    cache: PointCache | None = None
    measured_bw: float | None = None
    min_seconds: float = 0.0
    _tops: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    """env steps/s of every runnable point so far, by (GMIs, num_envs)"""

    def profile(self, gmis: int, num_envs: int) -> Point:
        """Algorithm 2's ``profile``: a cached point, or a probe run (never raises for a
        point that does not run: it comes back not runnable, with the reason)."""
        cached = self.cache.get(gmis, num_envs) if self.cache else None
        if cached is not None:
            self._learn(cached)
            return cached
        from gmi_drl.config import ConfigError, to_dict, validate

        cfg = dataclasses.replace(self.config)
        cfg.env = dataclasses.replace(cfg.env, num_envs=num_envs)
        cfg.gmi = dataclasses.replace(cfg.gmi, num_devices=1,
                                      **{gmi_field(cfg): gmis})
        cfg.total_timesteps = max(cfg.total_timesteps, cfg.batch_size)  # the probe sets its own
        start = time.perf_counter()
        try:
            validate(cfg)
            steps = max(self.min_steps,
                        math.ceil(self._prior_top(gmis, num_envs) * self.min_seconds))
            figures = run_probe(to_dict(cfg), self.warmup, self.iterations, self.timeout_s,
                                steps)
            point = Point(gmis, num_envs, True, figures.pop("top"), figures.pop("mem"),
                          terms=figures)
        except (ProbeFailed, ConfigError) as e:
            point = Point(gmis, num_envs, False, reason=str(e))
        point.seconds = time.perf_counter() - start
        if self.cache is not None and point.runnable:  # a failure may be the options' doing
            self.cache.put(point)
        self._learn(point)
        return point

    def _prior_top(self, gmis: int, num_envs: int) -> float:
        """The throughput a probe of (``gmis``, ``num_envs``) is expected to reach: that of the
        runnable point with as many GMIs and the next fewer envs (the inner loop's previous
        point), else of the one with as many envs and the nearest GMI count (a device's
        throughput moves less with its GMI count than with num_envs), else of the one nearest
        in num_envs; 0 before any point ran."""
        fewer = [n for g, n in self._tops if g == gmis and n < num_envs]
        if fewer:
            return self._tops[(gmis, max(fewer))]
        if self._tops:
            g, n = min(self._tops, key=lambda p: (abs(math.log2(p[1] / num_envs)),
                                                  abs(p[0] - gmis), p[0], p[1]))
            return self._tops[(g, n)]
        return 0.0

    def _learn(self, point: Point) -> None:
        """Keep the point's throughput (the next probe's length) and the path bandwidth the
        first reducing point reached: allreduce bytes / seconds."""
        if point.runnable:
            self._tops[(point.gmis, point.num_envs)] = point.top
        t = point.terms
        if self.measured_bw is None and point.runnable and point.gmis > 1 and t.get("t_comm"):
            self.measured_bw = (cost.allreduce_bytes(t["model_bytes"], point.gmis)
                                / t["t_comm"])

    def estimate(self, gmis: int, point: Point) -> float:
        """Algorithm 2's ``estimate(GMIperGPU, num_GPU, top)``: the whole system's env steps per
        second. Equation 3 for TCG_EX with R = 1/gmis of a device per GMI (Algorithm 2 splits a
        device evenly) and R_all = num_devices, scaled by the measured throughput: the
        measured ``top`` keeps what the model leaves out (logging, stragglers), the model adds
        the allreduce over ``gmis * num_devices`` GMIs instead of ``gmis``."""
        if self.num_devices == 1:
            return point.top
        if self.config.is_async:
            raise ValueError("tune projects an async_training run onto one device only "
                             "(--num-devices 1)")
        t = point.terms
        bw = self.bw_bytes_per_s or self.measured_bw
        if not bw:
            raise ValueError("estimating several devices needs a bandwidth: pass --bw "
                             "BYTES_PER_S (benchmarks/reduce.py measures it) or profile 2+ GMIs "
                             "per device")
        local = t["t_s"] + t["t_a"] + t["t_t"] + t.get("t_comm", 0.0)
        terms = cost.Terms(t["t_s"], t["t_a"], t["t_t"], r_s=1 / gmis, r_a=1 / gmis,
                           r_t=1 / gmis, model_bytes=t["model_bytes"],
                           num_gmis=gmis * self.num_devices)
        per_iter = cost.throughput(cost.CostTemplate.TCG_EX, terms, bw, self.num_devices)
        return point.top * per_iter * local / gmis


@dataclass
class TuneReport:
    """What `tune` did: the search, the chosen point, the cost model's predictions per template
    beside what was measured (env steps/s), and the files it wrote."""

    search: SearchResult
    chosen: Point | None
    chosen_by: str
    wall_s: float
    predictions: list[Prediction]
    reference: Point | None
    out_dir: Path
    tuned_path: Path | None
    plot_path: Path | None
    no_model: str | None = None
    """why ``predictions`` is empty, where a point was chosen"""


def tune(cfg, options: TuneOptions, on_point: Callable[[Point], None] | None = None, *,
         planned: Plan | None = None) -> TuneReport:
    """Algorithm 2 on ``cfg`` (a validated `TrainConfig`): search, write ``tuned.json`` (the
    config with the chosen ``env.num_envs`` and GMIs (`gmi_field`), under ``"config"``, and the
    search under ``"tune"``), ``tune_cache.json`` and ``tune.png``. ``top`` is env steps per
    second for sync_training and trained samples per second for async_training; the cost
    model's predictions (synchronous templates) are made for sync_training only.

    ``tuned.json`` and ``tune.png`` are replaced whole, and only by a search that chose a point:
    one that is interrupted or finds nothing runnable leaves an earlier search's files as they
    were (the report's ``tuned_path`` is then ``None``).

    ``planned`` is `plan`'s result for ``cfg`` and ``options`` where the caller already has it
    (the devices are then not discovered twice).

    Raises:
        ValueError: what `plan` refuses; or, during the search, a projection onto several
            devices with no bandwidth to price the allreduce (no ``--bw`` and no runnable point
            of 2 or more GMIs yet; the points measured stay in the cache for a rerun).
        OSError: ``--out`` cannot be created or written (known before the first probe), or
            holds a file that is not a tune cache and cannot be moved aside.
    """
    from gmi_drl.config import to_dict

    p = planned if planned is not None else plan(cfg, options)
    p.out.mkdir(parents=True, exist_ok=True)
    tempfile.TemporaryFile(dir=p.out).close()  # writable: known before the first probe
    base = to_dict(cfg)
    cache_path = p.out / "tune_cache.json"
    key = cache_key(base, options.warmup, options.iterations, p.fingerprint, options.min_steps,
                    options.min_seconds)
    tuner = Tuner(cfg, p.devices, p.cores, options.warmup, options.iterations, options.min_steps,
                  options.probe_timeout_s, options.bw,
                  PointCache(cache_path, key, fresh=options.fresh),
                  min_seconds=options.min_seconds)
    start = time.perf_counter()
    over = ((lambda: time.perf_counter() - start > options.budget_s)
            if options.budget_s is not None else (lambda: False))
    result = search(range(p.max_gmis, 0, -1), p.grid, tuner.profile, tuner.estimate,
                    options.alpha, over, on_point)
    chosen, chosen_by = choose(result)
    predictions, reference, no_model = [], None, None
    if chosen is not None and cfg.is_async:
        no_model = "Tables 4-5 model synchronous templates; this is an async_training run"
    elif chosen is not None:
        reference = next((pt for pt in result.points if pt.gmis == 1
                          and pt.num_envs == chosen.num_envs), None)
        if reference is None and not over():
            reference = tuner.profile(1, chosen.num_envs)
            if on_point is not None:
                on_point(reference)
        if reference is not None and reference.runnable:
            predictions = compare(reference, [pt for pt in result.points
                                              if pt.num_envs == chosen.num_envs],
                                  p.cores, tuner.bw_bytes_per_s or tuner.measured_bw)
        elif reference is None:
            no_model = (f"the --budget-s ended before its reference, 1 GMI at num_envs "
                        f"{chosen.num_envs}, was measured")
        else:
            no_model = (f"its reference, 1 GMI at num_envs {chosen.num_envs}, did not run: "
                        f"{reference.reason}")
    wall = time.perf_counter() - start
    tuned = plot_path = None
    if chosen is not None:
        tuned = _write_tuned(cfg, base, p, chosen, chosen_by, len(result.points), wall)
        plot_path = replace_atomically(p.out / "tune.png", lambda f: plot(
            result.points, chosen, f, top_unit(cfg), gmi_role(cfg)))
    return TuneReport(result, chosen, chosen_by, wall, predictions, reference, p.out, tuned,
                      plot_path, no_model)


def _write_tuned(cfg, base: dict, p: Plan, chosen: Point, chosen_by: str, points: int,
                 wall_s: float) -> Path:
    """``tuned.json``, replaced whole: ``base`` (the job's config) with the chosen num_envs and
    GMIs under ``"config"``, and the search under ``"tune"``."""
    best = json.loads(json.dumps(base))
    best["env"]["num_envs"] = chosen.num_envs
    best["gmi"][gmi_field(cfg)] = chosen.gmis * p.devices
    best["gmi"]["num_devices"] = p.devices if p.devices > 1 else None
    best["run_dir"] = best["resume"] = best["config"] = None
    search = {"num_envs": chosen.num_envs, "gmis_per_device": chosen.gmis,
              "num_devices": p.devices, "chosen_by": chosen_by,
              "estimate": chosen.estimate or chosen.top, "unit": top_unit(cfg),
              "gmis_counted": gmi_role(cfg), "search_s": round(wall_s, 1), "points": points,
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return replace_atomically(p.out / "tuned.json", lambda f: f.write_text(
        json.dumps({"config": best, "tune": search}, indent=1)))


def plot(points: list[Point], chosen: Point | None, path: Path, unit: str = "env steps/s",
         gmis: str = "GMI(s)") -> Path | None:
    """Throughput (in ``unit``) and memory against num_envs, one line per value of ``gmis``
    per device, the chosen point marked; ``None`` when no point ran."""
    runnable = [p for p in points if p.runnable]
    if not runnable:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_top, ax_mem) = plt.subplots(1, 2, figsize=(11, 4))
    for count in sorted({p.gmis for p in runnable}):
        line = sorted((p for p in runnable if p.gmis == count), key=lambda p: p.num_envs)
        xs = [p.num_envs for p in line]
        ax_top.plot(xs, [p.top for p in line], "o-", label=f"{count} {gmis}/device")
        ax_mem.plot(xs, [p.mem / 2**20 for p in line], "o-", label=f"{count} {gmis}/device")
    if chosen is not None:
        ax_top.plot([chosen.num_envs], [chosen.top], "k*", markersize=16, label="chosen")
        ax_mem.plot([chosen.num_envs], [chosen.mem / 2**20], "k*", markersize=16, label="chosen")
    for ax, label in ((ax_top, f"{unit} (one device)"), (ax_mem, "peak memory per GMI, MiB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("num_envs per GMI")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("gmi-drl tune (GMI-DRL Algorithm 2)")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path
