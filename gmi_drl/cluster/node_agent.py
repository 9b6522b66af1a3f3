"""The per-node helper of a Ray run: owns what the GMIs of its node share.

One agent per node that holds GMIs (no CPU reserved, pinned to the node). It creates the node's
shared-memory block for MPR/HAR (a block must be made on the node that maps it) and, for
``cuda_mps``, runs the node's MPS control daemon. Being a process of its own, it outlives GMI
actors that die: the block is always unlinked and the daemon always quit, and before GMI actors
are killed it ends their GPU work through the MPS control, so no MPS client dies with work in
flight. The GMI actors of its node hand it the name of every block they make (`adopt`;
`gmi_drl.blocks`), and it unlinks those that a killed actor left.
"""

from __future__ import annotations

import logging
import shutil

from gmi_drl import blocks
from gmi_drl.comm.shm import ShmGroup
from gmi_drl.gmi.backends import MPSDaemon


class NodeAgent:
    """Made into a Ray actor by the launcher (``ray.remote(NodeAgent)``); one per node."""

    def __init__(self) -> None:
        self._owner = None
        self._mps: MPSDaemon | None = None
        self._adopted: list[str] = []

    def setup(self, world_size: int | None, capacity: int,
              mps_dir: str | None) -> ShmGroup | None:
        """Start the node's MPS daemon in ``mps_dir`` (``cuda_mps``; serving every GPU of the
        node) and create a block for ``world_size`` GMIs of at most ``capacity`` float32 per
        allreduce (``None``: no block). Returns the block's picklable handle.

        First it unlinks the blocks that killed runs left on this node (`blocks.reclaim_orphans`:
        a driver killed with SIGKILL takes its agents with it, and a driver reclaims only on its
        own machine).

        Raises:
            RuntimeError: the MPS daemon did not start.
        """
        gone = blocks.reclaim_orphans()
        if gone:
            logging.getLogger(__name__).warning(
                "unlinked %d shared-memory block(s) that killed runs left on this node",
                len(gone))
        if mps_dir is not None:
            from gmi_drl.gmi.devices import discover

            self._mps = MPSDaemon(mps_dir, [g.uuid for g in discover().gpus])
            self._mps.start()
        if world_size is None:
            return None
        group, self._owner = ShmGroup.create(world_size, capacity, untracked_members=True)
        return group

    def terminate_mps_clients(self, pids: list[int]) -> list[int]:
        """End the GPU work of the MPS clients ``pids`` (GMI actors of this node) through the
        MPS control; returns those that were clients. A no-op without an MPS daemon."""
        return self._mps.terminate_clients(set(pids)) if self._mps is not None else []

    def adopt(self, name: str) -> None:
        """Unlink the block ``name``, made by a GMI actor of this node, at `close` if it is
        still there (its GMI was killed before its own clean-up)."""
        self._adopted.append(name)

    def close(self) -> list[str]:
        """Unlink the block and the GMIs' blocks left, and quit the MPS daemon (after the GMIs
        are gone); returns the GMIs' blocks it unlinked. Idempotent."""
        left, self._adopted = blocks.unlink(self._adopted), []
        if self._owner is not None:
            ShmGroup.destroy(self._owner)
            self._owner = None
        if self._mps is not None:
            self._mps.stop()
            shutil.rmtree(self._mps.directory, ignore_errors=True)
            self._mps = None
        return left
