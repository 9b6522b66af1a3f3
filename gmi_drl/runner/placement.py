"""Placements: where a run's GMIs execute. One interface, three implementations, each
launching any template (`gmi_drl.runner.template`: what the GMIs do and share).

- `SerialPlacement`: every GMI a thread of this process (env workers in-process too), the
  reduction in its in-process form (the shared-memory block, or the switch). The twin of the
  process placements for debugging and tests: same target, same reducers, same weights.
- `LocalPlacement`: one process per GMI on this machine (`gmi_drl.gmi.launcher`); a single GMI
  that no profiler wraps runs in this process.
- `RayPlacement`: one Ray actor per GMI (`gmi_drl.cluster.ray_launcher`), restarted from the last
  checkpoint after a failure when ``ray.max_restarts`` allows.

Each runs the template's target with the same `gmi_drl.gmi.context.GMIContext`, inside the
template's shared resources, and describes where it put the GMIs (markdown lines for
``summary.md``, the template's after its own).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
import time
import traceback
from typing import Any, Callable, Protocol

from gmi_drl.comm.reduction import Reduction
from gmi_drl.config import ConfigError, TrainConfig
from gmi_drl.gmi.context import GMIContext, ReductionGroup, shm_group_sizes
from gmi_drl.gmi.launcher import GMIError, run_target
from gmi_drl.runner.template import SyncTemplate, Template
from gmi_drl.telemetry.progress import printed_here, relayed

log = logging.getLogger(__name__)


class Placement(Protocol):
    """Runs a template's target once per GMI of a run."""

    template: Template

    def launch(self, payload: Any) -> list[Any]:
        """Run the template's target for every GMI, ``payload`` given to the template's
        `Template.shared`; blocks; the results by GMI id.

        Raises:
            GMIError: a GMI raised, died or hung; the run was stopped.
        """

    def describe(self) -> str:
        """Markdown lines: where the GMIs ran and how they reduced (after `launch`)."""


def _warn_shared_cores(gmis: int, cores: int) -> None:
    """More CPU GMIs than cores: they take turns on a core each, which costs throughput
    (`gmi-drl tune` measures how much)."""
    if gmis > cores:
        log.warning("%d GMIs on %d CPU core(s): GMIs share cores (%.1f GMIs per core), so each "
                    "runs slower; `gmi-drl tune` measures which count is fastest here", gmis,
                    cores, gmis / cores)


def make_placement(cfg: TrainConfig, capacity: int | Callable[[], int]) -> Placement:
    """The placement of ``cfg.placement`` launching ``cfg``'s template for ``cfg.gmi``'s
    layout; ``capacity``: the most float32 values one allreduce carries (shared-memory sizing),
    or on Ray a function that computes it where GMI 0 runs.

    Raises:
        ConfigError: the layout does not fit this machine (a backend it lacks, fewer GMIs than
            devices, a forced reduction the layout cannot run).
    """
    from gmi_drl.gmi.devices import discover, for_device

    machine, g = for_device(discover(), cfg.device), cfg.gmi
    if cfg.placement == "local" and cfg.device == "cpu":  # a process per GMI, on these cores
        _warn_shared_cores(g.serving_gmis + g.trainer_gmis if cfg.is_async else g.num_gmis,
                           len(machine.cpu_cores))
    template = (_async_template(cfg, machine, capacity) if cfg.is_async
                else _sync_template(cfg, machine, capacity))
    if cfg.placement == "serial":
        try:
            return SerialPlacement(cfg, template)
        except ValueError as e:  # (auto chose, for this layout, a reduction serial cannot run)
            raise ConfigError(f"invalid config:\n  placement='serial': {e}; give "
                              "--gmi.reduction mpr, or --placement local") from None
    if cfg.placement == "ray":
        return RayPlacement(cfg, template)
    return LocalPlacement(cfg, template, machine)


def _async_template(cfg: TrainConfig, machine, capacity) -> Template:
    from gmi_drl.runner.async_template import AsyncTemplate

    return AsyncTemplate(cfg, machine, capacity)


