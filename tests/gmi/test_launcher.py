"""The local launcher: real GMI processes, reduction across them, crash and kill handling."""

import gc
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from gmi_drl.gmi.devices import discover
from gmi_drl.gmi.launcher import GMIError, launch
from gmi_drl.gmi.layout import plan
from tests.procs import (assert_group_gone, confined_tmp, descendants, fork_server, gmi_processes,
                         running, shm_entries, shm_left)

pytestmark = pytest.mark.distributed


def _children(me=None):
    """Live processes below ``me`` (this test process), except multiprocessing's resource
    tracker and fork server: GMIs, and what they started."""
    return descendants(os.getpid() if me is None else me)


@pytest.mark.parametrize("num_gmis, devices", [(3, 1), (2, 2), (3, 2)])
@pytest.mark.parametrize("reduction", ["auto", "ring"])
def test_gmis_reduce_to_the_mean_for_every_reduction(num_gmis, devices, reduction):
    before = _children()  # helpers earlier tests may have left (e.g. a forkserver)
    m = discover()
    lay = plan(num_gmis, m, num_devices=devices, reduction=reduction)
    out = launch("tests.gmi.gmi_targets:allreduce_rank", lay, m)
    mean = sum(range(num_gmis)) / num_gmis
    for values, cuda, affinity in out:
        assert values == pytest.approx([mean] * 5, abs=1e-6)
        assert cuda == "" and affinity  # cpu backend: no GPU visible, a core set
    assert not _children() - before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not discover().gpus,
                    reason="needs a CUDA device that NVML sees")
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_ring_over_gmis_sharing_one_gpu_reduces_cuda_and_cpu_tensors(device):
    """NCCL refuses two ranks on one GPU, and has no CPU tensors: the ring takes gloo then."""
    m = discover()
    lay = plan(2, m, backend="cuda_shared", reduction="ring")
    out = launch("tests.gmi.gmi_targets:allreduce_on_device", lay, m, payload=device)
    assert out == [(device, [0.5] * 4)] * 2


def test_a_stopped_run_kills_a_gmi_under_a_prefix_with_its_python(tmp_path):
    """A profiler prefix (nsys) runs the GMI's Python as its child; stopping the run must end
    that child too, not only the prefix the launcher started."""
    pid_file = tmp_path / "python.pid"
    prefix = tmp_path / "fake-profiler"
    prefix.write_text('#!/bin/sh\n"$@" &\necho $! > ' + str(pid_file) + '\nwait\n')
    prefix.chmod(0o755)
    m = discover()
    with pytest.raises(GMIError, match="GMI 0 raised"):
        launch("tests.gmi.gmi_targets:fail_on_one", plan(2, m), m, payload=0,
               prefixes={1: [str(prefix)]})
    python_pid = int(pid_file.read_text())
    deadline = time.time() + 5
    while os.path.exists(f"/proc/{python_pid}") and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{python_pid}"), "the GMI's Python outlived the run"


def test_a_raising_gmi_stops_the_run_with_its_traceback_within_5s():
    m = discover()
    kids_before = _children()
    before = shm_entries()
    with pytest.raises(GMIError, match=r"GMI 1 raised") as err:
        launch("tests.gmi.gmi_targets:fail_on_one", plan(3, m), m, payload=1)
    caught = time.time()
    assert "ValueError: GMI 1 failed on purpose" in str(err.value)
    summary = err.value.summary  # what the CLI prints: one line, the GMI's exception named
    assert summary.startswith("GMI 1 raised ValueError: GMI 1 failed on purpose at ")
    assert summary.endswith("; the run was stopped") and "\n" not in summary
    assert err.value.exception.startswith("ValueError: ") and "Traceback" in err.value.details
    failed_at = float(str(err.value).split("failed on purpose at ")[-1].split()[0])
    assert caught - failed_at < 5.0  # failure to a stopped run, all processes reaped
    assert not _children() - kids_before
    gc.collect()
    assert not shm_left(before)


def test_a_killed_gmi_is_reported():
    m = discover()
    before = _children()

    def kill_one():
        deadline = time.time() + 20
        while time.time() < deadline:
            kids = _children() - before
            if len(kids) >= 2:
                time.sleep(1.0)
                os.kill(max(kids), signal.SIGKILL)
                return
            time.sleep(0.1)

    threading.Thread(target=kill_one, daemon=True).start()
    with pytest.raises(GMIError, match="killed by signal 9"):
        launch("tests.gmi.gmi_targets:sleep_long", plan(2, m), m)
    assert not _children() - before


