"""Placements: where a run's GMIs execute. One interface, three implementations.

- `SerialPlacement`: every GMI a thread of this process (env workers in-process too), the
  reduction in its in-process form (the shared-memory block, or the switch). The twin of the
  process placements for debugging and tests: same target, same reducers, same weights.
- `LocalPlacement`: one process per GMI on this machine (`gmi_drl.gmi.launcher`); a single GMI
  that no profiler wraps runs in this process.
- `RayPlacement`: one Ray actor per GMI (`gmi_drl.cluster.ray_launcher`), restarted from the last
  checkpoint after a failure when ``ray.max_restarts`` allows.

Each runs the same target with the same `gmi_drl.gmi.context.GMIContext`, and describes where it
put the GMIs (markdown lines for ``summary.md``).
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
from gmi_drl.gmi.layout import Layout
from gmi_drl.telemetry.progress import printed_here, relayed

log = logging.getLogger(__name__)


class Placement(Protocol):
    """Runs a target once per GMI of a run."""

    def launch(self, target: str, payload: Any) -> list[Any]:
        """Run ``target(ctx)`` for every GMI; blocks; the results by GMI id.

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
    """The placement of ``cfg.placement`` for ``cfg.gmi``'s layout; ``capacity``: the most
    float32 values one allreduce carries (shared-memory sizing), or on Ray a function that
    computes it where GMI 0 runs.

    Raises:
        ConfigError: the layout does not fit this machine (a backend it lacks, fewer GMIs than
            devices, a forced reduction the layout cannot run).
    """
    from gmi_drl.gmi.devices import discover
    from gmi_drl.gmi.layout import plan

    machine, g = discover(), cfg.gmi
    if cfg.placement == "local" and cfg.device == "cpu":  # a process per GMI, on these cores
        _warn_shared_cores(g.serving_gmis + g.trainer_gmis if cfg.is_async else g.num_gmis,
                           len(machine.cpu_cores))
    if cfg.is_async:
        from gmi_drl.runner.async_placement import AsyncPlacement

        return AsyncPlacement(cfg, machine, capacity)
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
    if cfg.placement == "serial":
        try:
            return SerialPlacement(cfg, layout, capacity)
        except ValueError as e:  # (auto chose, for this layout, a reduction serial cannot run)
            raise ConfigError(f"invalid config:\n  placement='serial': {e}; give "
                              "--gmi.reduction mpr, or --placement local") from None
    if cfg.placement == "ray":
        return RayPlacement(cfg, layout, capacity)
    return LocalPlacement(cfg, layout, machine, capacity)


def _notes(cfg: TrainConfig, num_gmis: int) -> str:
    """The lines every placement adds: the switch's mode, namespaces, identical weights."""
    g, text = cfg.gmi, ""
    if g.reduction == "switch":
        how = (f"stale-sync, staleness bound S = {g.staleness} (iSwitch §4.1)" if g.staleness
               else "synchronous")
        text += f"- gradients reduced through the aggregation switch at {g.switch_addr}, {how}\n"
    if g.reduction == "ps":
        text += f"- gradients reduced through the parameter server at {g.ps_addr}\n"
    if g.netns is not None:
        text += f"- GMI k in network namespace k of {g.netns}\n"
    return text