def _sync_template(cfg: TrainConfig, machine, capacity) -> SyncTemplate:
    """Holistic GMIs on the layout the planner picks for ``cfg.gmi`` on ``machine``."""
    from gmi_drl.gmi.layout import plan

    g = cfg.gmi
    backend = None if g.backend == "auto" else g.backend
    if backend is None and g.num_gmis == 1 and machine.gpus:
        backend = "cuda_shared"  # one GMI shares no GPU: no MPS
    try:
        layout = plan(g.num_gmis, machine, num_devices=g.num_devices, backend=backend,
                      reduction=g.reduction)
    except ValueError as e:  # a layout this machine cannot hold: the config's fault
        raise ConfigError(f"invalid config:\n  gmi: {e}") from None
    log.info("%d GMI(s), %s, backend %s, gradient reduction %s", layout.num_gmis,
             " | ".join(f"device {d}: GMI {', '.join(map(str, g))}"
                        for d, g in enumerate(layout.mpl)), layout.backend.value,
             layout.reduction.value if layout.num_gmis > 1 else "none (one GMI)")
    return SyncTemplate(cfg, layout, capacity)


class SerialPlacement:
    """Every GMI as a thread of this process (one GMI: this thread), reducing in process,
    env workers in process; the async template's GMIs in lock-step.

    Raises (at construction):
        ValueError: a reduction that needs a process per GMI (mrr, har, ring).
    """

    def __init__(self, cfg: TrainConfig, template: Template) -> None:
        layout = template.layout
        if (not cfg.is_async and layout.num_gmis > 1
                and layout.reduction not in (Reduction.MPR, Reduction.SWITCH, Reduction.PS)):
            raise ValueError(f"serial placement reduces in process (mpr, switch, ps), not "
                             f"{layout.reduction.value}")
        self.cfg, self.template = cfg, template
        if cfg.profile.tool == "nsys":
            from gmi_drl.telemetry.profiler import NSYS_OPTIONS

            log.info("serial run: to capture it, start it under Nsight Systems yourself: nsys "
                     "profile %s gmi-drl train ...",
                     " ".join(f"--{k}={v}" for k, v in NSYS_OPTIONS.items()))

    def launch(self, payload: Any) -> list[Any]:
        from gmi_drl.comm.shm import ShmGroup

        t = self.template
        lay = t.layout
        made = [ShmGroup.create(size, t.reducer_capacity) for size in shm_group_sizes(lay)]
        gc = self.cfg.gmi
        group = ReductionGroup(tuple(g for g, _ in made), "", gc.service_addrs,
                               gc.switch_job or f"gmi-drl-serial-{id(self)}", gc.switch_token,
                               gc.staleness if gc.reduction == "ps" else 0)
        try:
            with t.shared(payload, "serial") as shared:
                if lay.num_gmis == 1:
                    return [run_target(t.target, GMIContext(0, lay, shared, group))]
                return self._threads(shared, group)
        finally:
            for _, owner in made:
                ShmGroup.destroy(owner)

    def _threads(self, payload: Any, group: ReductionGroup) -> list[Any]:
        target, layout = self.template.target, self.template.layout
        n = layout.num_gmis
        results: list[Any] = [None] * n
        errors: dict[int, str] = {}
        done = [threading.Event() for _ in range(n)]

        def run(g: int) -> None:
            try:
                results[g] = run_target(target, GMIContext(g, layout, payload, group))
            except BaseException:  # noqa: BLE001 - reported below with its traceback
                errors[g] = traceback.format_exc()
            finally:
                done[g].set()

        threads = [threading.Thread(target=run, args=(g,), name=f"gmi-{g}", daemon=True)
                   for g in range(n)]
        try:
            for t in threads:
                t.start()
            # not Thread.join: on CPython 3.11-3.12 a join that a signal cuts short marks the
            # (live) thread as stopped; and waits of 0.1 s, not one untimed wait: a Ctrl-C that
            # the kernel hands to a GMI thread does not wake this one, which only then runs
            # Python's handler (an untimed wait once hung a test run for good)
            for d in done:
                while not d.wait(0.1):
                    pass
        except BaseException:  # Ctrl-C or SIGTERM (this thread): stop the GMIs first, as the
            _interrupt(threads, done)  # process placements do, or they run on into the exit
            raise
        for t in threads:
            t.join()
        if errors:
            g = min(errors)
            raise GMIError.raised(g, errors[g])
        self.results = results
        return results

    def describe(self) -> str:
        n = self.template.layout.num_gmis
        where = "one GMI in this process" if n == 1 else f"{n} GMIs as threads of this process"
        return (f"- placement: serial: {where}, env workers in-process\n"
                + self.template.describe(getattr(self, "results", []), self.template.layout))


