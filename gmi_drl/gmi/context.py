"""What a GMI's target receives, from whichever launcher started it, and its gradient reducer.

Every placement (serial threads, local processes, Ray actors) builds the same `GMIContext`: the
GMI's id, the run's `Layout`, the caller's payload, and the `ReductionGroup` handle through which
the GMI joins the run's reduction. `make_reducer` builds the reducer of ``layout.reduction`` from
one table (`REDUCERS`), the same in every placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gmi_drl.comm.reduction import Reduction
from gmi_drl.gmi.backends import BackendKind
from gmi_drl.gmi.layout import Layout


@dataclass(frozen=True)
class ReductionGroup:
    """The picklable handle of a run's reduction group, made by the launcher before the GMIs
    start (what each member needs to join).

    Attributes:
        shm_groups: shared-memory blocks (`gmi_drl.comm.shm.ShmGroup`): one of every GMI for
            ``mpr``, one per device for ``har`` (`shm_group_sizes`); none otherwise.
        init_method: torch.distributed rendezvous of ``mrr``, ``har`` and ``ring``.
        service_addrs: ``switch`` / ``ps``: the ``HOST:PORT`` GMI k aggregates through (its
            switch port, or the parameter server) at index k.
        job_id: the run's name at the switch (the same on every GMI).
        token: the switch's shared secret (``--token`` of `gmi-drl switch serve`).
        staleness: ``ps``: the staleness bound S of an asynchronous parameter server group
            (``gmi_drl.comm.ps.AsyncPSClient``); 0: the synchronous one (`PSReducer`).
    """

    shm_groups: tuple = ()
    init_method: str = ""
    service_addrs: tuple[str, ...] = ()
    job_id: str = "gmi-drl"
    token: str = ""
    staleness: int = 0


def shm_group_sizes(layout: Layout) -> list[int]:
    """Members of each shared-memory block ``layout``'s reduction needs (``[]``: none)."""
    if layout.num_gmis == 1:
        return []
    if layout.reduction is Reduction.MPR:
        return [layout.num_gmis]
    if layout.reduction is Reduction.HAR:
        return [len(gmis) for gmis in layout.mpl]
    return []


def dist_backend(layout: Layout, flat_ring: bool = False) -> str:
    """The torch.distributed backend of a run's reduction groups, by the tensors' device.

    CPU tensors always go through gloo: a learner on the CPU (``--device cpu``) under a CUDA
    backend, and HAR's host-memory device sums. CUDA tensors go through NCCL only where no two
    members of a group share a GPU (NCCL refuses a communicator with a duplicate GPU): MRR's
    rings and HAR's leaders hold one GMI per device, a flat ring (``flat_ring``) only when every
    device holds one GMI; otherwise gloo reduces them too (it copies through the host).
    """
    if layout.backend is BackendKind.CPU:
        return "gloo"
    if flat_ring and any(len(gmis) > 1 for gmis in layout.mpl):
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def _waits(timeout_s: float | None) -> dict:
    """The reducer's own default wait unless ``timeout_s`` is given."""
    return {} if timeout_s is None else {"timeout_s": timeout_s}


def _mpr(g: int, layout: Layout, group: ReductionGroup, timeout_s: float | None = None):
    from gmi_drl.comm.shm import SharedMemoryReducer
    return SharedMemoryReducer(group.shm_groups[0], g, **_waits(timeout_s))


def _mrr(g: int, layout: Layout, group: ReductionGroup, timeout_s: float | None = None):
    from gmi_drl.comm.ring import RingReducer
    return RingReducer(g, layout.num_gmis, group.init_method, dist_backend(layout),
                       mpl=layout.mpl, **_waits(timeout_s))


def _har(g: int, layout: Layout, group: ReductionGroup, timeout_s: float | None = None):
    from gmi_drl.comm.hierarchical import HierarchicalReducer
    return HierarchicalReducer(g, layout.mpl, group.shm_groups[layout.device_of(g)],
                               group.init_method, dist_backend(layout), **_waits(timeout_s))


def _ring(g: int, layout: Layout, group: ReductionGroup, timeout_s: float | None = None):
    from gmi_drl.comm.ring import RingReducer
    return RingReducer(g, layout.num_gmis, group.init_method,
                       dist_backend(layout, flat_ring=True), **_waits(timeout_s))


def _switch(g: int, layout: Layout, group: ReductionGroup, timeout_s: float | None = None,
            threshold: tuple[int, int] | None = None):
    if threshold is not None:  # Async iSwitch (H, S)
        from gmi_drl.comm.switch.threshold import ThresholdReducer
        return ThresholdReducer(group.service_addrs[g], g, layout.num_gmis, *threshold,
                                job_id=group.job_id, token=group.token, **_waits(timeout_s))
    from gmi_drl.comm.switch.client import SwitchReducer
    return SwitchReducer(group.service_addrs[g], worker_id=g, num_workers=layout.num_gmis,
                         job_id=group.job_id, token=group.token, **_waits(timeout_s))


def _ps(g: int, layout: Layout, group: ReductionGroup, timeout_s: float | None = None):
    from gmi_drl.comm.ps import AsyncPSClient, PSReducer
    if group.staleness:
        return AsyncPSClient(group.service_addrs[g], g, layout.num_gmis, group.staleness,
                             **_waits(timeout_s))
    return PSReducer(group.service_addrs[g], g, layout.num_gmis, **_waits(timeout_s))


REDUCERS: dict[Reduction, Callable[..., Any]] = {
    Reduction.MPR: _mpr, Reduction.MRR: _mrr, Reduction.HAR: _har, Reduction.RING: _ring,
    Reduction.SWITCH: _switch, Reduction.PS: _ps}
"""``{reduction: builder(gmi_id, layout, group, timeout_s=None) -> GradReducer}``;
``timeout_s`` (seconds) bounds how long a member waits for the slowest one inside a reduction
before the group counts as broken (``None``: the reducer's default, 60 s; the parameter
server's 600 s)"""


@dataclass
class GMIContext:
    """What a GMI's target receives.

    Attributes:
        gmi_id: this GMI. layout: the whole run's layout (its ``reduction`` included).
        payload: the caller's argument. reduction: the handle of the run's reduction group.
    """

    gmi_id: int
    layout: Layout
    payload: Any
    reduction: ReductionGroup = field(default_factory=ReductionGroup)
    _reducer: Any = field(default=None, init=False, repr=False)

    def make_reducer(self, threshold: tuple[int, int] | None = None):
        """This GMI's `GradReducer` (built once; a collective: every GMI calls it): the identity
        for one GMI, else `REDUCERS` of ``layout.reduction``. ``threshold``: Async iSwitch's
        ``(H, S)`` (`gmi_drl.comm.switch.threshold.ThresholdReducer`; switch reduction only)."""
        if self._reducer is None:
            if self.layout.num_gmis == 1:
                from gmi_drl.comm.reducer import IdentityReducer
                self._reducer = IdentityReducer()
            else:
                extra = {} if threshold is None else {"threshold": threshold}
                self._reducer = REDUCERS[self.layout.reduction](self.gmi_id, self.layout,
                                                               self.reduction, **extra)
        return self._reducer

    def close(self) -> None:
        """Leave the reduction group, if this GMI joined it. Idempotent."""
        if self._reducer is not None:
            self._reducer.close()
            self._reducer = None
