"""The Ray launcher: the GMIs of a layout as Ray actors, on one machine or many.

One attempt of a run:

1. a placement group with one bundle per GMI (`placement.bundles`: CPUs, a fractional GPU for
   CUDA backends), packed onto as few nodes as fit them; waiting is bounded;
2. one `NodeAgent` on each node the placement group used, and beside them one `GMIActor` per
   bundle, its ``runtime_env`` carrying the GMI backend's variables (set by Ray before CUDA
   initialises) and any extra per-GMI ``runtime_env`` (e.g. a profiler's);
3. node membership from Ray: each actor reports its node; GMIs are grouped by node
   (`membership.reduction_layout`: MPR on one node, HAR across nodes);
4. each agent makes its node's shared-memory block (and starts its MPS daemon for ``cuda_mps``);
   the gloo rendezvous of the node leaders is ``tcp://<GMI 0's node IP>:<a port GMI 0 picked>``;
5. every actor runs the target (`gmi_drl.gmi.launcher.run_target`, as local GMI processes do);
6. teardown, always (success, failure, Ctrl-C): MPS clients' GPU work is ended through the MPS
   control, actors are killed and awaited, agents unlink the blocks and quit MPS, the placement
   group is removed.

Failure policy. The first GMI that dies or raises stops the attempt; the error (`GMIError`) names
the GMI, its node id and IP, and the cause (the traceback when the target raised). With
``max_restarts > 0`` the whole group is started again, ``on_restart`` supplying the new payload
(training resumes from the last checkpoint). The whole group, not the one GMI: reduction groups
are collectives of fixed membership (gloo process group, shared-memory barrier epochs), so a lone
replacement could not join the survivors mid-collective, and its weights would stand at another
update than theirs. Restarting all GMIs from one (atomic, rank-0) checkpoint puts every GMI at the
same update with identical weights in a fresh group, which synchronous training needs; the cost is
the updates since that checkpoint. Ray's own actor restarts are off for the same reason.

A hang inside a collective ends by the reducers' own timeouts (60 s), which raise in the GMIs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

import gmi_drl
from gmi_drl.cluster.gmi_actor import GMIActor
from gmi_drl.cluster.membership import NodeInfo, reduction_layout
from gmi_drl.cluster.node_agent import NodeAgent
from gmi_drl.cluster.placement import STRATEGY, actor_env, actor_resources, bundles, runtime_env
from gmi_drl.comm.reduction import Reduction
from gmi_drl.gmi.backends import BackendKind
from gmi_drl.gmi.context import GMIContext, ReductionGroup
from gmi_drl.errors import LOG_FILE_ONLY, exception_line
from gmi_drl.gmi.launcher import GMIError, signals_ignored
from gmi_drl.gmi.layout import Layout

log = logging.getLogger(__name__)

TEARDOWN_TIMEOUT_S = 30.0
"""bound of each teardown step (MPS control, actor deaths, agent clean-up)"""
LOCAL_SYSTEM_CONFIG = {"worker_niceness": 0}
"""Ray's system config of the local instance a run starts for itself: Ray starts its workers at
nice 15, but there the GMIs are the work, so they run at the priority of the command."""


class PlacementError(GMIError):
    """Ray could not place or start the GMIs in time (too few resources in the cluster)."""


class RayRun(NamedTuple):
    """What `launch` returns."""

    results: list
    """what each GMI's target returned, by gmi_id"""
    layout: Layout
    """the reduction layout of the last attempt (`mpl` per Ray node, MPR or HAR)"""
    nodes: tuple[NodeInfo, ...]
    """each GMI's node in the last attempt, by gmi_id"""
    restarts: int
    """times the GMI group was restarted after a failure"""


