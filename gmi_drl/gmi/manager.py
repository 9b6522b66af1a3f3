"""The GMI programming API of GMI-DRL Listing 1, for users who write their own roles.

Inside a GMI process started by `gmi_drl.gmi.launcher.launch`::

    def my_role(ctx):
        mgr = GMIManager(ctx)
        group = mgr.get_group(0, 1, 2)          # collective: every GMI calls it, same order
        mgr.allreduce(grads, group)             # mean over the group, in place
        if ctx.gmi_id == 0:
            mgr.send({"weights": w}, dst_gmi=3)   # any picklable object
        elif ctx.gmi_id == 3:
            w = mgr.recv(src_gmi=0)["weights"]

Groups and point-to-point messages run on torch.distributed (gloo on CPU; NCCL would forbid two
ranks of one GPU in a group, which is why gradient reduction itself goes through the
layout-aware reducers of `gmi_drl.comm`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GMIGroup:
    """A set of GMIs that reduce together; ``member`` says whether this GMI belongs to it."""

    gmi_ids: tuple[int, ...]
    handle: Any
    member: bool


class GMIManager:
    """Listing 1's ``GMI_manager`` for the GMI this process runs.

    Args:
        ctx: the `GMIContext` the launcher passes to a GMI's target.
        timeout_s: timeout of every collective and message, seconds.
    """

    def __init__(self, ctx, timeout_s: float = 60.0) -> None:
        self.gmi_id, self.layout = ctx.gmi_id, ctx.layout
        self._devices = {spec.gmi_id: spec.device for spec in ctx.layout.specs}
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=ctx.reduction.init_method + "-manager",
                                    rank=ctx.gmi_id, world_size=ctx.layout.num_gmis,
                                    timeout=datetime.timedelta(seconds=timeout_s))

    def add_gmi(self, gmi_id: int) -> "GMIManager":
        """Register ``gmi_id`` (Listing 1, line 13). The launcher's layout already holds every
        GMI; this checks the id exists and returns the manager.

        Raises:
            ValueError: ``gmi_id`` is not in the run's layout.
        """
        if gmi_id not in self._devices:
            raise ValueError(f"GMI {gmi_id} is not in this run's layout {self.layout.mpl}")
        return self

    def set_device(self, gmi_id: int, device: int) -> None:
        """Listing 1, line 14: the layout placed ``gmi_id`` already; a different device is an
        error, since a GMI's device is fixed before CUDA initialises.

        Raises:
            ValueError: the layout placed ``gmi_id`` on another device.
        """
        self.add_gmi(gmi_id)
        if self._devices[gmi_id] != device:
            raise ValueError(f"GMI {gmi_id} runs on device {self._devices[gmi_id]}, not {device}; "
                             "choose the placement with gmi.num_devices / the layout instead")

    def device_of(self, gmi_id: int) -> int:
        """The device the layout placed ``gmi_id`` on."""
        self.add_gmi(gmi_id)
        return self._devices[gmi_id]

    def get_group(self, *gmi_ids: int) -> GMIGroup:
        """A group over ``gmi_ids`` (Listing 1, line 15). Collective: every GMI of the run calls
        `get_group` with the same ids in the same order, members or not.

        Raises:
            ValueError: an unknown or repeated GMI id.
        """
        ids = tuple(sorted(set(gmi_ids)))
        if len(ids) != len(gmi_ids):
            raise ValueError(f"get_group{gmi_ids}: a GMI id is repeated")
        for g in ids:
            self.add_gmi(g)
        return GMIGroup(ids, dist.new_group(list(ids)), self.gmi_id in ids)

    def allreduce(self, tensor: torch.Tensor, group: GMIGroup) -> torch.Tensor:
        """Average ``tensor`` over ``group`` in place (Listing 1, line 23); a collective of the
        group's members. Returns ``tensor``.

        Raises:
            ValueError: this GMI is not a member of ``group``.
        """
        if not group.member:
            raise ValueError(f"GMI {self.gmi_id} is not in group {group.gmi_ids}")
        dist.all_reduce(tensor, group=group.handle)
        return tensor.div_(len(group.gmi_ids))

    def send(self, obj: Any, dst_gmi: int) -> None:
        """Send a picklable ``obj`` to ``dst_gmi`` (Listing 1, line 28); returns once it left."""
        self.add_gmi(dst_gmi)
        dist.send_object_list([obj], dst=dst_gmi)

    def recv(self, src_gmi: int) -> Any:
        """Receive the next object ``src_gmi`` sent (Listing 1, line 31); blocks."""
        self.add_gmi(src_gmi)
        box = [None]
        dist.recv_object_list(box, src=src_gmi)
        return box[0]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
