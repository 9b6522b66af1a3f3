"""What a search covers (`TuneOptions`, resolved into a `Plan` on this machine) and the words
its output uses for the job's GMIs and throughput."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from gmi_drl.tune.search import envs_grid


@dataclass
class TuneOptions:
    """What `tune` searches and how long each probe runs (the ``gmi-drl tune`` flags)."""

    max_gmis: int | None = None
    """most GMIs per device, searched down to 1 (None: the device's CPU cores on CPU, 10 per
    GPU, as in the paper)"""
    envs_min: int | None = None
    """smallest num_envs per GMI of the doubling grid (None: 128 where the envs step on a GPU,
    the warp engine with --device cuda; else 2)"""
    envs_max: int | None = None
    """largest num_envs per GMI (None: 16384 where the envs step on a GPU; else 256)"""
    alpha: float = 0.1
    """saturation threshold: Sat = R_top / R_mem below it ends a GMI count's num_envs loop"""
    budget_s: float | None = None
    """seconds the search may take; no new point is profiled after it (None: no bound)"""
    warmup: int = 1
    """iterations each probe runs before it measures (start-up, compilation)"""
    iterations: int = 1
    """iterations each probe measures, at least (``min_steps`` and ``min_seconds`` set the window
    of a point whose iterations are short; one iteration of a point whose iterations are long
    varies by a few percent from the next, far less than two probes of the same point do)"""
    min_steps: int = 5_000
    """env steps (over the device's GMIs) each probe measures, at least: what sets the window
    of the search's first point, which has no earlier throughput to judge ``min_seconds`` by"""
    min_seconds: float = 1.0
    """seconds each probe measures, at least, judged from the throughput of the nearest point
    measured: the previous one with as many GMIs per device, else the one with as many envs
    (5,000 steps of a task at 300,000 steps/s would be a 17 ms window)"""
    probe_timeout_s: float = 180.0
    """a probe that runs longer hangs: it is killed and its point is not runnable"""
    num_devices: int | None = None
    """devices the estimate projects to (None: every GPU, or the one CPU device)"""
    bw: float | None = None
    """bytes/s between devices for the estimate's allreduce (None: what the probes' own
    reductions reached; benchmarks/reduce.py measures a path)"""
    out: str | None = None
    """directory for tuned.json, tune_cache.json and tune.png (None: tune/TASK-ALGO)"""
    fresh: bool = False
    """measure every point of this search again (the cache file's points of other searches
    are kept; this search's are replaced as it measures them)"""


@dataclass(frozen=True)
class Plan:
    """What a search covers, resolved from `TuneOptions` and the machine (`plan`)."""

    devices: int
    """devices the estimate projects to"""
    cores: int
    """CPU cores of one device"""
    max_gmis: int
    """GMIs per device the outer loop starts from"""
    grid: list[int]
    """num_envs per GMI of the inner loop"""
    out: Path
    """where tuned.json, tune_cache.json and tune.png go (`tune` creates it)"""
    fingerprint: str
    """the machine, in the cache key"""