def launch(target: str, layout: Layout, payload: Any = None, *, address: str | None = None,
           max_restarts: int = 0, num_cpus_per_gmi: float = 1.0,
           placement_timeout_s: float = 120.0,
           reducer_capacity: int | Callable[[], int] = 1 << 20,
           switch_addr: str | None = None, runtime_envs: Sequence[dict] | None = None,
           on_restart: Callable[[GMIError], Any] | None = None,
           rendezvous: bool = False, switch_job: str | None = None,
           switch_token: str = "", reduction_note: str | None = None,
           ps_addr: str | None = None, staleness: int = 0) -> RayRun:
    """Run ``target(ctx)`` in one Ray actor per GMI of ``layout``; blocks until all returned.

    Args:
        target: ``"package.module:function"`` taking a `GMIContext`, importable on every node.
        layout: from `gmi_drl.gmi.layout.plan` (backend, GMIs per device); its reduction is
            ``switch`` or ``ps``, or replanned by node (`membership.reduction_layout`).
        payload: a picklable argument every GMI receives.
        address: ``"auto"`` or ``HOST:PORT`` of a running cluster; ``None`` starts a local Ray
            instance for this call (with at least one logical CPU per GMI bundle). A process
            already connected to Ray keeps its connection.
        max_restarts: times the whole GMI group is started again after a GMI failed (not after
            a failure a restart would repeat: `NOT_RESTARTED`).
        num_cpus_per_gmi: logical CPUs each GMI's bundle reserves.
        placement_timeout_s: how long Ray may take to place and start the GMIs, seconds.
        reducer_capacity: most float32 values one `allreduce_` may carry (shared-memory sizing),
            or a picklable function that says so, called on GMI 0's node only where GMIs share
            memory (it may build the task, whose dependencies the driver need not have).
        switch_addr: with the ``switch`` reduction, the aggregation switch's ``HOST:PORT``.
        ps_addr, staleness: with the ``ps`` reduction, the parameter server's ``HOST:PORT`` and
            the staleness bound S (> 0: Async PS, iSwitch §6.2; 0: the synchronous PS).
        switch_job, switch_token: the run's job id at the switch (``None``: a new one per
            attempt) and the switch's shared secret.
        runtime_envs: per GMI, a Ray ``runtime_env`` merged into the actor's (e.g. a profiler's
            ``{"nsight": ...}``); its ``env_vars`` must not set the backend's variables.
        on_restart: called with the failure before each restart; returns the payload of the next
            attempt (``None``: keep the payload).
        rendezvous: always give the GMIs ``tcp://<GMI 0's node IP>:<a port GMI 0 picked>`` as
            ``ctx.reduction.init_method`` (HAR gets it anyway): what GMI 0 listens on and the
            others connect to (the async template's bridge).
        reduction_note: what the GMIs reduce through, for the placement's log line, where
            ``target`` does not use the layout's reduction (the async template's trainers).

    Raises:
        GMIError: a GMI died or raised (its id, node and cause in the message) and no restart was
            left. PlacementError: the cluster cannot hold the bundles within the timeout.
        ValueError: bad ``runtime_envs`` or ``num_cpus_per_gmi``; a switch (parameter server)
            address without the ``switch`` (``ps``) reduction, or the reverse.
    """
    for kind, addr in ((Reduction.SWITCH, switch_addr), (Reduction.PS, ps_addr)):
        if (layout.reduction is kind) != (addr is not None):
            raise ValueError(f"{kind.value}_addr={addr!r} with reduction "
                             f"{layout.reduction.value!r}: give an address exactly for "
                             f"{kind.value!r}")
    if runtime_envs is not None and len(runtime_envs) != layout.num_gmis:
        raise ValueError(f"{len(runtime_envs)} runtime_envs for {layout.num_gmis} GMIs")
    local_cpus = max(os.cpu_count() or 1, math.ceil(layout.num_gmis * num_cpus_per_gmi))
    restarts = 0
    with _connected(address, local_cpus):
        while True:
            try:
                results, reduction, nodes = _attempt(
                    target, layout, payload, num_cpus_per_gmi, placement_timeout_s,
                    reducer_capacity, switch_addr or ps_addr, runtime_envs, rendezvous,
                    (switch_job, switch_token), reduction_note, staleness)
                return RayRun(results, reduction, nodes, restarts)
            except PlacementError:
                raise
            except GMIError as e:
                if restarts >= max_restarts or e.exception.startswith(NOT_RESTARTED):
                    if restarts:
                        raise GMIError(f"{e.summary} (after {restarts} restart(s))",
                                       e.details, e.exception) from None
                    raise
                restarts += 1
                log.warning("%s; restarting all %d GMIs (restart %d of %d)",
                            e.summary.removesuffix(STOPPED), layout.num_gmis, restarts,
                            max_restarts)
                log.info("what failed:\n%s", e.details, extra=LOG_FILE_ONLY)
                if on_restart is not None:
                    payload = on_restart(e)


