"""`gmi-drl tune`: workload-aware GMI selection (GMI-DRL §5.2, Algorithm 2) on measured points.

`search` is Algorithm 2's control flow, line for line, over any ``profile`` and ``estimate``.
`Tuner` supplies the real ones: ``profile`` trains the configured job for a few iterations with
that many GMIs on one device and ``num_envs`` envs each, in a process group of its own with a
time limit (`gmi_drl.gmi.probe`); ``estimate`` projects a measured point to every device with the
cost model (`gmi_drl.gmi.cost`, equation 3 of TCG_EX). Every measured point goes to a cache file
as soon as it is measured, so an interrupted search resumes where it stopped and a second search
with the same config and machine measures nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from gmi_drl.files import replace_atomically, write_text_atomically
from gmi_drl.gmi import cost
from gmi_drl.gmi.launcher import COMPILER, mp_context, raise_if_interrupted, signals_deferred

CACHE_VERSION = 3
"""bumped when a point's meaning or the file's layout changes, so older cache files are not
reused (2: windows of at least ``min_seconds`` judged from the nearest point measured; 3: the
points of every key in one file, and M_p of the trained networks only)"""


@dataclass
class Point:
    """One profiled (GMIs per device, num_envs) point.

    ``top``: env steps per second of all the device's GMIs together (async_training: samples
    trained on per second); ``mem``: peak memory of its largest GMI, bytes. ``terms``: the probe's phase
    figures (`gmi_drl.gmi.probe.measure`). ``sat`` and ``estimate`` are filled by `search` where
    Algorithm 2 computes them.
    """

    gmis: int
    num_envs: int
    runnable: bool
    top: float = 0.0
    mem: float = 0.0
    seconds: float = 0.0
    """wall seconds the profile took (start-up included)"""
    reason: str = ""
    """why it is not runnable"""
    terms: dict = field(default_factory=dict)
    sat: float | None = None
    estimate: float | None = None
    cached: bool = False


@dataclass
class SearchResult:
    """What `search` found: the chosen ``(num_envs, gmis)`` (None when no point was estimated),
    its estimate, every point in profiling order, and whether the budget cut the search."""

    best: tuple[int, int] | None
    best_estimate: float
    points: list[Point]
    budget_exhausted: bool = False


def saturation(r_top: float, r_mem: float) -> float:
    """Algorithm 2 line 17, ``Sat = R_top / R_mem``. Memory that did not grow (``R_mem <= 0``)
    costs nothing, so a throughput gain then counts as unsaturated (``inf``) and no gain as
    saturated (``-inf``)."""
    if r_mem > 0:
        return r_top / r_mem
    return math.inf if r_top > 0 else -math.inf


def search(gmis_values: Sequence[int], envs_grid: Sequence[int],
           profile: Callable[[int, int], Point], estimate: Callable[[int, Point], float],
           alpha: float = 0.1, over_budget: Callable[[], bool] = lambda: False,
           on_point: Callable[[Point], None] | None = None) -> SearchResult:
    """Algorithm 2 ("Profiling-based GMI Exploration", GMI-DRL §5.2).

    For GMIs per device in ``gmis_values`` (the paper: 10 down to 1) and ``num_envs`` in
    ``envs_grid`` (ascending): a point that is not runnable is skipped (lines 6-8); the first
    runnable point of a GMI count only initialises ``pre_top``/``pre_mem`` (lines 10-13; so
    does one after a point of no throughput or memory, which the ratios cannot divide by); each
    later one computes ``Sat`` from the relative changes of throughput and memory (lines 15-18)
    and ends the inner loop when ``Sat < alpha`` (lines 19-21), else is estimated and kept when
    its estimate beats every earlier one, strictly (lines 23-26: ties keep the earlier point).

    Args:
        gmis_values: GMIs per device, in search order.
        envs_grid: num_envs values per GMI, ascending.
        profile: ``(gmis, num_envs) -> Point``.
        estimate: ``(gmis, point) -> whole-system throughput``.
        alpha: the saturation threshold.
        over_budget: asked before each profile; True ends the search (the budget).
        on_point: called with every point after Algorithm 2 has looked at it.
    """
    best, max_top, points = None, -math.inf, []
    for gmis in gmis_values:
        pre_top = pre_mem = 0.0
        for num_envs in envs_grid:
            if over_budget():
                return SearchResult(best, max_top, points, budget_exhausted=True)
            point = profile(gmis, num_envs)
            points.append(point)
            try:
                if not point.runnable:
                    continue
                if pre_top <= 0 or pre_mem <= 0:  # (a point of 0 could not be divided by)
                    pre_top, pre_mem = point.top, point.mem
                    continue
                point.sat = saturation((point.top - pre_top) / pre_top,
                                       (point.mem - pre_mem) / pre_mem)
                pre_top, pre_mem = point.top, point.mem
                if point.sat < alpha:
                    break
                point.estimate = estimate(gmis, point)
                if point.estimate > max_top:
                    max_top, best = point.estimate, (num_envs, gmis)
            finally:
                if on_point is not None:
                    on_point(point)
    return SearchResult(best, max_top, points)


def envs_grid(low: int, high: int) -> list[int]:
    """``low, 2 low, 4 low, ...`` up to ``high`` (Algorithm 2's doubling grid).

    Raises:
        ValueError: ``low < 1`` or ``high < low``.
    """
    if low < 1 or high < low:
        raise ValueError(f"num_envs grid {low}..{high}: need 1 <= low <= high")
    grid = [low]
    while grid[-1] * 2 <= high:
        grid.append(grid[-1] * 2)
    return grid


class PointCache:
    """Measured points in a JSON file, under a key of everything that changes a measurement
    (the config less num_envs and GMIs, the probe length, the device); written after every
    point. Points of other keys in the file (other jobs tuned into the same ``--out``) are kept.
    A file that is not a cache (unreadable, or edited into another shape) is kept beside it as
    ``NAME.bad`` and the search starts afresh, with a warning; an entry that is not a whole
    runnable point is measured again.

    Args:
        path: the cache file.
        key: this search's key.
        fresh: start this key's points afresh (the file's other keys are kept).
    """

    def __init__(self, path: Path, key: str, fresh: bool = False) -> None:
        self.path, self.key = Path(path), key
        self.entries: dict[str, dict] = {}
        if self.path.exists() or self.path.is_symlink():
            self.entries = self._read()
        if fresh or not isinstance(self.entries.get(key), dict):
            self.entries[key] = {}
        self.points: dict[str, dict] = self.entries[key]

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            return self._set_aside(f"it does not read as JSON ({e})")
        if not isinstance(data, dict):
            return self._set_aside("it holds no cache object")
        if data.get("version") != CACHE_VERSION:
            return {}  # an older gmi-drl's points mean something else: measured again
        entries = data.get("entries")
        if not isinstance(entries, dict):
            return self._set_aside("it has no 'entries' object")
        return entries

    def _set_aside(self, why: str) -> dict:
        bad = self.path.with_name(self.path.name + ".bad")
        try:
            os.replace(self.path, bad)
        except OSError as e:
            raise OSError(f"{self.path} is not a tune cache ({why}) and cannot be moved "
                          f"aside ({e}): move or delete it") from None
        warnings.warn(f"{self.path} is not a tune cache ({why}); kept as {bad}, every point "
                      "is measured again", stacklevel=3)
        return {}

    def get(self, gmis: int, num_envs: int) -> Point | None:
        """The cached point, or ``None`` (also for an entry that is not a whole runnable point
        of these GMIs and num_envs, e.g. edited by hand: it is measured again)."""
        data = self.points.get(f"{gmis},{num_envs}")
        try:
            point = Point(**{**data, "cached": True, "sat": None, "estimate": None})
        except TypeError:  # None, not a dict, or other fields
            return None
        whole = (point.runnable is True and point.gmis == gmis and point.num_envs == num_envs
                 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                         and 0 < v < math.inf for v in (point.top, point.mem))
                 and isinstance(point.terms, dict)
                 and all(isinstance(v, (int, float)) for v in point.terms.values()))
        return point if whole else None

    def put(self, point: Point) -> None:
        data = dataclasses.asdict(point)
        for transient in ("cached", "sat", "estimate"):
            data.pop(transient)
        self.points[f"{point.gmis},{point.num_envs}"] = data
        write_text_atomically(self.path, json.dumps({"version": CACHE_VERSION,
                                                     "entries": self.entries}, indent=1))


PROBE_PRELOAD = ("gmi_drl.gmi.probe", "gmi_drl.train", *COMPILER)
"""what the fork server that starts the probes imports once: a probe forked from it starts
without importing them (about 4 s of a 1-GMI probe's 7-10 s on machine A, where the GMI trains in
the probe's own process)"""


def run_probe(config: dict, warmup: int, iterations: int, timeout_s: float,
              min_steps: int = 0, target: str = "gmi_drl.gmi.probe:main") -> dict:
    """Run `gmi_drl.gmi.probe` on ``config`` in a process of its own, forked from
    multiprocessing's fork server (`PROBE_PRELOAD` imported there once), in a new session;
    returns its figures. ``target`` (``"module:function"``, called with ``[REQUEST.json,
    RESULT.json]``, returning the exit status) is the probe's entry point.

    Raises:
        ProbeFailed: it ended without writing its figures (a crash, the kernel's OOM killer),
            or ran past ``timeout_s`` (then its whole process group, GMIs and env workers
            included, is stopped first).
    """
    with tempfile.TemporaryDirectory(prefix="gmi-drl-tune-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        log_path = Path(tmp) / "probe.log"
        request.write_text(json.dumps({"config": config, "warmup": warmup,
                                       "iterations": iterations, "min_steps": min_steps}))
        log_path.touch()
        ctx = mp_context("forkserver", PROBE_PRELOAD)
        process = ctx.Process(target=_probe_main, name="gmi-drl-probe",
                              args=(target, str(request), str(result), str(log_path),
                                    dict(os.environ)))
        proc = None
        try:
            # an interrupt inside start() would leave a probe the server forks after it
            raise_if_interrupted()
            with signals_deferred(signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                process.start()
                proc = _Forked(process)
            hung = not _wait_for(proc, result, timeout_s)
        finally:
            if proc is not None:  # on a timeout the probe; always GMIs or workers it left
                _kill_group(proc)
        text = log_path.read_text(errors="replace")
        if hung:
            raise ProbeFailed(f"hung: still running after {timeout_s:.0f} s (killed) "
                              f"{_how_far(text)}")
        if not result.exists():
            what = ("killed by the kernel (out of memory?)" if proc.returncode == -9
                    else f"exit status {proc.returncode}")
            last = _last_line(text)
            raise ProbeFailed(f"{what}: {last[:300]}" if last else
                              f"{what} before the probe started (its traceback is on this "
                              "process's stderr; a script that runs tune needs the 'if __name__ "
                              "== \"__main__\":' guard: the fork server imports it)")
        return json.loads(result.read_text())


def _probe_main(target: str, request: str, result: str, log_path: str, environ: dict) -> None:
    """A probe, in the process the fork server forked: a session of its own (so that the whole
    group can be stopped at the limit), the caller's environment (the server has the one it was
    started with), stdout and stderr into ``log_path``."""
    os.setsid()
    os.environ.clear()
    os.environ.update(environ)
    tempfile.tempdir = None  # TMPDIR as the caller has it, not as the server had it
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:  # the caller gave this probe up before it started
        os._exit(0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # (the server's children start with it ignored)
    module, name = target.split(":")
    sys.exit(getattr(importlib.import_module(module), name)([request, result]))


class _Forked:
    """A `multiprocessing.Process` as much of a `subprocess.Popen` as `_wait_for` and
    `_kill_group` use: ``pid``, ``poll``, ``wait`` and ``returncode``."""

    def __init__(self, process) -> None:
        self._process, self.pid = process, process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("gmi-drl probe", timeout)
        return self._process.exitcode


def _wait_for(proc: _Forked, result: Path, timeout_s: float) -> bool:
    """Wait until ``proc`` exits or has written ``result`` (the probe writes it whole, with
    `os.replace`, once its run has ended); False when neither happened within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not result.exists():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            proc.wait(timeout=min(left, 0.05))
            return True
        except subprocess.TimeoutExpired:
            pass
    return True


def _last_line(log: str) -> str:
    """The probe's last line of output, less the resource tracker's warning about what it
    unlinked after the probe died (two lines: the warning and its source line)."""
    lines = [line for line in log.splitlines() if line.strip()]
    while lines and ("resource_tracker" in lines[-1]
                     or lines[-1].lstrip().startswith("warnings.warn(")):
        lines.pop()
    return lines[-1] if lines else ""


def _how_far(log: str) -> str:
    """Where a probe stood when it was killed, from the progress lines it prints per update:
    still starting (imports, env workers, compilation), or its last update, so that a user can
    tell a stuck point from a time limit too short for the job."""
    steps = [line.strip() for line in log.splitlines() if line.startswith("step ")]
    if not steps:
        return "before its first update ended (start-up: imports, envs, compilation)"
    return (f"at {steps[-1].split('|')[0].strip()} after {len(steps)} update(s): still "
            "progressing, so --probe-timeout-s may be too short for this job")


class ProbeFailed(RuntimeError):
    """A profiled point did not run to its end (Algorithm 2: not runnable)."""


def _kill_group(proc: _Forked | subprocess.Popen, grace_s: float = 5.0) -> None:
    """End the process group that ``proc`` leads. SIGTERM first: the GMIs leave through their
    handlers and a probe unwinds its run (`gmi_drl.gmi.probe.main`), which unlinks the shared
    memory and removes the temporary directories they held (a SIGKILL to the whole group left
    those behind). SIGKILL then ends whatever is still running ``grace_s`` seconds later (a
    process stuck where no handler runs); what it held in /dev/shm is unlinked by
    multiprocessing's resource tracker when this process exits (a forked probe shares it)."""
    running = True
    try:
        if not _signal_group(proc, signal.SIGTERM):
            running = False  # neither the group nor the probe is there
        deadline = time.monotonic() + grace_s
        while running and time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie runs nothing
            running = _running_in_group(proc.pid) or proc.poll() is None
            if running:
                time.sleep(0.02)
    except PermissionError:
        pass
    finally:
        if running or proc.poll() is None:
            try:
                _signal_group(proc, signal.SIGKILL)
            except PermissionError:
                pass
        proc.wait()


def _signal_group(proc: _Forked | subprocess.Popen, signum: int) -> bool:
    """Send ``signum`` to the process group ``proc`` leads; where there is none yet (a probe
    before its ``setsid``, still in the fork server's group, with nothing started), to ``proc``
    alone. False when neither is there."""
    try:
        os.killpg(proc.pid, signum)
        return True
    except ProcessLookupError:
        pass
    if proc.poll() is not None:
        return False
    try:
        os.kill(proc.pid, signum)
        return True
    except ProcessLookupError:
        return False


def _running_in_group(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs: from /proc, zombies left out; without
    /proc, whether the group has a member at all (a zombie counts there)."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


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


def point_terms(point: Point, device_cores: int, gmis: int | None = None) -> cost.Terms:
    """Table 3's terms from a measured point, resource sizes as fractions of ``device_cores``
    (the probe measures them as CPU cores in use); ``gmis``: the system's GMI count for the
    allreduce term (default the point's)."""
    t = point.terms
    return cost.Terms(t["t_s"], t["t_a"], t["t_t"], t["r_s"] / device_cores,
                      t["r_a"] / device_cores, t["r_t"] / device_cores, t["state_bytes"],
                      t["action_bytes"], t["reward_bytes"], t["model_bytes"], t["samples"],
                      gmis or point.gmis)


def predict(reference: Point, gmis: int, device_cores: int, bw_bytes_per_s: float | None
            ) -> dict[tuple[str, str], float]:
    """The cost model's throughput (env steps/s) of ``gmis`` GMIs on one device, per template
    and variant, from the terms of ``reference``: one GMI measured alone (equation 1's
    condition).

    Variant ``paper``: Tables 4-5 as printed, ``R`` of each unit from the roles' sizes measured
    alone, ``min(gmis, 1/R)`` units at once. Variant ``share`` (co-located templates): every GMI
    holds ``1/gmis`` of the device as Algorithm 2 splits it, each role's time stretched where it
    needed more (`cost.scaled_to_share`). TCG is serving (each GMI's rollout), TCG_EX holistic
    training; TDG and TDG_EX need a bandwidth between GMIs (``None``: not predicted).
    """
    samples = reference.terms["samples"]
    base = point_terms(reference, device_cores, gmis)
    per_step = samples / reference.num_envs  # serving steps of the batch per iteration
    out = {}
    for template in cost.CostTemplate:
        dedicated = template in (cost.CostTemplate.TDG, cost.CostTemplate.TDG_EX)
        if dedicated and not bw_bytes_per_s:
            continue
        variants = {"paper": base}
        if not dedicated:
            variants["share"] = cost.scaled_to_share(base, 1.0 / gmis)
        for variant, terms in variants.items():
            scale = samples
            if template is cost.CostTemplate.TDG:  # Table 4 counts one serving step
                n = reference.num_envs
                terms = dataclasses.replace(terms, t_s=terms.t_s / per_step,
                                            t_a=terms.t_a / per_step,
                                            state_bytes=terms.state_bytes * n,
                                            action_bytes=terms.action_bytes * n,
                                            reward_bytes=terms.reward_bytes * n)
                scale = n
            r = cost.resource_size(template, terms)
            units = min(float(gmis), 1.0 / r) if r > 0 else float(gmis)
            rate = cost.throughput(template, terms, bw_bytes_per_s or math.inf,
                                   r_all=units * r)
            out[(template.value, variant)] = rate * scale
    return out


@dataclass(frozen=True)
class Prediction:
    """The cost model's throughput for one template and GMI count beside the measured one
    (env steps/s; ``measured`` None where gmi-drl runs no such template)."""

    template: str
    variant: str
    """``paper`` (Tables 4-5 as printed) or ``share`` (GMIs of an even share: `predict`)"""
    gmis: int
    predicted: float
    measured: float | None

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        return None if not self.measured else (self.predicted - self.measured) / self.measured


def measured_rates(point: Point) -> dict[str, float]:
    """What a sync_training point measured, per template of the model: ``tcg`` the serving
    rate of its GMIs (env steps per second of rollout, every GMI at once), ``tcg_ex`` its
    training throughput."""
    t = point.terms
    return {"tcg": point.gmis * t["samples"] / (t["t_s"] + t["t_a"]), "tcg_ex": point.top}


def compare(reference: Point, points: Sequence[Point], device_cores: int,
            bw_bytes_per_s: float | None) -> list[Prediction]:
    """`predict` from ``reference`` (one GMI alone) for the GMI count of every runnable point
    in ``points`` (same num_envs), beside what each measured."""
    out = []
    for point in sorted((p for p in points if p.runnable), key=lambda p: p.gmis):
        got = measured_rates(point)
        for (template, variant), value in predict(reference, point.gmis, device_cores,
                                                  bw_bytes_per_s).items():
            out.append(Prediction(template, variant, point.gmis, value, got.get(template)))
    return out


def cache_key(config: dict, warmup: int, iterations: int, machine: str,
              min_steps: int = 0, min_seconds: float = 0.0) -> str:
    """A digest of what changes a measured point."""
    data = json.loads(json.dumps(config))
    data["env"].pop("num_envs", None)
    data["gmi"].pop("num_gmis", None)
    for volatile in ("run_dir", "preset", "resume", "config", "total_timesteps"):
        data.pop(volatile, None)
    text = json.dumps([data, warmup, iterations, min_steps, machine]
                      + ([min_seconds] if min_seconds else []), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def envs_on_device(cfg) -> bool:
    """Whether ``cfg``'s envs step on its learner's device (the warp engine) rather than on CPU
    cores: what the paper's GPU grid of num_envs (128..16,384 per GMI) is for. A CPU-stepped task
    with a GPU learner keeps the CPU grid: 16,384 Hopper envs per GMI would be one rollout of
    33M env steps."""
    from gmi_drl.envs import engines

    engine = cfg.env.engine
    return (engine if engine != "auto" else engines(cfg.env.task_id)[0]) == "warp"


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
    chosen, chosen_by = _choose(result)
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
        best = json.loads(json.dumps(base))
        best["env"]["num_envs"] = chosen.num_envs
        best["gmi"][gmi_field(cfg)] = chosen.gmis * p.devices
        best["gmi"]["num_devices"] = p.devices if p.devices > 1 else None
        best["run_dir"] = best["resume"] = best["config"] = None
        tuned = replace_atomically(p.out / "tuned.json", lambda f: f.write_text(json.dumps({
            "config": best, "tune": {
                "num_envs": chosen.num_envs, "gmis_per_device": chosen.gmis,
                "num_devices": p.devices, "chosen_by": chosen_by,
                "estimate": chosen.estimate or chosen.top, "unit": top_unit(cfg),
                "gmis_counted": gmi_role(cfg), "search_s": round(wall, 1),
                "points": len(result.points), "date": time.strftime("%Y-%m-%d %H:%M:%S")}},
            indent=1)))
        plot_path = replace_atomically(p.out / "tune.png", lambda f: plot(
            result.points, chosen, f, top_unit(cfg), gmi_role(cfg)))
    return TuneReport(result, chosen, chosen_by, wall, predictions, reference, p.out, tuned,
                      plot_path, no_model)


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


def _choose(result: SearchResult) -> tuple[Point | None, str]:
    """Algorithm 2's pick; where it estimated no point (every GMI count saturated at its second
    runnable point, or the budget ended the search first), the fastest runnable point."""
    if result.best is not None:
        num_envs, gmis = result.best
        point = next(p for p in result.points if (p.num_envs, p.gmis) == (num_envs, gmis))
        return point, "Algorithm 2"
    runnable = [p for p in result.points if p.runnable]
    if not runnable:
        return None, "no runnable point"
    return max(runnable, key=lambda p: p.top), "fastest measured point (Algorithm 2 estimated none)"


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
