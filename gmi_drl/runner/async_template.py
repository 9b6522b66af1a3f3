"""The ``async_training`` template: trainer and serving GMIs, their experience channels and
weight store (GMI-DRL §4.2, §5.1).

On one host (the serial and local placements) it makes what the GMIs share before any starts
(the experience channels' block, the weight store, the trainers' reduction groups) and removes
every shared-memory segment after the last one ended, whatever happened. On Ray each GMI makes
its own channels and store, sized where it runs, and TCP bridges join them
(`gmi_drl.comm.channels.bridge`): the controller never builds the task.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Any, Iterator

from gmi_drl.config import ConfigError, TrainConfig
from gmi_drl.gmi.layout import Layout, plan, plan_async
from gmi_drl.runner.async_loop import AsyncSpec, channel_plan, task_spec, weight_bytes

TARGET = "gmi_drl.runner.async_loop:async_main"


class AsyncTemplate:
    """Trainer GMIs ``0 .. trainer_gmis - 1``, serving GMIs after them.

    Raises (at construction):
        ConfigError: the layout does not fit this machine.
    """

    target = TARGET
    reducer_capacity = 1  # (the trainers reduce through groups of their own layout)

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
        self.cfg, self.capacity = cfg, capacity
        n_tr = g.trainer_gmis
        self.tolerate = (frozenset(range(n_tr, n_tr + g.serving_gmis))
                         if cfg.async_.tolerate_serving_failures else frozenset())
        self.placement = "local"

    @contextlib.contextmanager
    def shared(self, payload: Any, placement: str) -> Iterator[AsyncSpec]:
        """The run's `AsyncSpec`: on Ray (``tcp``) nothing is shared; on one host the channels'
        block, the weight store and the trainers' reduction groups (``shm``). The serial
        placement's GMIs act in lock-step (`AsyncSpec.lockstep`)."""
        from gmi_drl.comm.channels import Fabric
        from gmi_drl.comm.shm import ShmGroup
        from gmi_drl.comm.weights import WeightStore
        from gmi_drl.gmi.context import ReductionGroup, shm_group_sizes

        self.placement, cfg = placement, self.cfg
        if placement == "ray":
            yield AsyncSpec(payload.run, None, None, transport="tcp", progress=payload.progress,
                            lockstep=cfg.async_.lockstep)
            return
        task = task_spec(cfg)
        with contextlib.ExitStack() as made:  # whatever happens, every segment is unlinked
            fabric = Fabric.create(channel_plan(cfg, task))
            made.callback(fabric.destroy)
            store = WeightStore.create(weight_bytes(cfg, task))
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
            yield AsyncSpec(payload.run, fabric.plan, store.handle, store.handle.nbytes,
                            "shm", self.trainer_layout, group, payload.progress,
                            lockstep=placement == "serial" or cfg.async_.lockstep)

    def trainer_reduction(self) -> str:
        """What the trainer GMIs reduce their gradients through, in words."""
        lay = self.trainer_layout
        if lay is None:
            return "none (one trainer GMI)"
        if self.placement == "ray":
            return ("`ring`: gloo among the trainer GMIs wherever Ray placed them, meeting "
                    "through the run's rendezvous store")
        return f"`{lay.reduction.value}`: {lay.reduction_reason}"

    def describe(self, results: list, layout: Layout) -> str:
        """Markdown lines: the roles, the channels and what each serving GMI did."""
        cfg, g, a = self.cfg, self.cfg.gmi, self.cfg.async_
        n_tr = g.trainer_gmis
        text = (self.layout.describe(reduction=False)
                + f"- trainer GMIs {list(range(n_tr))} (the trainer role), serving GMIs "
                f"{list(range(n_tr, n_tr + g.serving_gmis))} (the simulator and agent roles, "
                f"{cfg.env.num_envs} envs each)\n")
        if self.placement == "serial" or a.lockstep:
            text += ("- lock-step: each serving fragment waited for the update before it "
                     "(async.lockstep; the serial placement always)\n")
        text += f"- gradient reduction among trainer GMIs: {self.trainer_reduction()}\n"
        how = "one per field (MCC)" if a.channel == "multi" else "one message per step (UCC)"
        text += (f"- experience channels: {a.channel} ({how}), "
                 f"{a.fragments_per_transfer} fragment(s) of {cfg.algo.num_steps} steps per "
                 f"transfer, {a.channel_slots} slots, back-pressure {a.backpressure}\n")
        if self.placement == "ray":
            text += ("- each trainer GMI's TCP bridge joins every serving GMI's channel to its "
                     "own, and each serving GMI sends each transfer to the trainer with the "
                     "least queued work\n")
        text += _serving_lines(cfg, results)
        return text


def _serving_lines(cfg: TrainConfig, results: list) -> str:
    """What each serving GMI did, and the fragments the policy-lag bound dropped."""
    n_tr, a, text = cfg.gmi.trainer_gmis, cfg.async_, ""
    for k, r in enumerate(results[n_tr:]):
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
        trainers = [r for r in results[:n_tr] if r is not None]
        dropped = sum(r.fragments_dropped for r in trainers)
        taken = dropped + sum(r.fragments_trained for r in trainers)
        text += (f"- fragments more than {a.max_policy_lag} versions old were dropped: "
                 f"{dropped:,} of the {taken:,} the trainer GMIs took in this invocation"
                 + (f" ({dropped / taken:.1%})" if taken else "") + "\n")
    return text