CTRL_C_SCRIPT = """
import faulthandler, signal
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it stands, should it hang
from gmi_drl.gmi.devices import discover
from gmi_drl.gmi.launcher import launch
from gmi_drl.gmi.layout import plan
m = discover()
print("launching", flush=True)
launch("tests.gmi.gmi_targets:sleep_long", plan(2, m), m)
"""


START_SCRIPT = """
import json, os, sys
from gmi_drl.gmi.devices import discover
from gmi_drl.gmi.launcher import COMPILER, launch
from gmi_drl.gmi.layout import plan
m, method, names = discover(), sys.argv[1], ["GMI_DRL_SET", "GMI_DRL_UNSET", "MUJOCO_GL"]
os.environ["GMI_DRL_UNSET"] = "before the first launch"
os.environ.pop("MUJOCO_GL", None)
first = launch("tests.gmi.gmi_targets:started_with", plan(2, m), m, names, start_method=method,
               preload=COMPILER)
os.environ["GMI_DRL_SET"] = "after the first launch"
del os.environ["GMI_DRL_UNSET"]
os.environ["MUJOCO_GL"] = "egl"
second = launch("tests.gmi.gmi_targets:started_with", plan(2, m), m, names, start_method=method)
print(json.dumps([first, second]))
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_both_start_methods_give_gmis_the_controllers_environment_at_launch(method):
    """Forked from the fork server, a GMI starts with its target's module (and the compiler)
    already imported; forked or spawned, it sees the controller's environment as it is at each
    launch (the server's is the one of the first launch), and inductor compiles on its own cores
    (the server set its compile threads from all of them). A GMI never renders: where the
    controller names no ``MUJOCO_GL`` it loads no OpenGL backend."""
    out = subprocess.run([sys.executable, "-c", START_SCRIPT, method], capture_output=True,
                         text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = json.loads(out.stdout.splitlines()[-1])
    forked = method == "forkserver"
    for gmis, env in [(first, {"GMI_DRL_SET": None, "GMI_DRL_UNSET": "before the first launch",
                               "MUJOCO_GL": "disable"}),
                      (second, {"GMI_DRL_SET": "after the first launch", "GMI_DRL_UNSET": None,
                                "MUJOCO_GL": "egl"})]:
        assert [g[:2] for g in gmis] == [[forked, env]] * 2
        for _, _, threads, cores in gmis:
            assert threads == (min(32, cores) if forked else None)
    assert sum(cores for *_, cores in first) <= len(os.sched_getaffinity(0))


def test_an_unknown_start_method_is_refused():
    m = discover()
    with pytest.raises(ValueError, match="start_method 'fork': use one of forkserver, spawn"):
        launch("tests.gmi.gmi_targets:allreduce_rank", plan(2, m), m, start_method="fork")


def test_ctrl_c_leaves_no_process_and_no_shared_memory(tmp_path):
    shm_before = shm_entries()
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                            env=confined_tmp(tmp_path))
    assert proc.stdout.readline().strip() == "launching"
    deadline = time.time() + 30
    while time.time() < deadline:  # wait until both GMIs run
        if len(gmi_processes(proc.pid)) >= 2:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:  # say where the controller hangs (once seen in a suite run)
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the controller did not exit 20 s after Ctrl-C; its threads:\n{err[-6000:]}")
    assert "KeyboardInterrupt" in err
    assert_group_gone(proc.pid, shm_before, tmp_path)


@pytest.mark.parametrize("method, cls", [("forkserver", "ForkServerProcess"),
                                         ("spawn", "SpawnProcess")])
def test_an_interrupt_as_a_gmi_starts_still_stops_it(monkeypatch, method, cls):
    """Ctrl-C handled the moment `Process.start` returns, before the launcher's next line: the
    GMI just started is stopped with the others, so the interpreter's exit (which joins every
    non-daemonic child without a timeout) has none left to wait on."""
    process = getattr(multiprocessing.context, cls)
    real_start = process.start
    started = []

    def start(self):
        real_start(self)
        started.append(self)
        if self.name == "gmi-1":
            raise KeyboardInterrupt

    monkeypatch.setattr(process, "start", start)
    m = discover()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch("tests.gmi.gmi_targets:sleep_long", plan(2, m), m, start_method=method)
        assert [p.name for p in started] == ["gmi-0", "gmi-1"]
        assert not [p.name for p in started if p.is_alive()], "a started GMI was left running"
    finally:
        for p in started:
            if p.is_alive():
                p.kill()


SERVER_DIES_SCRIPT = """
import sys
from gmi_drl.gmi.devices import discover
from gmi_drl.gmi.launcher import GMIError, launch
from gmi_drl.gmi.layout import plan
m = discover()
print("launching", flush=True)
try:
    launch("tests.gmi.gmi_targets:sleep_long", plan(2, m), m)
