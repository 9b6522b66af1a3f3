"""The loop of the ``async_training`` template: trainer GMIs and serving GMIs, each its own
loop, joined by the experience channels and the weight store (GMI-DRL §4.2, §5.1).

`async_main` is the GMI target: GMIs ``0 .. trainer_gmis - 1`` are trainers (`trainer_main`),
the rest serve (`serving_main`). In lock-step (`AsyncSpec.lockstep`: the serial placement, or
``async.lockstep``) each serving fragment waits for the updates before it, so that a run acts and
learns the same wherever its GMIs run.

A trainer's iteration is one update from one batch; ``global_step`` counts the env steps
trained on (over every trainer). The run ends when trainer 0 has done ``num_iterations``
updates: it stops the channels, and the serving GMIs return.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from gmi_drl.comm.channels import Batcher, ChannelClosed, ChannelPlan, Dispenser, Fabric
from gmi_drl.comm.weights import WeightStore, WeightStoreHandle
from gmi_drl.rollout.episodes import DeviceEpisodes, Episodes
from gmi_drl.runner.shell import GMIShell, LoopResult
from gmi_drl.runner.roles import ServingRole, TrainerRole
from gmi_drl.runner.run import Run
from gmi_drl.telemetry.memory import peak_memory_bytes
from gmi_drl.telemetry.progress import Progress
from gmi_drl.telemetry.timeline import Timeline
from gmi_drl.telemetry.timer import SectionStats, TimingTree, set_tree


@dataclass(frozen=True)
class AsyncSpec:
    """The payload every GMI of an async run receives (picklable).

    Attributes:
        run: the run. channels: the experience channels' plan (``shm``: with the block's name;
            ``tcp``: ``None``, each GMI plans its own where it runs, `channel_plan`).
        weights: ``shm``: the weight store's handle; ``tcp``: ``None``.
        weight_bytes: bytes of one weight publication (``tcp``: 0, `weight_bytes` in the GMI).
        transport: ``shm``: every GMI attaches to one block and one store the placement made
            (one host); ``tcp``: each GMI makes its own, and bridges join every trainer and
            every serving GMI (`gmi_drl.comm.channels.bridge`; GMI 0 hosts the run's
            `BridgeDirectory` at ``ctx.reduction.init_method``).
        trainer_layout: the trainer GMIs' own layout (their reduction), or ``None`` for one.
        trainer_group: the trainers' `gmi_drl.gmi.context.ReductionGroup`, or ``None``.
        progress: called by trainer 0 with a `Progress`, or ``None``.
        lockstep: serving fragment ``f`` is acted with the weights of update
            ``f // fragments_per_batch`` exactly (one serving and one trainer GMI): it waits for
            them, so fragments and updates follow the order of one process alternating them.
    """

    run: Run
    channels: ChannelPlan | None
    weights: WeightStoreHandle | None
    weight_bytes: int = 0
    transport: str = "shm"
    trainer_layout: object = None
    trainer_group: object = None
    progress: Callable[[Progress], None] | None = None
    lockstep: bool = False


class ServingResult(NamedTuple):
    """What a serving GMI returns."""

    env_steps: int
    fragments: int
    wall_s: float
    policy_versions: int
    """weight versions it picked up"""
    phases: dict[str, SectionStats]
    peak_memory_bytes: int = 0
    """this GMI's peak memory on its device (`gmi_drl.telemetry.memory`), bytes"""
    transfers_per_trainer: tuple[int, ...] = ()
    """over bridges (``tcp``): transfers sent to each trainer GMI, by rank"""


def async_main(ctx) -> LoopResult | ServingResult:
    """One GMI of an async run (every placement's target): trainer or serving by id."""
    spec: AsyncSpec = ctx.payload
    cfg = spec.run.config
    trainers = cfg.gmi.trainer_gmis
    directory = None
    if spec.transport == "tcp":
        import dataclasses

        from gmi_drl.comm.channels.bridge import BridgeDirectory

        task = task_spec(cfg)  # sized here: the controller need not have the task's needs
        spec = dataclasses.replace(spec, channels=channel_plan(cfg, task),
                                   weight_bytes=weight_bytes(cfg, task))
        directory = BridgeDirectory(ctx.reduction.init_method, is_host=ctx.gmi_id == 0,
                                    timeout_s=spec.run.config.async_.timeout_s)
    if ctx.gmi_id < trainers:
        return trainer_main(spec, ctx.gmi_id, spec.progress if ctx.gmi_id == 0 else None,
                            directory)
    return serving_main(spec, ctx.gmi_id - trainers, directory)