NOT_RESTARTED = ("TrainingDiverged", "CheckpointError")
"""failures a restart from the last checkpoint would repeat: weights gone NaN, a checkpoint
that does not fit the run"""

CONNECT_TIMEOUT_S = 10.0
"""how long a HOST:PORT Ray address may take to accept a connection"""


def _join(address: str) -> None:
    """``ray.init(address)``, where a cluster that is not there is a `PlacementError` in one
    line (``ray.init`` itself would retry a silent HOST:PORT for minutes).

    Raises:
        PlacementError: nothing accepts connections at ``address``, or Ray refuses to join.
    """
    import socket

    how = ("start one with `ray start --head` on this node, give the address of one that runs "
           "(--ray.address HOST:PORT; a resumed run keeps the address it was given last), or "
           "--ray.address None for a Ray instance of this run's own")
    if address != "auto":
        host, port = _host_port(address)
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as e:
            raise PlacementError(f"no Ray cluster at {address} ({e.strerror or e}); {how}",
                                 "", "") from None
    try:
        ray.init(address=address)
    except (ConnectionError, RuntimeError, TimeoutError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        first = first.replace("`--address` flag", "--ray.address")  # Ray's flag, not ours
        raise PlacementError(f"could not join the Ray cluster at {address}: {first}; {how}",
                             "", "") from None


@contextlib.contextmanager
def _keeping_sigterm():
    """The caller's own SIGTERM handler kept across the block: ``ray.init`` installs one in a
    driver's main thread (and keeps it after ``ray.shutdown``), which would exit at once where
    ``gmi-drl train`` stops the run as Ctrl-C does (its GMIs, a resume hint, exit 143). A caller
    without a Python handler keeps Ray's (it exits through ``sys.exit``, running ``finally``
    blocks, where the default would kill the process outright)."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(handler):
            signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def _connected(address: str | None, local_cpus: int):
    if ray.is_initialized():
        yield
        return
    with _keeping_sigterm():
        if address is None:
            # a local instance's processes join this process group; started with a hangup
            # ignored (which stays so across their exec), they outlive one, and the controller
            # stops the run and shuts them down as after Ctrl-C (which they block already)
            with signals_ignored(signal.SIGHUP):
                ray.init(address="local", num_cpus=local_cpus, include_dashboard=False,
                         _system_config=LOCAL_SYSTEM_CONFIG)
        else:
            _join(address)
    try:
        yield
    finally:
        ray.shutdown()


def _attempt(target, layout, payload, num_cpus_per_gmi, placement_timeout_s, reducer_capacity,
             service_addr, runtime_envs, rendezvous=False, job=(None, ""), reduction_note=None,
             staleness=0):
    name = f"gmi-drl-{uuid.uuid4().hex[:8]}"
    mps_dir = (os.path.join(tempfile.gettempdir(), f"{name}-mps")
               if layout.backend is BackendKind.CUDA_MPS else None)
    pin = ray.util.get_node_ip_address() if layout.backend is BackendKind.MIG else None
    wanted = bundles(layout, num_cpus_per_gmi, pin)
    pg = placement_group(wanted, strategy=STRATEGY, name=name)
    actors, agents, nodes = [], {}, None
    try:
        _wait_placed(pg, wanted, placement_timeout_s)
        # the agents start beside the GMIs: the placement group already tells the nodes
        bundle_nodes = ray.util.placement_group_table(pg)["bundles_to_node_id"]
        agents = _start_agents(dict.fromkeys(bundle_nodes[g] for g in range(len(wanted))), name)
        actors = _start_gmis(layout, pg, wanted, name, num_cpus_per_gmi, mps_dir, runtime_envs,
                             [agents[bundle_nodes[g]] for g in range(len(wanted))])
        nodes = tuple(_collect([a.where.remote() for a in actors], None, placement_timeout_s))
        reduction = reduction_layout(layout, nodes)
        log.info("Ray placed %d GMIs on %d node(s): %s; reduction %s", layout.num_gmis,
                 len(reduction.mpl), [list(g) for g in reduction.mpl],
                 reduction_note or reduction.reduction.value)
        shared = (reduction.reduction in (Reduction.MPR, Reduction.HAR)
                  and layout.num_gmis > 1)
        capacity = reducer_capacity
        if callable(capacity):  # (only shared memory is sized by it)
            capacity = (ray.get(actors[0].call.remote(capacity), timeout=placement_timeout_s)
                        if shared else 1)
        groups = _collect([agents[nodes[gmis[0]].node_id].setup.remote(
            len(gmis) if shared else None, capacity, mps_dir) for gmis in reduction.mpl],
            None, placement_timeout_s, what="node agent")
        init_method = ""
        if reduction.reduction is Reduction.HAR or rendezvous:
            port = ray.get(actors[0].free_port.remote(), timeout=placement_timeout_s)
            init_method = f"tcp://{nodes[0].ip}:{port}"
        addrs = (service_addr,) * layout.num_gmis if service_addr else ()
        if service_addr:
            _check_switch_reachable(service_addr, nodes, reduction.reduction.value)
        group = ReductionGroup(tuple(g for g in groups if g is not None), init_method, addrs,
                               job[0] or name, job[1],
                               staleness if reduction.reduction is Reduction.PS else 0)
        results = _collect([a.run.remote(target, GMIContext(g, reduction, payload, group))
                            for g, a in enumerate(actors)], nodes)
        return results, reduction, nodes
    finally:
        _teardown(actors, agents, nodes, pg, mps_dir is not None)


def _check_switch_reachable(switch_addr: str, nodes: Sequence[NodeInfo],
                            kind: str = "switch") -> None:
    """Refuse a loopback switch (``kind`` ps: parameter server) address for GMIs on several
    hosts (each would reach its own loopback; several Ray nodes of one host share theirs).

    Raises:
        PlacementError: the GMIs' nodes have more than one IP and the address is loopback.
    """
    hosts = sorted({n.ip for n in nodes})
    if len(hosts) > 1 and _is_loopback(switch_addr):
        what = "the switch's" if kind == "switch" else "the parameter server's"
        raise PlacementError(f"gmi.{kind}_addr={switch_addr} is a loopback address, but Ray "
                             f"placed the GMIs on {len(hosts)} hosts {hosts}: give {what} "
                             "address on the network the hosts share", "", "")


def _host_port(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` split, an IPv6 host without its brackets (``"[::1]:6379"``)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _is_loopback(addr: str) -> bool:
    """Whether ``HOST:PORT`` names this host only (127.0.0.0/8, ::1, ``localhost``)."""
    import ipaddress

    host = _host_port(addr)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: whatever it resolves to on each node
        return False


def _wait_placed(pg, wanted, timeout_s: float) -> None:
    total = ray.cluster_resources()
    short = {k: (sum(b.get(k, 0) for b in wanted), total.get(k, 0)) for b in wanted for k in b}
    short = {k: v for k, v in short.items() if v[0] > v[1]}
    too_big = _larger_than_every_node(wanted)
    if short:  # (an autoscaler may still add nodes: wait, but say so at once)
        log.warning("the GMIs need %s, more than the cluster has (%s); waiting up to %.0f s "
                    "for nodes to join (--ray.placement-timeout-s)",
                    ", ".join(f"{need:g} {k}" for k, (need, _) in short.items()),
                    ", ".join(f"{have:g} {k}" for k, (_, have) in short.items()), timeout_s)
    elif too_big:
        log.warning("%s; waiting up to %.0f s for a larger node to join "
                    "(--ray.placement-timeout-s)", too_big, timeout_s)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise PlacementError(
            f"Ray could not place {len(wanted)} GMI bundles {wanted} within {timeout_s:.0f} s "
            f"(cluster resources {ray.cluster_resources()}, available "
            f"{ray.available_resources()}" + (f"; {too_big}" if too_big else "") + "); lower "
            "ray.num_cpus_per_gmi or gmi.num_gmis, or add nodes") from None


def _larger_than_every_node(wanted) -> str:
    """Why a GMI's bundle fits no node of the cluster as it is (each bundle must fit one
    node, whatever the cluster's total), or ``""``."""
    largest: dict[str, float] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for k, v in node.get("Resources", {}).items():
                largest[k] = max(largest.get(k, 0.0), v)
    over = {k: (need, largest.get(k, 0.0)) for b in wanted for k, need in b.items()
            if need > largest.get(k, 0.0)}
    if not over:
        return ""
    return ("a GMI's bundle needs " + ", ".join(f"{n:g} {k}" for k, (n, _) in over.items())
            + ", and no node has more than "
            + ", ".join(f"{h:g} {k}" for k, (_, h) in over.items())
            + " (a GMI's bundle must fit one node)")


def _start_gmis(layout, pg, wanted, name, num_cpus_per_gmi, mps_dir, runtime_envs,
                agent_of) -> list:
    """One `GMIActor` per GMI in its bundle; ``agent_of[g]``: the agent of GMI ``g``'s node."""
    code_dir = str(Path(gmi_drl.__file__).resolve().parent.parent)
    remote = ray.remote(GMIActor)
    actors = []
    for spec, bundle in zip(layout.specs, wanted):
        g = spec.gmi_id
        env = runtime_env(actor_env(spec, num_cpus_per_gmi, mps_dir), code_dir,
                          runtime_envs[g] if runtime_envs is not None else None)
        where = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=g)
        actors.append(remote.options(
            **actor_resources(bundle), runtime_env=env, name=f"{name}-gmi-{g}", max_restarts=0,
            scheduling_strategy=where).remote(max(1, int(num_cpus_per_gmi)), agent_of[g]))
    return actors


