"""Resource budgets of independent GMIs: the runs of a sweep and the serving GMIs that evaluate
them (`gmi_drl.sweep`), each GMI a run of its own that shares a device with the others.

A GMI's budget is what its backend enforces (GMI-DRL §3): on a GPU under MPS, its active-thread
percentage (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the share of the SMs its kernels may use) and
its pinned device-memory limit (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``); on a GPU with MIG, the
existing MIG instance it runs on (never created, destroyed or reconfigured here); on the CPU, the
set of cores it is pinned to (``os.sched_setaffinity``). The planner's defaults are an even share
of each device; a budget whose sum does not fit its device is refused before any GMI starts.

Pure functions of a `gmi_drl.gmi.devices.Machine`: the GPU paths are planned (and tested) from a
parsed device listing as well as from NVML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gmi_drl.config import ConfigError
from gmi_drl.gmi.backends import BackendKind, GMISpec
from gmi_drl.gmi.devices import Gpu, Machine, MigInstance
from gmi_drl.gmi.layout import ROLES, Layout, Template, plan


@dataclass(frozen=True)
class Budget:
    """What each GMI of a sweep may use (``--budget.*``); ``None``: the planner's even share."""

    threads_pct: int | None = None
    """MPS active-thread percentage of each GMI, 1-100 (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE);
    default: an even share of its GPU (100 / its GPU's GMIs, rounded down)"""
    mem_mib: int | None = None
    """MPS pinned device-memory limit of each GMI, MiB (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT);
    default: an even share of its GPU's memory (no limit where NVML does not say it)"""
    cores: int | None = None
    """CPU cores each GMI is pinned to (a GMI on the CPU); default: an even share of this
    machine's cores (one each, shared in turn, with more GMIs than cores); 0: not pinned"""


