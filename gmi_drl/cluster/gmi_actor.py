"""One GMI as a Ray actor: the Ray twin of a local launcher's GMI process.

Ray starts the actor's process with the GMI's ``runtime_env`` (backend variables before CUDA
initialises); the actor then runs the same target, through the same `run_target`, as a local GMI
process does, so the training code is identical under both launchers.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

import ray

from gmi_drl import blocks
from gmi_drl.cluster.membership import NodeInfo
from gmi_drl.gmi.context import GMIContext
from gmi_drl.gmi.launcher import run_target


class GMIActor:
    """Made into a Ray actor by the launcher (``ray.remote(GMIActor)``); one per GMI.

    Args:
        torch_threads: torch intra-op threads of this process.
        agent: the `NodeAgent` actor of this node, told of every shared-memory block this
            process makes (`gmi_drl.blocks`), so that a killed GMI leaves none (None:
            nobody is told).
    """

    def __init__(self, torch_threads: int, agent=None) -> None:
        import torch

        torch.set_num_threads(torch_threads)
        if agent is not None:
            blocks.on_create(lambda name: ray.get(agent.adopt.remote(name), timeout=60))

    def where(self) -> NodeInfo:
        """This actor's Ray node id, node IP and process id."""
        return NodeInfo(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                        os.getpid())

    def free_port(self) -> int:
        """A TCP port free on this node now (for the reduction group's rendezvous)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on this GMI's node (e.g. sizing that builds the task, which the driver
        may lack the dependencies of)."""
        return fn()

    def run(self, target: str, ctx: GMIContext) -> Any:
        """Run ``target`` as GMI ``ctx.gmi_id`` (blocks for the whole run); returns its result.

        Raises:
            whatever the target raises (Ray hands it to the launcher with the traceback).
        """
        return run_target(target, ctx)