def _interrupt(threads: list[threading.Thread], done: list[threading.Event],
               timeout_s: float = 10.0) -> None:
    """Raise ``KeyboardInterrupt`` in every GMI thread that started and has not set its
    ``done``, and wait for them, ``timeout_s`` seconds in all (a second Ctrl-C does not cut the
    wait short). A thread gets it when it next runs Python code: a GMI waiting at an MPR barrier
    or between kernels within milliseconds, one inside a long C call when the call returns.
    Left running, GMI threads trained on into the interpreter's exit, past their unlinked MPR
    groups, and the exit often aborted ("terminate called without an active exception")."""
    live = [(t, d) for t, d in zip(threads, done) if t.ident is not None and not d.is_set()]
    for t, _ in live:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident),
                                                   ctypes.py_object(KeyboardInterrupt))
    deadline = time.monotonic() + timeout_s
    for _, d in live:
        while True:
            try:
                d.wait(max(0.0, deadline - time.monotonic()))
                break
            except KeyboardInterrupt:
                continue
    stuck = [t.name for t, d in live if not d.is_set()]
    if stuck:
        log.warning("GMI threads %s did not stop within %.0f s of the interrupt (inside a "
                    "long call); the exit may abort", stuck, timeout_s)


class LocalPlacement:
    """One process per GMI on this machine; a lone GMI without a profiler prefix runs here."""

    def __init__(self, cfg: TrainConfig, template: Template, machine) -> None:
        self.cfg, self.template, self.machine = cfg, template, machine
        self.prefixes: dict[int, list[str]] = {}
        self.results: list[Any] = []

    def launch(self, payload: Any) -> list[Any]:
        from gmi_drl.gmi.launcher import COMPILER, launch

        t, g = self.template, self.cfg.gmi
        self.prefixes = _nsys_prefixes(self.cfg, payload.run.run_dir, self.machine)
        if t.layout.num_gmis == 1 and not self.prefixes:
            with t.shared(payload, "local") as shared:
                self.results = [run_target(t.target, GMIContext(0, t.layout, shared))]
            return self.results
        with relayed(payload.progress) as progress, \
                t.shared(dataclasses.replace(payload, progress=progress), "local") as shared:
            self.results = launch(t.target, t.layout, self.machine, payload=shared,
                                  reducer_capacity=t.reducer_capacity,
                                  service_addrs=g.service_addrs,
                                  netns=g.netns_list, prefixes=self.prefixes,
                                  job_id=g.switch_job, token=g.switch_token,
                                  staleness=g.staleness if g.reduction == "ps" else 0,
                                  start_method=g.start_method, tolerate=t.tolerate,
                                  preload=COMPILER if self.cfg.compile else (),
                                  exit_timeout_s=600.0 if self.prefixes else 5.0)  # nsys: at exit
        return self.results

    def describe(self) -> str:
        n = self.template.layout.num_gmis
        where = ("one GMI in this process" if n == 1 and not self.prefixes
                 else f"one process per GMI ({n}), {self._started()}")
        return (f"- placement: local: {where}\n"
                + self.template.describe(self.results, self.template.layout))

    def _started(self) -> str:
        """How the GMI processes were started: a GMI under a profiler is always spawned."""
        n, profiled = self.template.layout.num_gmis, sorted(self.prefixes)
        if self.cfg.gmi.start_method == "spawn" or len(profiled) == n:
            return "spawned"
        if not profiled:
            return "forked by the fork server"
        return (f"forked by the fork server, GMI {', '.join(map(str, profiled))} spawned "
                "under the profiler")


