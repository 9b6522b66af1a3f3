"""A real two-node Ray cluster on this machine, shared by the tests of this package and always
shut down after the last of them."""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.procs import shm_left

NODE_CPUS = 2
"""logical CPUs of each node: GMIs of 1 CPU pack onto one node, GMIs of 2 CPUs need both"""


@pytest.fixture(scope="package")
def ray_cluster():
    """Head node plus a second node (own raylet and object store, custom resource
    ``second_node``); both share this machine's /dev/shm, as two Ray nodes on one host do."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from gmi_drl.cluster.ray_launcher import LOCAL_SYSTEM_CONFIG

    # the settings of the local instance a run starts (its GMIs at nice 0), no prestarted workers
    config = {**LOCAL_SYSTEM_CONFIG, "enable_worker_prestart": False,
              "prestart_worker_first_driver": False}
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": NODE_CPUS, "include_dashboard": False,
                                      "_system_config": config})
    try:
        cluster.add_node(num_cpus=NODE_CPUS, resources={"second_node": 1})
        yield cluster
    finally:
        cluster.shutdown()


@contextlib.contextmanager
def connected(cluster):
    """This process connected to ``cluster`` for the block (the launcher connects by itself)."""
    import ray

    ray.init(address=cluster.address)
    try:
        yield ray
    finally:
        ray.shutdown()


def assert_nothing_left(cluster, pids=(), shm_before=None, timeout_s: float = 20.0) -> None:
    """No gmi-drl actor, no placement group, every CPU free, the given processes gone and no new
    shared-memory block, within ``timeout_s``."""
    with connected(cluster) as ray:
        deadline = time.monotonic() + timeout_s
        while True:
            named = [a for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["name"].startswith("gmi-drl-")]
            groups = [g for g in ray.util.placement_group_table().values()
                      if g["state"] != "REMOVED"]
            free = ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]
            alive = [p for p in pids if _alive(p)]
            shm = shm_left(shm_before, 0) if shm_before is not None else set()
            if not (named or groups or alive or shm) and free:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"left behind: actors {named}, placement groups {groups}, "
                            f"all CPUs free {free}, processes {alive}, shared memory {shm}")
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