def _own_channels(spec: AsyncSpec, num_serving: int | None = None):
    """A fabric and a weight store of this GMI's own (``tcp``): every serving GMI's channel
    to this trainer, or (``num_serving=1``) a serving GMI's one channel, which its bridge
    distributes over the trainers."""
    import dataclasses

    plan = dataclasses.replace(spec.channels, num_trainers=1,
                               num_serving=num_serving or spec.channels.num_serving)
    return Fabric.create(plan), WeightStore.create(spec.weight_bytes)


def task_spec(cfg):
    """The run's `gmi_drl.envs.spec.TaskSpec` (``cfg.env``'s task and engine)."""
    from gmi_drl import envs

    return envs.task_spec(cfg.env.task_id, **cfg.env.pool_kwargs())


def channel_plan(cfg, task) -> ChannelPlan:
    """The experience channels of ``cfg`` for ``task``: fragments of ``algo.num_steps`` steps of
    ``env.num_envs`` envs, from every serving GMI to the trainer GMIs (``async.*``)."""
    from gmi_drl.rollout.trajectory import fragment_fields

    a = cfg.async_
    fields = fragment_fields(task.observation_space, task.action_space, cfg.algo.num_steps,
                             cfg.env.num_envs)
    return ChannelPlan(fields, cfg.algo.num_steps, cfg.env.num_envs, cfg.gmi.serving_gmis,
                       cfg.gmi.trainer_gmis, a.channel, a.fragments_per_transfer,
                       a.channel_slots, a.backpressure)


def weight_bytes(cfg, task) -> int:
    """Bytes one weight publication holds: the acting model's state and, with observation
    normalisation, its mean and variance (float64)."""
    import math

    from gmi_drl.algos import build_acting_model

    model = build_acting_model(cfg.algo, task, cfg.model)
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if cfg.norm.obs:
        n += 2 * 8 * math.prod(task.observation_space.shape)
    return n


def _setup_threads(cfg) -> None:
    torch.set_num_threads(cfg.torch_threads)
    threadpool_limits(cfg.torch_threads, user_api="blas")


