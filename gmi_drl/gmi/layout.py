"""GMI layouts and templates (GMI-DRL §5.1): which GMI runs which roles on which device.

``mpl`` (the GMI-to-device mapping list) is the paper's notation: ``[[0, 1, 2], [3, 4, 5]]`` puts
GMIs 0-2 on device 0 and 3-5 on device 1.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gmi_drl.comm.reduction import Reduction, select_reduction, why_not
from gmi_drl.gmi.backends import BackendKind, GMISpec, choose_backend
from gmi_drl.gmi.devices import Machine


class Template(str, enum.Enum):
    """Task-aware mapping templates (GMI-DRL §5.1, Fig. 6)."""

    SERVING = "serving"  # TCG: simulator + agent per GMI, no cross-GMI traffic per step
    SYNC_TRAINING = "sync_training"  # TCG_EX, "holistic GMI": simulator + agent + trainer
    ASYNC_TRAINING = "async_training"  # decoupled: serving GMIs and trainer GMIs, channels


ROLES = {Template.SERVING: ("simulator", "agent"),
         Template.SYNC_TRAINING: ("simulator", "agent", "trainer"),
         Template.ASYNC_TRAINING: ("simulator", "agent", "trainer")}
"""the roles a template's GMIs hold (async_training: each GMI holds the trainer role or the
other two; `gmi_drl.runner.async_template` says which)"""


_ALGORITHM_1 = {
    Reduction.MPR: "all GMIs share one device (Algorithm 1, line 2)",
    Reduction.HAR: "uneven GMIs per device, or more GMIs per device than devices (Algorithm 1, "
                   "lines 9-14)",
    Reduction.MRR: "even layout with GMIs per device <= devices (Algorithm 1, line 17)"}
_CHOSEN = {
    Reduction.RING: "one ring over all GMIs (gmi.reduction ring: the AllReduce baseline)",
    Reduction.SWITCH: "through the iSwitch aggregation switch (gmi.reduction switch)",
    Reduction.PS: "through a parameter server (gmi.reduction ps: the PS baseline)"}


@dataclass(frozen=True)
class Layout:
    """A placed run: the GMIs, their devices, the backend and the reduction, each with why."""

    mpl: tuple[tuple[int, ...], ...]
    specs: tuple[GMISpec, ...]
    template: Template
    backend: BackendKind
    backend_reason: str
    reduction: Reduction
    reduction_reason: str

    @property
    def num_gmis(self) -> int:
        return len(self.specs)

    def device_of(self, gmi_id: int) -> int:
        return next(d for d, gmis in enumerate(self.mpl) if gmi_id in gmis)

    def describe(self, reduction: bool = True) -> str:
        """Markdown lines for `summary.md`: template, layout, backend and (``reduction``) the
        reduction, with the reasons."""
        text = (f"- template: `{self.template.value}` (roles {', '.join(ROLES[self.template])})\n"
                f"- layout `mpl`: `{[list(g) for g in self.mpl]}`\n"
                f"- backend: `{self.backend.value}`: {self.backend_reason}\n")
        if reduction:
            how = (f"`{self.reduction.value}`: {self.reduction_reason}" if self.num_gmis > 1
                   else "none (one GMI)")
            text += f"- gradient reduction: {how}\n"
        return text


def resolve_reduction(choice: str, mpl) -> tuple[Reduction, str]:
    """``(reduction, why)`` for a ``gmi.reduction`` value: ``"auto"`` is Algorithm 1 on ``mpl``
    (`select_reduction`), any other value is taken as given once it fits the layout.

    Raises:
        ValueError: an unknown value, or a strategy the layout cannot run (`why_not`).
    """
    if choice == "auto":
        reduction = select_reduction(mpl)
        return reduction, _ALGORITHM_1[reduction]
    reduction = Reduction(choice)
    problem = why_not(reduction, mpl)
    if problem is not None:
        raise ValueError(problem)
    return reduction, _CHOSEN.get(reduction, f"chosen with gmi.reduction {reduction.value}")


def plan(num_gmis: int, machine: Machine, template: Template = Template.SYNC_TRAINING,
         num_devices: int | None = None, backend: str | None = None,
         memory_limit_bytes: int | None = None, reduction: str = "auto") -> Layout:
    """Place ``num_gmis`` GMIs evenly over the devices, packed per device.

    Args:
        num_gmis: GMIs in the run.
        machine: discovered devices.
        template: the mapping template.
        num_devices: devices to use (default: all GPUs, or one CPU "device"); on CPU a larger
            value emulates several devices: groups of processes, each on its part of the cores
            (shared where there are fewer cores than devices), as the tests do.
        backend: force a `BackendKind` value.
        memory_limit_bytes: per-GMI MPS pinned-memory limit.
        reduction: a `Reduction` value, or ``"auto"`` (`resolve_reduction`).

    Raises:
        ValueError: fewer GMIs than devices, a bad backend override, or a reduction the layout
            cannot run.
    """
    kind, reason = choose_backend(machine, template is not Template.SERVING, backend)
    devices = num_devices or max(1, len(machine.gpus))
    if num_gmis < devices:
        raise ValueError(f"num_gmis={num_gmis} < devices={devices}: every device needs a GMI")
    mpl, start = [], 0
    for d in range(devices):
        count = num_gmis // devices + (d < num_gmis % devices)
        mpl.append(tuple(range(start, start + count)))
        start += count
    specs = []
    for d, gmis in enumerate(mpl):
        for k, g in enumerate(gmis):
            mig = None
            if kind is BackendKind.MIG:
                insts = machine.gpus[d].mig_instances
                if k >= len(insts):
                    raise ValueError(f"device {d} has {len(insts)} MIG instances for "
                                     f"{len(gmis)} GMIs")
                mig = insts[k].uuid
            cores = None
            if kind is BackendKind.CPU and devices > 1:  # emulated devices: core sets
                cores = _even_part(_even_part(tuple(machine.cpu_cores), d, devices), k,
                                   len(gmis))
            specs.append(GMISpec(g, d, kind, 1.0 / len(gmis), memory_limit_bytes,
                                 ROLES[template], mig, cpu_cores=cores))
    mpl = tuple(mpl)
    return Layout(mpl, tuple(specs), template, kind, reason,
                  *resolve_reduction(reduction, mpl))


def plan_async(num_trainers: int, num_serving: int, machine: Machine,
               backend: str | None = None, trainer_share: float | None = None) -> Layout:
    """The ``async_training`` template's layout (GMI-DRL §5.1, Fig. 6(b)): trainer GMIs
    ``0 .. num_trainers - 1`` and serving GMIs after them, each role on its own device set.

    On GPUs: with two or more, the trainers get the first ``trainer_share`` of them (default:
    in proportion to the GMI counts; at least one each side) and the serving GMIs the rest; one
    GPU is shared by every GMI (MPS splits it). On the CPU: with ``trainer_share``, the trainers
    get that share of the cores (at least one, leaving one) and the serving GMIs the rest, each
    role's GMIs splitting its set evenly; without it, every GMI gets an even share of the
    machine's cores (the OS balances the roles' very unequal demands better than a fixed split
    on a few cores: `docs/async.md`).

    Raises:
        ValueError: counts below 1, a ``trainer_share`` outside (0, 1), a bad backend.
    """
    if num_trainers < 1 or num_serving < 1:
        raise ValueError(f"{num_trainers=} and {num_serving=} must both be >= 1")
    if trainer_share is not None and not 0 < trainer_share < 1:
        raise ValueError(f"trainer_share={trainer_share} must be in (0, 1)")
    kind, reason = choose_backend(machine, True, backend)
    trainers = tuple(range(num_trainers))
    serving = tuple(range(num_trainers, num_trainers + num_serving))
    n = num_trainers + num_serving
    share = trainer_share if trainer_share is not None else num_trainers / n
    specs: list[GMISpec] = []
    if kind is BackendKind.CPU:
        cores = machine.cpu_cores
        if trainer_share is None or len(cores) < 2:
            mpl = (trainers + serving,)
            specs = [GMISpec(g, 0, kind, 1.0 / n, None, _async_roles(g, num_trainers))
                     for g in range(n)]
        else:
            k = min(len(cores) - 1, max(1, round(len(cores) * share)))
            mpl = (trainers, serving)
            for d, (gmis, mine) in enumerate(((trainers, cores[:k]), (serving, cores[k:]))):
                for i, g in enumerate(gmis):
                    specs.append(GMISpec(g, d, kind, 1.0 / len(gmis), None,
                                         _async_roles(g, num_trainers),
                                         cpu_cores=_even_part(mine, i, len(gmis))))
            reason += (f"; trainer GMIs on cores {list(cores[:k])}, serving GMIs on "
                       f"{list(cores[k:])} (gmi.trainer_share {trainer_share})")
    else:
        gpus = len(machine.gpus)
        devices: list[list[int]] = [[] for _ in range(gpus)]
        if gpus < 2:
            devices[0] = list(trainers + serving)
        else:
            k = min(gpus - 1, num_trainers, max(1, round(gpus * share)))
            m = min(gpus - k, num_serving)  # GPUs beyond k + m hold no GMI and are left out
            for j, g in enumerate(trainers):
                devices[j % k].append(g)
            for j, g in enumerate(serving):
                devices[k + j % m].append(g)
            devices = devices[:k + m]
            reason += (f"; trainer GMIs on GPUs 0..{k - 1}, serving GMIs on GPUs "
                       f"{k}..{k + m - 1}")
        mpl = tuple(tuple(gmis) for gmis in devices)
        specs = sorted((GMISpec(g, d, kind, 1.0 / len(gmis), None, _async_roles(g, num_trainers))
                        for d, gmis in enumerate(mpl) for g in gmis), key=lambda x: x.gmi_id)
    return Layout(tuple(mpl), tuple(specs), Template.ASYNC_TRAINING, kind, reason,
                  Reduction.MPR, "the trainer GMIs reduce in their own layout")


def _async_roles(gmi_id: int, num_trainers: int) -> tuple[str, ...]:
    return ("trainer",) if gmi_id < num_trainers else ("simulator", "agent")


def _even_part(cores: tuple[int, ...], i: int, parts: int) -> tuple[int, ...]:
    """Part ``i`` of ``parts`` of ``cores`` (parts share cores when there are fewer cores)."""
    n = len(cores)
    if parts >= n:
        return (cores[i % n],)
    return tuple(cores[i * n // parts:(i + 1) * n // parts])