except GMIError as e:
    print(e.summary, flush=True)
    sys.stdin.readline()  # alive until the test has looked: GMIs end by themselves without it
    sys.exit(3)
"""


def test_a_fork_server_that_dies_stops_the_run_and_leaves_no_gmi():
    """With its fork server gone (SIGTERM to the process group kills it at once, and so can the
    OOM killer), the launcher can no longer learn its GMIs' exit status: every GMI reads as
    ended. The run must still stop, and the launcher must kill the GMIs that still run (while
    it lives, as a GMI whose controller is gone ends by itself)."""
    shm_before = shm_entries()
    proc = subprocess.Popen([sys.executable, "-c", SERVER_DIES_SCRIPT], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        assert proc.stdout.readline().strip() == "launching"
        deadline = time.time() + 60
        while len(gmis := gmi_processes(proc.pid)) < 2:
            assert time.time() < deadline, "the GMIs did not start"
            time.sleep(0.1)
        os.kill(fork_server(proc.pid), signal.SIGKILL)
        killed, line = time.time(), [None]
        reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout=15)  # the GMIs sleep 30 s: only the launcher ends them sooner
        assert line[0] is not None, "the run went on for 15 s after its fork server died"
        assert time.time() - killed < 10  # the launcher's grace period is 3 s
        assert "cannot be watched (the fork server that started it ended)" in line[0]
        assert proc.poll() is None
        assert not running(gmis), "the launcher left GMIs running"
        _, err = proc.communicate("\n", timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3, err[-3000:]
    assert_group_gone(proc.pid, shm_before)


def test_reduction_options_are_checked_before_any_process_starts():
    m = discover()
    lay = plan(2, m)
    with pytest.raises(ValueError, match="'bogus' is not a valid Reduction"):
        plan(2, m, reduction="bogus")
    with pytest.raises(ValueError, match="1 switch addresses for 2 GMIs"):
        launch("tests.gmi.gmi_targets:allreduce_rank", plan(2, m, reduction="switch"), m,
               service_addrs=["127.0.0.1:9"])
    with pytest.raises(ValueError, match="3 network namespaces for 2 GMIs"):
        launch("tests.gmi.gmi_targets:allreduce_rank", lay, m, netns=["a", "b", "c"])


def test_gmis_end_when_the_controller_is_killed(tmp_path):
    """A controller killed with SIGKILL cannot stop its GMIs: each ends itself within a
    heartbeat of noticing. (Its temporary directory stays, in ``tmp_path``: nothing runs a
    clean-up after SIGKILL.)"""
    shm_before = shm_entries()
    controller = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT], stdout=subprocess.PIPE,
                                  cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                                  env=confined_tmp(tmp_path))
    try:
        deadline = time.time() + 60
        while len(gmis := _children(controller.pid)) < 2:
            assert time.time() < deadline, "the GMIs did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # past their imports, in the target
    finally:
        controller.kill()
        controller.wait()
    deadline = time.time() + 5
    while any(os.path.exists(f"/proc/{pid}") for pid in gmis) and time.time() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in gmis if os.path.exists(f"/proc/{pid}")], "orphaned GMIs still run"
    deadline = time.time() + 5  # the resource tracker unlinks what the controller left
    while shm_left(shm_before) and time.time() < deadline:
        time.sleep(0.1)
    assert not shm_left(shm_before)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the drop)
def test_a_ctrl_c_that_cpython_drops_in_a_callback_is_raised_where_a_run_starts():
    """An interrupt that lands in a callback CPython runs for itself (here a weakref's, as the
    import system's module-lock clean-up is) is printed as "Exception ignored" and lost; the
    CLI's commands note it, and a run or a probe raises it again before it starts."""
    import weakref

    from gmi_drl.interrupts import noting_interrupts, raise_if_interrupted

    class Anything:
        pass

    with noting_interrupts():
        raise_if_interrupted()  # nothing came yet
        thing = Anything()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
        del thing  # the callback runs, the handler's KeyboardInterrupt is dropped there
        assert ref() is None
        with pytest.raises(KeyboardInterrupt):
            raise_if_interrupted()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