class TrainerGMI(GMIShell):
    """Trainer GMI ``rank``: learner, batcher and weight store in the `GMIShell`; one update
    from one batch per iteration."""

    def __init__(self, spec: AsyncSpec, rank: int, fabric: Fabric, store: WeightStore,
                 slot: int | None = None, group_store=None) -> None:
        import functools

        from gmi_drl.algos import AlgoContext, build_algorithm
        from gmi_drl.checkpoint import CheckpointError
        from gmi_drl.optim.grad_step import make_grad_step
        from gmi_drl.rollout.arrays import arrays_for
        from gmi_drl.rollout.normalize import ObsNormalizer

        super().__init__(spec.run, rank)
        cfg = self.cfg
        self.fabric = fabric
        _setup_threads(cfg)
        device = torch.device(cfg.device)
        task = task_spec(cfg)
        self.obs_norm = (ObsNormalizer(task.observation_space.shape, cfg.norm.obs_clip,
                                       arrays=arrays_for(device)) if cfg.norm.obs else None)
        self.reducer = _trainer_reducer(spec, rank, group_store)
        steps = functools.partial(make_grad_step, reducer=self.reducer, compile=cfg.compile,
                                  cuda_graphs=cfg.cuda_graphs, precision=cfg.precision)
        self.start_timing(f"gmi-{rank} trainer")
        torch.manual_seed(cfg.seed)
        self.learner = build_algorithm(cfg.algo, AlgoContext(
            task, cfg.env.num_envs, cfg.model, cfg.num_iterations, cfg.seed, steps,
            torch.Generator(device).manual_seed(cfg.seed + 1), device, self.obs_norm, None,
            cfg.compile))
        self.env_steps_before = 0
        """env steps the serving GMIs collected before this run resumed (at its checkpoint)"""
        if self.resume_state is not None:
            try:
                self._restore(self.resume_state)
            except (ValueError, KeyError) as err:
                raise CheckpointError(f"checkpoint does not match this run: {err}") from None
        self.batcher = Batcher(fabric, rank if slot is None else slot,
                               cfg.algo.fragments_per_batch, device)
        self.role = TrainerRole(self.learner, self.batcher, store, publish=rank == 0,
                                max_policy_lag=cfg.async_.max_policy_lag)
        self.lags: list[np.ndarray] = []
        self._env_steps0 = 0
        self.open_writer()

    @property
    def global_batch(self) -> int:
        """Samples one update trains on, over every trainer GMI."""
        return self.cfg.batch_size

    def run_iteration(self, k: int) -> tuple[Episodes | DeviceEpisodes, dict]:
        """One update from the next batch (waited for)."""
        step = self.role.update(True, self.cfg.async_.timeout_s)
        self.lags.append(step.lags)
        return step.episodes, step.metrics

    def trained_modules(self) -> dict:
        return self.learner.state_dict()["modules"]

    def started(self) -> None:
        self._env_steps0 = self.fabric.env_steps()

    def row(self, elapsed_s: float) -> dict[str, float]:
        return {"perf/env_sps": (self.fabric.env_steps() - self._env_steps0) / elapsed_s,
                "async/env_steps": float(self.env_steps()),  # collected so far (>= trained)
                **self.fabric.stats()}

    def finished(self) -> dict:
        if self.rank == 0:
            _write_lags(self)
        return {"fragments_trained": sum(len(v) for v in self.lags),
                "fragments_dropped": self.batcher.stale_dropped}

    def state_dict(self, global_step: int, iteration: int) -> dict:
        return {**self.shell_state(global_step, iteration), "algo": self.learner.state_dict(),
                "obs_norm": self.obs_norm.state_dict() if self.obs_norm else None,
                "reward_norm": None, "env_steps": self.env_steps()}

    def env_steps(self) -> int:
        """Env steps of every serving GMI over the whole run, resumes included."""
        return self.env_steps_before + self.fabric.env_steps()

    def _restore(self, state: dict) -> None:
        self.learner.load_state_dict(state["algo"])
        if (self.obs_norm is None) != (state["obs_norm"] is None):
            raise ValueError("obs_norm differs between this config and the checkpoint")
        if self.obs_norm is not None:
            self.obs_norm.load_state_dict(state["obs_norm"])
        self.env_steps_before = int(state.get("env_steps", 0))  # (not in older checkpoints)

    def close(self) -> None:
        self.learner.close()
        if self.reducer is not None:
            self.reducer.close()
        super().close()


def _trainer_reducer(spec: AsyncSpec, rank: int, group_store=None):
    """The gradient reducer among trainer GMIs (the identity for one): the layout's reducer
    on one host; with ``group_store`` (``tcp``, trainers wherever Ray placed them) a gloo ring
    that meets through it."""
    from gmi_drl.comm.reducer import IdentityReducer
    from gmi_drl.gmi.context import REDUCERS

    config = spec.run.config
    trainers = config.gmi.trainer_gmis
    timeout_s = trainer_reduce_timeout_s(config.async_.timeout_s)
    if group_store is not None and trainers > 1:
        from gmi_drl.comm.ring import RingReducer

        return RingReducer(rank, trainers, "", "gloo", timeout_s=timeout_s, store=group_store)
    layout = spec.trainer_layout
    if layout is None or layout.num_gmis == 1:
        return IdentityReducer()
    return REDUCERS[layout.reduction](rank, layout, spec.trainer_group, timeout_s=timeout_s)


def trainer_reduce_timeout_s(batch_timeout_s: float) -> float:
    """How long a trainer GMI waits inside a gradient reduction for the others, seconds:
    ``async.timeout_s`` plus a minute. Each trainer waits for its own batch, and one whose
    batch is late is stopped by its batcher after ``async.timeout_s`` with the reason; the
    others must wait at least that long, or they would break the group first and hide it."""
    return batch_timeout_s + 60.0


