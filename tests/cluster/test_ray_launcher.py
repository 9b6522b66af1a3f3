"""The Ray launcher on a real two-node local cluster: reduction, environment, failures."""

import os
import re

import pytest

import gmi_drl
from gmi_drl.gmi.devices import Machine
from gmi_drl.gmi.launcher import GMIError
from gmi_drl.gmi.layout import plan
from tests.cluster.conftest import NODE_CPUS, assert_nothing_left
from tests.procs import shm_entries

pytest.importorskip("ray")
from gmi_drl.cluster.ray_launcher import PlacementError, launch  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

CPU_ONLY = Machine((), tuple(sorted(os.sched_getaffinity(0))), "no GPU: test")


def test_gmis_reduce_to_the_mean_with_their_backend_env(ray_cluster):
    """Three GMIs of one CPU on two nodes of two: two share a node (shared memory), the third
    is alone on the other (gloo between the node leaders). The one-node case (MPR) is covered
    by the CLI test of test_ray_training.py. (Each GMI's runtime env needs a Ray worker of its
    own: 58 s for the three under the full suite's load when they ran at Ray's nice 15, hence
    180 s.)"""
    run = launch("tests.cluster.targets:reduce_and_report", plan(3, CPU_ONLY),
                 address=ray_cluster.address, num_cpus_per_gmi=1, placement_timeout_s=180,
                 runtime_envs=[{"env_vars": {"GMI_TAG": f"tag-{g}"}} for g in range(3)])
    assert sorted(len(gmis) for gmis in run.layout.mpl) == [1, 2]
    assert run.layout.reduction.value == "har" and run.restarts == 0
    assert len({n.node_id for n in run.nodes}) == 2
    for g, (values, env, module, used, nice) in enumerate(run.results):
        assert values == pytest.approx([1.0] * 5, abs=1e-6)  # mean of 0, 1, 2
        # the backend's variables and the extra per-actor runtime_env reached the actor
        assert env == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "GMI_TAG": f"tag-{g}",
                       "GMI_NUM_CPUS": "1"}
        assert module == gmi_drl.__file__  # the workers run this checkout's code
        assert used == "har"
        assert nice == 0  # LOCAL_SYSTEM_CONFIG, which the cluster of these tests starts with
    assert_nothing_left(ray_cluster)


@pytest.mark.parametrize("how, message", [("exit", "died"), ("raise", "raised")])
def test_a_failing_gmi_is_named_with_its_node_and_nothing_is_left(ray_cluster, tmp_path, how,
                                                                 message):
    shm_before = shm_entries()
    with pytest.raises(GMIError) as err:
        launch("tests.cluster.targets:fail_on_one", plan(2, CPU_ONLY), (how, str(tmp_path)),
               address=ray_cluster.address, num_cpus_per_gmi=2, placement_timeout_s=180)
    text = str(err.value)
    pid = int((tmp_path / "gmi-1.pid").read_text())
    m = re.match(rf"GMI 1 \(Ray actor pid {pid} on node ([0-9a-f]{{12}}) at ([\d.]+)\) "
                 rf"{message}", text)
    assert m, text
    assert "the run was stopped" in text
    if how == "raise":
        assert "ValueError: GMI 1 failed on purpose" in text  # the GMI's own traceback
        assert err.value.summary.endswith(  # its own exception, not Ray's wrapper
            "raised ValueError: GMI 1 failed on purpose; the run was stopped"), err.value.summary
    pids = [int(p.read_text()) for p in tmp_path.glob("gmi-*.pid")]
    assert len(pids) == 2
    assert_nothing_left(ray_cluster, pids, shm_before)


def test_a_ray_address_where_no_cluster_listens_is_refused_at_once():
    import socket
    import time

    with socket.socket() as free:  # a loopback port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match=rf"no Ray cluster at 127.0.0.1:{port} "
                       r"\(Connection refused\); start one with `ray start --head`"):
        launch("tests.cluster.targets:reduce_and_report", plan(1, CPU_ONLY),
               address=f"127.0.0.1:{port}", num_cpus_per_gmi=1, placement_timeout_s=5)
    assert time.monotonic() - t0 < 10


def test_a_loopback_switch_for_gmis_on_several_hosts_is_refused():
    """GMIs on another host would reach their own loopback, not the switch; Ray nodes of one
    host (as in these tests' cluster) share theirs."""
    from gmi_drl.cluster.membership import NodeInfo
    from gmi_drl.cluster.ray_launcher import _check_switch_reachable

    one_host = [NodeInfo("a" * 12, "10.0.0.1", 1), NodeInfo("b" * 12, "10.0.0.1", 2)]
    two_hosts = [NodeInfo("a" * 12, "10.0.0.1", 1), NodeInfo("b" * 12, "10.0.0.2", 2)]
    for addr in ("127.0.0.1:9", "localhost:9", "[::1]:9"):
        _check_switch_reachable(addr, one_host)
        with pytest.raises(PlacementError, match=rf"gmi.switch_addr={re.escape(addr)} is a "
                           r"loopback address, but Ray placed the GMIs on 2 hosts"):
            _check_switch_reachable(addr, two_hosts)
    _check_switch_reachable("10.0.0.9:9", two_hosts)
    _check_switch_reachable("switch.example:9", two_hosts)  # a name: resolved on each host
    with pytest.raises(PlacementError, match=r"gmi.ps_addr=127.0.0.1:9 is a loopback address, "
                       r"but .* give the parameter server's address"):
        _check_switch_reachable("127.0.0.1:9", two_hosts, "ps")


def test_a_cluster_too_small_is_refused_in_time(ray_cluster, caplog):
    with pytest.raises(PlacementError, match="could not place 2 GMI bundles"):
        launch("tests.cluster.targets:reduce_and_report", plan(2, CPU_ONLY),
               address=ray_cluster.address, num_cpus_per_gmi=3, placement_timeout_s=2)
    assert (f"the GMIs need 6 CPU, more than the cluster has ({2 * NODE_CPUS} CPU)"
            in caplog.text)  # said at once, before the wait
    assert_nothing_left(ray_cluster)


def test_a_gmi_larger_than_every_node_is_named_at_once(ray_cluster, caplog):
    """Two nodes of NODE_CPUS: a GMI of NODE_CPUS + 1 CPUs fits the cluster's total but no
    node, which Ray would wait for in silence."""
    with pytest.raises(PlacementError, match=rf"no node has more than {NODE_CPUS:g} CPU"):
        launch("tests.cluster.targets:reduce_and_report", plan(1, CPU_ONLY),
               address=ray_cluster.address, num_cpus_per_gmi=NODE_CPUS + 1,
               placement_timeout_s=2)
    assert (f"a GMI's bundle needs {NODE_CPUS + 1:g} CPU, and no node has more than "
            f"{NODE_CPUS:g} CPU" in caplog.text)  # said at once, before the wait
    assert_nothing_left(ray_cluster)