def _start_agents(node_ids, name) -> dict:
    """One `NodeAgent` on each of ``node_ids`` (no CPU reserved), by node id."""
    remote = ray.remote(NodeAgent)
    return {node: remote.options(num_cpus=0, name=f"{name}-node-{k}", max_restarts=0,
                                 scheduling_strategy=NodeAffinitySchedulingStrategy(
                                     node, soft=False)).remote()
            for k, node in enumerate(node_ids)}


def _collect(refs, nodes, timeout_s: float | None = None, poll_s: float = 1.0,
             grace_s: float = 2.0, what: str = "GMI") -> list:
    """Results of ``refs`` (ref ``k`` belongs to GMI ``k``, or node agent ``k``) in order.

    Raises:
        GMIError: one raised or died; PlacementError: not all answered within ``timeout_s``.
    """
    pending = {ref: k for k, ref in enumerate(refs)}
    results, failures = {}, []
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending and not failures:
        if deadline is not None and time.monotonic() > deadline:
            raise PlacementError(f"{what}s {sorted(pending.values())} did not start within "
                                 f"{timeout_s:.0f} s")
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
        for ref in ready:
            k = pending.pop(ref)
            try:
                results[k] = ray.get(ref)
            except ray.exceptions.RayError as e:
                failures.append((k, e))
    if failures:
        # a death breaks the reduction group, so the others may fail next: let them report,
        # then name the deaths (the causes) first
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=grace_s)
            for ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as e:
                    failures.append((pending[ref], e))
        raise GMIError(*_failure_message(failures, nodes, what))
    return [results[k] for k in range(len(refs))]