def trainer_main(spec: AsyncSpec, rank: int, progress: Callable[[Progress], None] | None,
                 directory=None) -> LoopResult:
    """Trainer GMI ``rank``: ``num_iterations`` updates, each from one batch; trainer 0 logs,
    checkpoints and publishes, and stops the channels at the end (or on any failure). With a
    `BridgeDirectory` (``tcp``), it listens for the serving GMIs of every host at an address
    it publishes there; a trainer other than 0 also follows trainer 0's weights."""
    from gmi_drl.comm.channels.bridge import BridgeServer, WeightFollower

    server = follower = None
    slot, group_store = rank, None
    if directory is not None:
        fabric, store = _own_channels(spec)
        slot, group_store = 0, directory.group_store()
    else:
        fabric, store = Fabric.attach(spec.channels), WeightStore.attach(spec.weights)
    try:
        timeout_s = spec.run.config.async_.timeout_s
        if directory is not None:
            server = BridgeServer(fabric, store, spec.weight_bytes, (directory.local_ip(), 0),
                                  push=rank == 0)
            directory.publish(rank, server.address)
            if rank > 0:
                follower = WeightFollower(store, spec.weight_bytes, directory.lookup(1)[0],
                                          rank, timeout_s)
        result = TrainerGMI(spec, rank, fabric, store, slot, group_store).iterate(progress)
        if server is not None:  # every serving GMI learns of the end through its connection
            server.wait_greeted(spec.channels.num_serving, timeout_s)
        return result
    finally:
        fabric.stop()
        for end in (follower, server):
            if end is not None:
                end.close()
        fabric.close()
        store.close()


def _write_lags(t: TrainerGMI) -> None:
    """``policy_lag.csv``: how many fragments were trained on at each policy lag (a resumed
    run adds its counts to those of the runs before it)."""
    if not t.lags:
        return
    path = t.run.run_dir / "policy_lag.csv"
    values, counts = np.unique(np.concatenate(t.lags), return_counts=True)
    total = dict(zip(values.tolist(), counts.tolist()))
    if t.first_iteration > 0 and path.exists():
        try:
            for line in path.read_text().splitlines()[1:]:
                lag, n = (int(v) for v in line.split(","))
                total[lag] = total.get(lag, 0) + n
        except ValueError:  # a damaged file: this run's counts alone
            pass
    lines = ["policy_lag,fragments"] + [f"{v},{total[v]}" for v in sorted(total)]
    path.write_text("\n".join(lines) + "\n")