def even_percentage(gmis_on_device: int) -> int:
    """The active-thread percentage of each of ``gmis_on_device`` GMIs sharing a GPU evenly."""
    return max(1, 100 // gmis_on_device)


def even_memory_mib(memory_bytes: int, gmis_on_device: int) -> int | None:
    """Each GMI's share of a GPU's ``memory_bytes``, MiB (``None``: the size is unknown)."""
    return memory_bytes // 2**20 // gmis_on_device if memory_bytes else None


def core_sets(cores: tuple[int, ...], n: int, per: int | None) -> list[tuple[int, ...]]:
    """The cores each of ``n`` GMIs is pinned to: consecutive blocks of ``per`` cores
    (``None``: ``len(cores) // n``; with more GMIs than cores, one core each, in turn);
    ``per == 0``: none pinned (``()`` each).

    Raises:
        ConfigError: ``per`` is negative, or ``n * per`` is more than ``cores``.
    """
    if per is not None and per < 0:
        raise ConfigError(f"--budget.cores {per}: give cores per GMI >= 0 (0: not pinned)")
    if per == 0:
        return [() for _ in range(n)]
    if per is None:
        per = max(1, len(cores) // n)
        return [tuple(cores[(g * per) % len(cores):(g * per) % len(cores) + per])
                for g in range(n)]
    if n * per > len(cores):
        raise ConfigError(f"budget does not fit the CPU: {n} GMIs x {per} cores = {n * per} "
                          f"cores > the {len(cores)} this process may run on {list(cores)}")
    return [tuple(cores[g * per:(g + 1) * per]) for g in range(n)]


def assign_mig(n: int, gpus: tuple[Gpu, ...]) -> list[tuple[int, MigInstance]]:
    """``(device, instance)`` of each of ``n`` GMIs on the GPUs' existing MIG instances, taken
    in turn over the GPUs (instance 0 of every GPU, then instance 1, ...), grouped by device in
    GMI order.

    Raises:
        ConfigError: fewer instances than GMIs (their count per GPU named).
    """
    slots = [(d, m) for k in range(max((len(g.mig_instances) for g in gpus), default=0))
             for d, g in enumerate(gpus) if k < len(g.mig_instances)
             for m in (g.mig_instances[k],)]
    if n > len(slots):
        have = ", ".join(f"GPU {g.index}: {len(g.mig_instances)}" for g in gpus)
        raise ConfigError(f"{n} GMIs for {len(slots)} MIG instances ({have}): gmi-drl never "
                          "creates MIG instances; make more with nvidia-smi mig, or run fewer "
                          "GMIs")
    return sorted(slots[:n], key=lambda s: s[0])


def mig_off(gpus: tuple[Gpu, ...]) -> list[Gpu]:
    """The GPUs without MIG enabled with instances."""
    return [g for g in gpus if not (g.mig_enabled and g.mig_instances)]


def plan_runs(n: int, machine: Machine, template: Template = Template.SYNC_TRAINING,
              budget: Budget = Budget(), backend: str | None = None) -> Layout:
    """The layout of ``n`` independent GMIs (runs, or their serving GMIs) with their budgets:
    on GPUs that all have MIG enabled with instances, one instance each (`assign_mig`);
    otherwise, where no GPU has MIG on, MPS, the GMIs spread evenly over the GPUs
    (at most one GPU per GMI); on the CPU, core sets (`core_sets`). ``backend`` forces a
    `BackendKind` value (``"cpu"``: core sets on a machine with GPUs too).

    Raises:
        ConfigError: a budget that does not fit its device (`check_fits`), more GMIs than MIG
            instances, a budget the backend does not take (MPS budgets on MIG, time slicing
            or the CPU), a backend this machine lacks, or GMIs on whole GPUs (MPS, time
            slicing) where one of those GPUs has MIG on (it runs no CUDA work).
    """
    gpus = machine.gpus
    use_mig = (backend == BackendKind.MIG.value or
               (backend is None and gpus and not mig_off(gpus)))
    if use_mig and gpus:
        if budget.threads_pct is not None or budget.mem_mib is not None:
            raise ConfigError("--budget.threads-pct and --budget.mem-mib are MPS budgets; on MIG "
                              "each GMI's instance is its budget: drop them, or give "
                              "--gmi.backend cuda_mps")
        layout = _mig_layout(n, gpus, template)
    else:
        if backend is None and gpus:
            backend = BackendKind.CUDA_MPS.value
        try:
            on_gpu = gpus and backend != BackendKind.CPU.value
            layout = plan(n, machine, template, num_devices=min(n, len(gpus)) if on_gpu else 1,
                          backend=backend)
        except ValueError as e:
            raise ConfigError(f"invalid config:\n  gmi: {e}") from None
        if layout.backend in (BackendKind.CUDA_MPS, BackendKind.CUDA_SHARED):
            _refuse_whole_gpus_with_mig_on(gpus[:len(layout.mpl)])  # (the GPUs it uses)
        if backend == BackendKind.CUDA_MPS.value and layout.backend_reason.startswith("forced"):
            layout = dataclasses.replace(layout, backend_reason=_mps_reason(gpus))
    mps_budget = budget.threads_pct is not None or budget.mem_mib is not None
    if layout.backend is BackendKind.CUDA_SHARED and mps_budget:
        raise ConfigError("--budget.threads-pct and --budget.mem-mib are MPS budgets: drop them, "
                          "or leave --gmi.backend to the planner (cuda_mps)")
    if layout.backend is BackendKind.CPU and mps_budget:
        raise ConfigError("--budget.threads-pct and --budget.mem-mib are MPS budgets of GMIs on "
                          f"a GPU; these GMIs are CPU core sets ({layout.backend_reason}): give "
                          "--budget.cores")
    if layout.backend is not BackendKind.CPU and budget.cores is not None:
        raise ConfigError(f"--budget.cores are core sets of GMIs on the CPU; these GMIs run on "
                          f"GPUs ({layout.backend.value}): drop --budget.cores, or give "
                          "--device cpu")
    layout = with_budget(layout, machine, budget)
    check_fits(layout, machine)
    return layout


def _refuse_whole_gpus_with_mig_on(gpus: tuple[Gpu, ...]) -> None:
    """A GPU with MIG on runs CUDA work on its instances only, so GMIs on the whole GPU (MPS
    or time slicing) would fail where they start: refused, with what to do.

    Raises:
        ConfigError: a GPU of ``gpus`` has MIG on.
    """
    on = [g for g in gpus if g.mig_enabled]
    if not on:
        return
    named = ", ".join(f"GPU {g.index} ({len(g.mig_instances)} instances)" for g in on)
    fix = ("--gmi.backend mig places the GMIs on the existing instances"
           if any(g.mig_instances for g in on) else
           "its administrator creates MIG instances (nvidia-smi mig -cgi ... -C)")
    raise ConfigError(f"MIG is on on {named}: a GPU with MIG on runs CUDA work on its "
                      f"instances only, not GMIs on the whole GPU; {fix}, or its "
                      "administrator turns MIG off (nvidia-smi -i N -mig 0)")


def _mps_reason(gpus: tuple[Gpu, ...]) -> str:
    off = ", ".join(f"GPU {g.index} ({g.name})" for g in mig_off(gpus))
    return (f"MIG is off (no MIG instances) on {off}: the GMIs share each GPU through MPS, each "
            "with its active-thread percentage and pinned device-memory limit")


def _mig_layout(n: int, gpus: tuple[Gpu, ...], template: Template) -> Layout:
    from gmi_drl.comm.reduction import Reduction

    slots = assign_mig(n, gpus)  # (a GPU without instances, forced: no GMI, an empty group)
    mpl = tuple(tuple(g for g, (d, _) in enumerate(slots) if d == dev)
                for dev in range(max(d for d, _ in slots) + 1))
    specs = tuple(GMISpec(g, d, BackendKind.MIG, 1.0, None, ROLES[template], m.uuid)
                  for g, (d, m) in enumerate(slots))
    used = ", ".join(f"GMI {g}: GPU {d} {m.profile} {m.uuid}" for g, (d, m) in enumerate(slots))
    return Layout(mpl, specs, template, BackendKind.MIG,
                  f"MIG is on: one existing MIG instance per GMI ({used})",
                  Reduction.MPR, "independent GMIs: no reduction")


def with_budget(layout: Layout, machine: Machine, budget: Budget) -> Layout:
    """``layout`` with each GMI's budget: MPS active-thread share and pinned-memory limit (the
    even shares where ``budget`` gives none), or CPU cores (`core_sets`); MIG and plain time
    slicing: as it is."""
    if layout.backend in (BackendKind.MIG, BackendKind.CUDA_SHARED):
        return layout
    specs = []
    if layout.backend is BackendKind.CPU:
        cores = core_sets(machine.cpu_cores, layout.num_gmis, budget.cores)
        specs = [dataclasses.replace(s, cpu_cores=cores[s.gmi_id]) for s in layout.specs]
    else:
        for s in layout.specs:
            k = len(layout.mpl[s.device])
            pct = budget.threads_pct if budget.threads_pct is not None else even_percentage(k)
            mib = (budget.mem_mib if budget.mem_mib is not None
                   else even_memory_mib(machine.gpus[s.device].memory_bytes, k))
            limit = None if mib is None else mib * 2**20
            specs.append(dataclasses.replace(s, compute_share=pct / 100,
                                             memory_limit_bytes=limit))
    return dataclasses.replace(layout, specs=tuple(specs))


def check_fits(layout: Layout, machine: Machine) -> None:
    """Refuse GMI budgets whose sum over a GPU's GMIs exceeds that GPU: active-thread
    percentages over 100, pinned-memory limits over its memory (where NVML says it).

    Raises:
        ConfigError: naming the GPU, the GMIs and the sum.
    """
    if layout.backend is not BackendKind.CUDA_MPS:
        return
    for d, gmis in enumerate(layout.mpl):
        gpu, specs = machine.gpus[d], [layout.specs[g] for g in gmis]
        pcts = [round(s.compute_share * 100) for s in specs]
        if not all(1 <= p <= 100 for p in pcts):
            raise ConfigError(f"--budget.threads-pct {pcts[0]}: give a percentage in 1-100")
        mibs = [s.memory_limit_bytes // 2**20 for s in specs if s.memory_limit_bytes is not None]
        if not all(m >= 1 for m in mibs):
            raise ConfigError(f"--budget.mem-mib {mibs[0]}: give a limit of at least 1 MiB (or "
                              "leave it out: an even share of the GPU's memory)")
        if sum(pcts) > 100:
            raise ConfigError(f"budget does not fit GPU {gpu.index} ({gpu.name}): {len(specs)} "
                              f"GMIs' active-thread percentages sum to {sum(pcts)}% > 100%")
        limits = [s.memory_limit_bytes for s in specs if s.memory_limit_bytes is not None]
        if gpu.memory_bytes and sum(limits) > gpu.memory_bytes:
            raise ConfigError(f"budget does not fit GPU {gpu.index} ({gpu.name}): {len(specs)} "
                              f"GMIs' pinned-memory limits sum to {sum(limits) // 2**20:,} MiB "
                              f"> its {gpu.memory_bytes // 2**20:,} MiB")


def describe(layout: Layout, machine: Machine) -> str:
    """Markdown lines: each device's GMIs and their budgets."""
    lines = []
    for d, gmis in enumerate(layout.mpl):
        specs = [layout.specs[g] for g in gmis]
        if layout.backend is BackendKind.CPU:
            cores = "; ".join(f"GMI {s.gmi_id}: " + (f"cores {list(s.cpu_cores)}" if s.cpu_cores
                                                     else "not pinned") for s in specs)
            lines.append(f"- budget on the CPU: {cores}")
        elif layout.backend is BackendKind.MIG:
            lines.append(f"- budget on GPU {machine.gpus[d].index}: a MIG instance per GMI")
        else:
            pct = [round(s.compute_share * 100) for s in specs]
            mem = [s.memory_limit_bytes // 2**20 for s in specs if s.memory_limit_bytes]
            text = (f"- budget on GPU {machine.gpus[d].index}: {len(specs)} GMIs, active threads "
                    f"{'/'.join(f'{p}%' for p in pct)} (sum {sum(pct)}%)")
            text += (f", pinned memory {'/'.join(f'{m:,}' for m in mem)} MiB (sum {sum(mem):,} "
                     f"of {machine.gpus[d].memory_bytes // 2**20:,} MiB)" if mem
                     else ", no pinned-memory limit")
            lines.append(text)
    return "\n".join(lines) + "\n"