def _failure_message(failures, nodes, what: str) -> tuple[str, str, str]:
    """`GMIError`'s ``(summary, details, exception)``: the first death (the likely cause) or
    else the first that raised, in one line; then every failure with its traceback."""
    died = [(k, e) for k, e in failures if isinstance(e, ray.exceptions.RayActorError)]
    raised = [(k, e) for k, e in failures if not isinstance(e, ray.exceptions.RayActorError)]
    parts = []
    for k, e in died + raised:
        where = (f" (Ray actor pid {nodes[k].pid} on {nodes[k]})" if nodes is not None
                 else " (while starting)")
        if isinstance(e, ray.exceptions.RayActorError):
            parts.append((f"{what} {k}{where} died: {_death_cause(str(e))}", "", ""))
        else:
            tb = _ANSI.sub("", str(e))
            cause = getattr(e, "cause", None)  # (a RayTaskError's: what the GMI raised)
            if isinstance(cause, BaseException):
                line = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
            else:  # (Ray's text has no traceback header: its first line names the call)
                line = exception_line(tb)
            parts.append((f"{what} {k}{where} raised {line}", tb, line))
    head, _, exception = parts[0]
    details = "\n".join(h + (f":\n{d}" if d else "") for h, d, _ in parts)
    return head + STOPPED, details, exception