class Server:
    """Serving GMI ``index``: pool, policy copy, normalisers, dispenser, timer."""

    def __init__(self, spec: AsyncSpec, index: int, fabric: Fabric, store: WeightStore,
                 in_process: bool = False, slot: int | None = None) -> None:
        from gmi_drl import envs
        from gmi_drl.algos import build_acting_model
        from gmi_drl.rollout.acting import make_acting
        from gmi_drl.rollout.arrays import HostArrays, pool_arrays
        from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer

        cfg = spec.run.config
        self.cfg, self.index, self.fabric = cfg, index, fabric
        self.slot = index if slot is None else slot  # its channels' index in ``fabric``
        _setup_threads(cfg)
        e, n = cfg.env, cfg.norm
        trainers = cfg.gmi.trainer_gmis
        self.tree = TimingTree(Timeline(cfg.log.timeline_detail_events,
                                        process_name=f"gmi-{trainers + index} serving"))
        set_tree(self.tree)  # (this thread's)
        splits = cfg.async_.env_splits
        per = e.num_envs // splits
        workers = 0 if in_process else (None if e.num_workers is None
                                         else max(1, e.num_workers // splits))
        self.pools = [envs.make(e.task_id, per, num_workers=workers,
                                seed=cfg.seed + index * e.num_envs + s * per,
                                autoreset="same_step", device=cfg.device,
                                **e.pool_kwargs())
                      for s in range(splits)]
        task = self.pools[0].spec
        # NumPy on the host, or the tensors of a warp pool on its device (nothing per step
        # crosses to the host; ServingRole copies each fragment once)
        arrays = pool_arrays(HostArrays(), self.pools[0])
        # uninitialised: its weights are the trainer's first publication, which serving_main
        # waits for (and no draw from the global generator, which a trainer thread may use)
        with torch.device("meta"):
            model = build_acting_model(cfg.algo, task, cfg.model)
        model = model.to_empty(device=arrays.device)
        generator = torch.Generator(arrays.device).manual_seed(cfg.seed + 7919 * (index + 1))
        acting = make_acting(model, generator, arrays, cfg.compile)
        obs_norm = (ObsNormalizer(task.observation_space.shape, n.obs_clip, arrays=arrays)
                    if n.obs else None)
        reward_norm = (RewardNormalizer(e.num_envs, cfg.algo.gamma, n.reward_clip,
                                        arrays=arrays) if n.reward else None)
        self.role = ServingRole(self.pools, model, acting, obs_norm, reward_norm,
                                Dispenser(fabric, self.slot), store)
        self.gmi_dir = spec.run.gmi_dir(trainers + index)
        self.fragments, self.versions = 0, 0

    def collect(self) -> Episodes:
        before = self.role.policy_version
        episodes = self.role.collect()
        self.versions += self.role.policy_version != before
        self.fragments += 1
        self.fabric.add_env_steps(self.slot, self.fabric.plan.num_steps * self.cfg.env.num_envs)
        return episodes

    def close(self, write_timeline: bool = True) -> None:
        for pool in self.pools:
            pool.close()
        if write_timeline:
            self.gmi_dir.mkdir(parents=True, exist_ok=True)
            self.tree.timeline.write(self.gmi_dir / "timeline.json")
            set_tree(TimingTree())


def serving_main(spec: AsyncSpec, index: int, directory=None) -> ServingResult:
    """Serving GMI ``index``: fragments until the trainers stop the channels (or, over the
    bridges of a `BridgeDirectory`, close one)."""
    from gmi_drl.comm.channels.bridge import BridgeClient

    client, slot = None, index
    if directory is not None:
        fabric, store = _own_channels(spec, num_serving=1)
        slot = 0  # its own fabric holds only its channel
    else:
        fabric, store = Fabric.attach(spec.channels), WeightStore.attach(spec.weights)
    server, t0 = None, time.perf_counter()
    try:
        if directory is not None:
            addresses = directory.lookup(spec.run.config.gmi.trainer_gmis)
            client = BridgeClient(fabric, store, spec.weight_bytes, index, addresses,
                                  spec.run.config.async_.timeout_s, local=slot)
        cfg = spec.run.config
        server = Server(spec, index, fabric, store, in_process=cfg.placement == "serial",
                        slot=slot)
        try:  # the trainer's first weights (a resumed run's: its version)
            first = _await_version(store, fabric, 0, cfg.async_.timeout_s)
        except ChannelClosed:
            first = None
        while first is not None and not fabric.stopped():
            try:
                if spec.lockstep:
                    _await_version(store, fabric,
                                   first + server.fragments // cfg.algo.fragments_per_batch,
                                   cfg.async_.timeout_s)
                server.collect()
            except ChannelClosed:
                break
        return ServingResult(server.role.env_steps, server.fragments, time.perf_counter() - t0,
                             server.versions, server.tree.stats(),
                             peak_memory_bytes(spec.run.config.device),
                             tuple(client.sent) if client is not None else ())
    finally:
        if server is not None:
            server.close()
        if client is not None:
            client.close()
        fabric.close()
        store.close()


def _await_version(store: WeightStore, fabric: Fabric, version: int, timeout_s: float) -> int:
    """Wait until the trainer published weight ``version`` or a newer one (lock-step); returns
    the newest version.

    Raises:
        ChannelClosed: the run stopped meanwhile. TimeoutError: none came in ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while (newest := store.version) is None or newest < version:
        if fabric.stopped():
            raise ChannelClosed("the run stopped")
        if time.monotonic() > deadline:
            raise TimeoutError(f"lock-step: no weights of update {version} in {timeout_s:g} s "
                               "(async.timeout_s): the trainer GMI is stuck or gone")
        time.sleep(0.0002)
    return newest