def plan(cfg, options: TuneOptions) -> Plan:
    """Resolve the search of ``cfg`` under ``options`` on this machine and check everything that
    can be checked before a probe runs (nothing is written).

    Raises:
        ValueError: an option that cannot hold (all of them named), a ``cfg`` that resumes a run
            (probes are fresh runs), an async_training run over several devices, an ``--out``
            that is not a directory.
    """
    from gmi_drl.gmi.devices import discover

    check_options(options)
    if cfg.resume:
        raise ValueError(f"--resume {cfg.resume}: tune measures fresh short runs of the job and "
                         "never continues a run; give the training flags without --resume (and "
                         "train the tuned config with `gmi-drl train ALGO --config tuned.json`)")
    machine = discover()
    gpu = cfg.device == "cuda" and bool(machine.gpus)
    devices = (options.num_devices if options.num_devices is not None
               else (len(machine.gpus) if gpu else 1))
    cores = len(machine.cpu_cores) if gpu else max(1, len(machine.cpu_cores) // devices)

    def given(value, default):
        return default if value is None else value

    max_gmis = given(options.max_gmis, 10 if gpu else cores)
    sim_on_gpu = gpu and envs_on_device(cfg)
    low = given(options.envs_min, 128 if sim_on_gpu else 2)
    high = given(options.envs_max, 16384 if sim_on_gpu else 256)
    if high < low:
        def shown(flag, value, given):
            return f"--{flag} {value}" + ("" if given is not None else " (the default here)")

        raise ValueError(f"{shown('envs-min', low, options.envs_min)} is above "
                         f"{shown('envs-max', high, options.envs_max)}: give both")
    grid = envs_grid(low, high)
    if cfg.is_async and devices > 1:
        raise ValueError("tune projects an async_training run onto one device only "
                         "(--num-devices 1)")
    if devices > 1 and options.bw is None and max_gmis < 2:
        raise ValueError(f"projecting onto {devices} devices needs the bandwidth between them: "
                         "pass --bw BYTES_PER_S (benchmarks/reduce.py measures it), or let "
                         "--max-gmis be 2+ so that the probes' own reductions measure one")
    out = Path(options.out or f"tune/{cfg.env.task_id}-{cfg.algo_name}")
    existing = next(p for p in (out, *out.parents) if p.exists())  # ("." or "/" at last)
    if existing.exists() and not existing.is_dir():
        raise ValueError(f"--out {out} is not a directory ({existing} is a file); give a "
                         "directory for tuned.json, tune_cache.json and tune.png")
    for name in ("tuned.json", "tune_cache.json", "tune.png"):
        if (out / name).exists() and not (out / name).is_file():
            raise ValueError(f"--out {out}: {out / name} is not a file; move it, or give "
                             "another --out")
    fingerprint = (f"{machine.gpus if gpu else 'cpu'}:{len(machine.cpu_cores)}:{devices}:"
                   f"{os.uname().nodename}")
    return Plan(devices, cores, max_gmis, grid, out, fingerprint)


def check_options(options: TuneOptions) -> None:
    """Raise ``ValueError`` naming every option that cannot hold, before any probe runs."""
    def at_least(value, low):
        return value is None or value >= low

    bad = [f"--{name} {value} (needs {need})" for name, value, ok, need in (
        ("max-gmis", options.max_gmis, at_least(options.max_gmis, 1), ">= 1"),
        ("envs-min", options.envs_min, at_least(options.envs_min, 1), ">= 1"),
        ("envs-max", options.envs_max, at_least(options.envs_max, 1), ">= 1"),
        ("alpha", options.alpha, options.alpha >= 0, ">= 0"),
        ("budget-s", options.budget_s, options.budget_s is None or options.budget_s > 0,
         "> 0 seconds"),
        ("warmup", options.warmup, options.warmup >= 0, ">= 0"),
        ("iterations", options.iterations, options.iterations >= 1, ">= 1"),
        ("probe-timeout-s", options.probe_timeout_s, options.probe_timeout_s > 0, "> 0"),
        ("num-devices", options.num_devices, at_least(options.num_devices, 1), ">= 1"),
        ("bw", options.bw, options.bw is None or options.bw > 0, "> 0 bytes/s"),
        ("min-steps", options.min_steps, options.min_steps >= 0, ">= 0"),
        ("min-seconds", options.min_seconds, 0 <= options.min_seconds < math.inf,
         ">= 0 and finite"))
        if not ok]
    if bad:
        raise ValueError("invalid options: " + "; ".join(bad))


def envs_on_device(cfg) -> bool:
    """Whether ``cfg``'s envs step on its learner's device (the warp engine) rather than on CPU
    cores: what the paper's GPU grid of num_envs (128..16,384 per GMI) is for. A CPU-stepped task
    with a GPU learner keeps the CPU grid: 16,384 Hopper envs per GMI would be one rollout of
    33M env steps."""
    from gmi_drl.envs import engines

    engine = cfg.env.engine
    return (engine if engine != "auto" else engines(cfg.env.task_id)[0]) == "warp"


def gmi_field(cfg) -> str:
    """The `GMIConfig` field that `tune` searches as GMIs per device: every GMI of a
    sync_training run (``num_gmis``), the serving GMIs of an async_training run
    (``serving_gmis``; its trainer GMIs stay as configured)."""
    return "serving_gmis" if cfg.is_async else "num_gmis"


def top_unit(cfg) -> str:
    """What a point's ``top`` counts: env steps/s (sync_training), or samples the trainer
    GMIs learned from per second (async_training)."""
    return "samples trained/s" if cfg.is_async else "env steps/s"


def gmi_role(cfg) -> str:
    """Which GMIs `tune` counts per device (`gmi_field`), for labels."""
    return "serving GMI(s)" if cfg.is_async else "GMI(s)"