class SerialPlacement:
    """Every GMI as a thread of this process (one GMI: this thread), reducing in process.

    Raises (at construction):
        ValueError: a reduction that needs a process per GMI (mrr, har, ring).
    """

    def __init__(self, cfg: TrainConfig, layout: Layout, capacity: int) -> None:
        if layout.num_gmis > 1 and layout.reduction not in (Reduction.MPR, Reduction.SWITCH,
                                                            Reduction.PS):
            raise ValueError(f"serial placement reduces in process (mpr, switch, ps), not "
                             f"{layout.reduction.value}")
        self.cfg, self.layout, self.capacity = cfg, layout, capacity
        if cfg.profile.tool == "nsys":
            from gmi_drl.telemetry.profiler import NSYS_OPTIONS

            log.info("serial run: to capture it, start it under Nsight Systems yourself: nsys "
                     "profile %s gmi-drl train ...",
                     " ".join(f"--{k}={v}" for k, v in NSYS_OPTIONS.items()))

    def launch(self, target: str, payload: Any) -> list[Any]:
        from gmi_drl.comm.shm import ShmGroup

        lay, n = self.layout, self.layout.num_gmis
        made = [ShmGroup.create(size, self.capacity) for size in shm_group_sizes(lay)]
        gc = self.cfg.gmi
        group = ReductionGroup(tuple(g for g, _ in made), "", gc.service_addrs,
                               gc.switch_job or f"gmi-drl-serial-{id(self)}", gc.switch_token)
        try:
            if n == 1:
                return [run_target(target, GMIContext(0, lay, payload, group))]
            return self._threads(target, payload, group)
        finally:
            for _, owner in made:
                ShmGroup.destroy(owner)

    def _threads(self, target: str, payload: Any, group: ReductionGroup) -> list[Any]:
        n = self.layout.num_gmis
        results: list[Any] = [None] * n
        errors: dict[int, str] = {}
        done = [threading.Event() for _ in range(n)]

        def run(g: int) -> None:
            try:
                results[g] = run_target(target, GMIContext(g, self.layout, payload, group))
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
        return results

    def describe(self) -> str:
        n = self.layout.num_gmis
        where = "one GMI in this process" if n == 1 else f"{n} GMIs as threads of this process"
        return (f"- placement: serial: {where}, env workers in-process\n"
                + self.layout.describe() + _notes(self.cfg, n))


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

    def __init__(self, cfg: TrainConfig, layout: Layout, machine, capacity: int) -> None:
        self.cfg, self.layout, self.machine, self.capacity = cfg, layout, machine, capacity
        self.prefixes: dict[int, list[str]] = {}

    def launch(self, target: str, payload: Any) -> list[Any]:
        from gmi_drl.gmi.launcher import COMPILER, launch

        self.prefixes = _nsys_prefixes(self.cfg, payload.run.run_dir, self.machine)
        if self.layout.num_gmis == 1 and not self.prefixes:
            return [run_target(target, GMIContext(0, self.layout, payload))]
        g = self.cfg.gmi
        with relayed(payload.progress) as progress:
            return launch(target, self.layout, self.machine,
                          payload=dataclasses.replace(payload, progress=progress),
                          reducer_capacity=self.capacity,
                          service_addrs=g.service_addrs,
                          netns=g.netns_list, prefixes=self.prefixes,
                          job_id=g.switch_job, token=g.switch_token,
                          start_method=g.start_method,
                          preload=COMPILER if self.cfg.compile else (),
                          exit_timeout_s=600.0 if self.prefixes else 5.0)  # nsys writes at exit

    def describe(self) -> str:
        n = self.layout.num_gmis
        where = ("one GMI in this process" if n == 1 and not self.prefixes
                 else f"one process per GMI ({n}), {self._started()}")
        return (f"- placement: local: {where}\n" + self.layout.describe()
                + _notes(self.cfg, n))


    def _started(self) -> str:
        """How the GMI processes were started: a GMI under a profiler is always spawned."""
        n, profiled = self.layout.num_gmis, sorted(self.prefixes)
        if self.cfg.gmi.start_method == "spawn" or len(profiled) == n:
            return "spawned"
        if not profiled:
            return "forked by the fork server"
        return (f"forked by the fork server, GMI {', '.join(map(str, profiled))} spawned "
                "under the profiler")


class RayPlacement:
    """One Ray actor per GMI, on the cluster of ``ray.address``."""

    def __init__(self, cfg: TrainConfig, layout: Layout, capacity: int) -> None:
        self.cfg, self.layout, self.capacity = cfg, layout, capacity
        self._run = None

    def launch(self, target: str, payload: Any) -> list[Any]:
        from gmi_drl.cluster.ray_launcher import launch

        cfg, r = self.cfg, self.cfg.ray
        switch = cfg.gmi.switch_addrs[0] if cfg.gmi.reduction == "switch" else None
        printing = dataclasses.replace(payload, progress=printed_here(payload.progress))
        self._run = launch(target, self.layout, printing, address=r.address,
                           max_restarts=r.max_restarts, num_cpus_per_gmi=r.num_cpus_per_gmi,
                           placement_timeout_s=r.placement_timeout_s,
                           reducer_capacity=self.capacity, switch_addr=switch,
                           switch_job=cfg.gmi.switch_job, switch_token=cfg.gmi.switch_token,
                           runtime_envs=_nsight_runtime_envs(cfg, payload.run.run_dir,
                                                             self.layout.num_gmis),
                           on_restart=lambda error: _restarted(payload))
        return self._run.results

    def describe(self) -> str:
        from gmi_drl.cluster.membership import describe

        run = self._run
        return (run.layout.describe() + describe(run.layout, run.nodes, run.restarts)
                + _notes(self.cfg, self.layout.num_gmis))


def _restarted(payload):
    """The payload a failed Ray run restarts with: resumed from its latest checkpoint."""
    import dataclasses

    return dataclasses.replace(payload, progress=printed_here(payload.progress, warn=False),
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