class RayPlacement:
    """One Ray actor per GMI, on the cluster of ``ray.address``."""

    def __init__(self, cfg: TrainConfig, template: Template) -> None:
        self.cfg, self.template = cfg, template
        self._run = None

    def launch(self, payload: Any) -> list[Any]:
        from gmi_drl.cluster.ray_launcher import launch

        cfg, r, t = self.cfg, self.cfg.ray, self.template
        g = cfg.gmi
        switch = g.switch_addrs[0] if g.reduction == "switch" else None
        ps = g.ps_addr if g.reduction == "ps" else None
        printing = dataclasses.replace(payload, progress=printed_here(payload.progress))
        with t.shared(printing, "ray") as shared:
            self._run = launch(t.target, t.layout, shared, address=r.address,
                               max_restarts=r.max_restarts, num_cpus_per_gmi=r.num_cpus_per_gmi,
                               placement_timeout_s=r.placement_timeout_s,
                               reducer_capacity=t.reducer_capacity, switch_addr=switch,
                               switch_job=cfg.gmi.switch_job, switch_token=cfg.gmi.switch_token,
                               runtime_envs=_nsight_runtime_envs(cfg, payload.run.run_dir,
                                                                 t.layout.num_gmis),
                               rendezvous=cfg.is_async,
                               reduction_note=(t.trainer_reduction() if cfg.is_async
                                               else None),
                               on_restart=lambda error: _restarted(shared, payload.progress),
                               ps_addr=ps, staleness=g.staleness)
        return self._run.results

    def describe(self) -> str:
        from gmi_drl.cluster.membership import describe

        run = self._run
        return (describe(run.layout, run.nodes, run.restarts)
                + self.template.describe(run.results, run.layout))


def _restarted(payload, progress):
    """The payload a failed Ray run restarts with: resumed from its latest checkpoint, its
    progress printed without repeating the warning (``progress``: the caller's)."""
    return dataclasses.replace(payload, progress=printed_here(progress, warn=False),
                               run=payload.run.restarted())


def _nsys_prefixes(cfg: TrainConfig, run_dir, machine) -> dict[int, list[str]]:
    """``{gmi_id: nsys command}`` for the GMIs that run under Nsight Systems: with
    ``profile.tool nsys``, the selected GMIs, where ``nsys`` is on PATH, NVML sees a GPU and
    torch is built with CUDA (its capture ranges need CUDA); otherwise none, with a warning
    saying why."""
    from gmi_drl.telemetry.profiler import nsys_command

    if cfg.profile.tool != "nsys":
        return {}
    import torch

    reason = (machine.no_gpu_reason if not machine.gpus else None if torch.backends.cuda.is_built()
              else "torch is a CPU build (no CUDA)")
    if reason is not None:  # (is_built: without initialising CUDA in the controller)
        log.warning("profiling: %s: nsys capture ranges need CUDA; GMIs run without Nsight "
                    "Systems, only the built-in timeline.json is written", reason)
        return {}
    prefixes = {k: c for k in range(cfg.gmi.num_gmis)
                if (c := nsys_command(cfg.profile, k, run_dir)) is not None}
    for k in prefixes:  # nsys does not create its output directory
        (run_dir / "profile" / f"gmi-{k}").mkdir(parents=True, exist_ok=True)
    return prefixes


def _nsight_runtime_envs(cfg: TrainConfig, run_dir, num_gmis: int) -> list[dict | None] | None:
    """Per GMI, the Ray ``runtime_env`` part that runs its actor under Nsight Systems (the
    Nsight-on-Ray article: ``{"nsight": ...}`` per actor instance), or ``None`` when no GMI is
    profiled with nsys."""
    from gmi_drl.telemetry.profiler import nsight_runtime_env

    if cfg.profile.tool != "nsys":
        return None
    envs = [nsight_runtime_env(cfg.profile, k, run_dir) for k in range(num_gmis)]
    return envs if any(e is not None for e in envs) else None
