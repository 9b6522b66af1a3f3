"""The placement of an ``async_training`` run: trainer and serving GMIs, their channels and
weight store (GMI-DRL §4.2, §5.1).

It creates what the GMIs share before any starts (the experience channels' block, the weight
store, the trainers' reduction group), runs `gmi_drl.runner.async_loop.async_main` once per GMI
through the local launcher (one process each: trainers first, then serving GMIs) or
`serial_main` in this process, and removes every shared-memory segment afterwards, whatever
happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from typing import Any

from gmi_drl.config import ConfigError, TrainConfig
from gmi_drl.gmi.layout import plan, plan_async
from gmi_drl.telemetry.progress import printed_here, relayed

TARGET = "gmi_drl.runner.async_loop:async_main"


class AsyncPlacement:
    """Trainer GMIs ``0 .. trainer_gmis - 1``, serving GMIs after them.

    Raises (at construction):
        ConfigError: the layout does not fit this machine.
    """

    def __init__(self, cfg: TrainConfig, machine, capacity: int) -> None:
        g = cfg.gmi
        backend = None if g.backend == "auto" else g.backend
        try:
            self.layout = plan_async(g.trainer_gmis, g.serving_gmis, machine, backend,
                                     g.trainer_share)
            self.trainer_layout = (plan(g.trainer_gmis, machine, backend=backend,
                                        num_devices=g.num_devices, reduction=g.reduction)
                                   if g.trainer_gmis > 1 else None)
        except ValueError as e:
            raise ConfigError(f"invalid config:\n  gmi: {e}") from None
        self.cfg, self.machine, self.capacity = cfg, machine, capacity
        self.results: list = []

    def channel_plan(self, task):
        from gmi_drl.comm.channels import ChannelPlan
        from gmi_drl.rollout.trajectory import fragment_fields

        cfg, a = self.cfg, self.cfg.async_
        fields = fragment_fields(task.observation_space, task.action_space, cfg.algo.num_steps,
                                 cfg.env.num_envs)
        return ChannelPlan(fields, cfg.algo.num_steps, cfg.env.num_envs, cfg.gmi.serving_gmis,
                           cfg.gmi.trainer_gmis, a.channel, a.fragments_per_transfer,
                           a.channel_slots, a.backpressure)

    def launch(self, target: str, payload: Any) -> list[Any]:
        """Run the GMIs (``target`` is the sync loop's: this placement runs its own); returns
        trainer results first, then serving results."""
        from gmi_drl.comm.channels import Fabric
        from gmi_drl.comm.shm import ShmGroup
        from gmi_drl.comm.weights import WeightStore
        from gmi_drl.gmi.context import ReductionGroup, shm_group_sizes
        from gmi_drl.runner.async_loop import AsyncSpec, _task_spec, serial_main

        cfg = self.cfg
        task = _task_spec(cfg)
        if cfg.placement == "ray":
            return self._launch_ray(payload, task)
        with contextlib.ExitStack() as made:  # whatever happens, every segment is unlinked
            fabric = Fabric.create(self.channel_plan(task))
            made.callback(fabric.destroy)
            store = WeightStore.create(_weight_bytes(cfg, task))
            made.callback(store.close)
            tmp = tempfile.mkdtemp(prefix="gmi-drl-async-")
            made.callback(shutil.rmtree, tmp, ignore_errors=True)
            groups = []
            for size in (shm_group_sizes(self.trainer_layout)
                         if self.trainer_layout is not None else []):
                grp, owner = ShmGroup.create(size, self.capacity)
                made.callback(ShmGroup.destroy, owner)
                groups.append(grp)
            group = ReductionGroup(tuple(groups), f"file://{tmp}/rendezvous")
            progress = payload.progress
            if cfg.placement != "serial":
                progress = made.enter_context(relayed(progress))
            spec = AsyncSpec(payload.run, fabric.plan, store.handle, store.handle.nbytes,
                             "shm", self.trainer_layout, group, progress)
            if cfg.placement == "serial":
                self.results = serial_main(spec)
            else:
                from gmi_drl.gmi.launcher import COMPILER, launch

                n_tr = cfg.gmi.trainer_gmis
                tolerate = (frozenset(range(n_tr, n_tr + cfg.gmi.serving_gmis))
                            if cfg.async_.tolerate_serving_failures else frozenset())
                self.results = launch(TARGET, self.layout, self.machine, payload=spec,
                                      reducer_capacity=1, exit_timeout_s=5.0,
                                      tolerate=tolerate, start_method=cfg.gmi.start_method,
                                      preload=COMPILER if cfg.compile else ())
            return self.results

    def _launch_ray(self, payload, task) -> list[Any]:
        """One Ray actor per GMI; each makes its own channels, and every trainer's bridge
        joins them to every serving GMI (`gmi_drl.comm.channels.bridge`) wherever Ray placed
        the GMIs."""
        from gmi_drl.cluster.ray_launcher import launch
        from gmi_drl.runner.async_loop import AsyncSpec

        cfg, r = self.cfg, self.cfg.ray
        spec = AsyncSpec(payload.run, self.channel_plan(task), None, _weight_bytes(cfg, task),
                         "tcp", progress=printed_here(payload.progress))
        self._ray = launch(TARGET, self.layout, spec, address=r.address,
                           max_restarts=r.max_restarts, num_cpus_per_gmi=r.num_cpus_per_gmi,
                           placement_timeout_s=r.placement_timeout_s, reducer_capacity=1,
                           rendezvous=True, reduction_note=self.trainer_reduction(),
                           on_restart=lambda error: dataclasses.replace(
                               spec, run=payload.run.restarted()))
        self.results = self._ray.results
        return self.results

    def trainer_reduction(self) -> str:
        """What the trainer GMIs reduce their gradients through, in words."""
        lay = self.trainer_layout
        if lay is None:
            return "none (one trainer GMI)"
        if self.cfg.placement == "ray":
            return ("`ring`: gloo among the trainer GMIs wherever Ray placed them, meeting "
                    "through the run's rendezvous store")
        return f"`{lay.reduction.value}`: {lay.reduction_reason}"

    def describe(self) -> str:
        """Markdown lines: the roles, the channels and what each serving GMI did."""
        cfg, g, a = self.cfg, self.cfg.gmi, self.cfg.async_
        n_tr = g.trainer_gmis
        where = {"serial": "one trainer and one serving role in this process, alternating",
                 "local": "one process per GMI",
                 "ray": "one Ray actor per GMI; each trainer GMI's TCP bridge joins every "
                        "serving GMI's channel to its own, and each serving GMI sends each "
                        "transfer to the trainer with the least queued work"}[cfg.placement]
        text = f"- placement: {cfg.placement}: {where}\n"
        if cfg.placement == "ray":
            run = self._ray
            text += "".join(f"- {run.nodes[gmis[0]]}: GMIs {list(gmis)}\n"
                            for gmis in run.layout.mpl)
            text += ("- restarts of every GMI from the trainer's last checkpoint after a GMI "
                     f"failed: {run.restarts}\n")
        text += (self.layout.describe(reduction=False)
                + f"- roles: trainer GMIs {list(range(n_tr))}, serving GMIs "
                f"{list(range(n_tr, n_tr + g.serving_gmis))} ({cfg.env.num_envs} envs each)\n")
        text += f"- gradient reduction among trainer GMIs: {self.trainer_reduction()}\n"
        how = "one per field (MCC)" if a.channel == "multi" else "one message per step (UCC)"
        text += (f"- experience channels: {a.channel} ({how}), "
                 f"{a.fragments_per_transfer} fragment(s) of {cfg.algo.num_steps} steps per "
                 f"transfer, {a.channel_slots} slots, back-pressure {a.backpressure}\n")
        serving = self.results[n_tr:] if cfg.placement != "serial" else self.results[1:]
        for k, r in enumerate(serving):
            gmi = n_tr + k
            if r is None:
                text += (f"- serving GMI {gmi}: failed during the run; the run went on without "
                         "it (async.tolerate_serving_failures; its reason is in train.log)\n")
                continue
            text += (f"- serving GMI {gmi}: {r.env_steps:,} env steps in {r.fragments:,} "
                     f"fragments, {r.policy_versions} weight versions picked up"
                     + (f", transfers to trainer GMIs {list(r.transfers_per_trainer)}"
                        if len(r.transfers_per_trainer) > 1 else "") + "\n")
        if a.max_policy_lag is not None:
            trainers = [r for r in self.results[:n_tr] if r is not None]
            dropped = sum(r.fragments_dropped for r in trainers)
            taken = dropped + sum(r.fragments_trained for r in trainers)
            text += (f"- fragments more than {a.max_policy_lag} versions old were dropped: "
                     f"{dropped:,} of the {taken:,} the trainer GMIs took in this invocation"
                     + (f" ({dropped / taken:.1%})" if taken else "") + "\n")
        return text


def _weight_bytes(cfg: TrainConfig, task) -> int:
    """Bytes `APPO.weights` publishes: the model's state and, with observation normalisation,
    its mean and variance (float64)."""
    import math

    from gmi_drl.algos import build_acting_model

    model = build_acting_model(cfg.algo, task, cfg.model)
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if cfg.norm.obs:
        n += 2 * 8 * math.prod(task.observation_space.shape)
    return n

