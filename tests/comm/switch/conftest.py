import multiprocessing as mp
import os
import time

import pytest

from gmi_drl.comm.switch.dataplane import native_plane_error
from tests.comm.switch.harness import Switch

NATIVE = native_plane_error()
PLANES = [pytest.param("python", id="py"),
          pytest.param("native", id="native", marks=pytest.mark.skipif(
              NATIVE is not None, reason=f"{NATIVE}"))]


def _socket_inodes() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out.add(link)
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    """Every socket this test opened is closed and every process it started is gone."""
    before = _socket_inodes()
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (mp.active_children() or _socket_inodes() - before):
        time.sleep(0.05)
    assert not mp.active_children(), f"processes left: {mp.active_children()}"
    assert not _socket_inodes() - before, "sockets left open"


@pytest.fixture(params=PLANES)
def data_plane(request) -> str:
    """Each test that takes it runs once per data plane (``--data-plane python`` / ``native``)."""
    return request.param


@pytest.fixture
def switches(data_plane):
    """Factory of loopback switch daemons on ``data_plane``; all stopped (and checked to exit 0)
    afterwards."""
    made: list[Switch] = []

    def make(*args: str, bind: str = "127.0.0.1:0") -> Switch:
        s = Switch("--data-plane", data_plane, *args, bind=bind)
        made.append(s)
        return s

    yield make
    for s in made:
        if s.proc.returncode is None:
            assert s.stop() == 0, s.stderr


@pytest.fixture(scope="session", autouse=True)
def forkserver_warm():
    """Start the forkserver (it lives for the session) before any leak baseline is taken."""
    from tests.comm.switch.harness import ctx

    p = ctx().Process(target=time.sleep, args=(0,))
    p.start()
    p.join()
    yield