STOPPED = "; the run was stopped"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _death_cause(message: str) -> str:
    """Ray's reason for an actor's death, in one line (its exit type and detail)."""
    m = re.search(r"Worker exit type: (\S+) Worker exit detail: (.*?)(?:\.\s|\.?$)", message,
                  re.S)
    if m:
        return f"{m[2].strip()} (exit type {m[1]})"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"


def _teardown(actors, agents: dict, nodes, pg, mps: bool) -> None:
    """Stop everything of one attempt; every step is bounded and runs even if another failed."""
    if mps and nodes is not None:  # no MPS client may die with GPU work in flight
        _quietly(lambda: ray.get([agent.terminate_mps_clients.remote(
            [n.pid for n in nodes if n.node_id == node]) for node, agent in agents.items()],
            timeout=TEARDOWN_TIMEOUT_S), "ending MPS clients' work")
    for actor in actors:
        ray.kill(actor, no_restart=True)
    _await_deaths(actors)
    for agent in agents.values():
        _quietly(lambda a=agent: ray.get(a.close.remote(), timeout=TEARDOWN_TIMEOUT_S),
                 "node agent clean-up")
        ray.kill(agent, no_restart=True)
    _await_deaths(agents.values())
    _quietly(lambda: remove_placement_group(pg), "removing the placement group")


def _await_deaths(actors) -> None:
    """Return once Ray reports every one of ``actors`` dead (a call to it fails), or warn after
    `TEARDOWN_TIMEOUT_S`."""
    deadline = time.monotonic() + TEARDOWN_TIMEOUT_S
    for actor in actors:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("teardown: an actor was not reported dead within %.0f s",
                            TEARDOWN_TIMEOUT_S)
                return
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=left)
            except ray.exceptions.RayActorError:
                break
            except ray.exceptions.GetTimeoutError:
                continue
            time.sleep(0.05)  # still alive: the kill is on its way


def _quietly(step: Callable[[], Any], what: str) -> None:
    try:
        step()
    except Exception as e:  # noqa: BLE001 - teardown goes on; the first error is the one raised
        log.warning("teardown: %s failed: %s", what, e)
