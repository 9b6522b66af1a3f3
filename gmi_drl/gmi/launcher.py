"""The local launcher: one process per GMI, its backend environment set before CUDA starts.

Each GMI process applies its `process_env` (variables, CPU affinity, thread count), joins its
network namespace if it was given one (before it opens a socket or starts a thread), beats a
heartbeat, and runs ``target(ctx)`` with a `gmi_drl.gmi.context.GMIContext` (its reducer is the
layout's reduction, built when the target asks for it). The launcher watches them: a GMI that raises, dies or stops beating stops the whole run within
``poll_s`` + ``grace_s`` seconds with the GMI id and the original traceback, and no process or
shared-memory segment is left behind (also on Ctrl-C).

A GMI's Python can run under a command prefix (``nsys profile ...``: `launch`'s ``prefixes``):
multiprocessing's spawn then starts a two-line shell script that ``exec``s the prefix with the
interpreter and spawn's own arguments, so the process keeps the pipe spawn hands it.

Every other GMI is forked by multiprocessing's fork server (``start_method="forkserver"``, the
default), which imports torch and the GMI loops once per controller process (`PRELOAD`, and
`COMPILER` for a run that compiles): a GMI then starts without an interpreter and those imports
of its own (docs/benchmarks.md, "Starting GMIs: fork server against spawn"). The server never
runs a torch operation nor touches CUDA, so forking from it is safe, and CUDA reads a GMI's
device variables when the GMI first uses it. A forked GMI's ``os.environ`` is the controller's
as it is at `launch`, as a spawned one's is, not the server's; what torch reads from the
environment when it is imported (``TORCH_LOGS``, ``TORCHINDUCTOR_*``) comes from the server's
start, the first launch, except inductor's compile threads, which each GMI sets again for its
own cores. ``start_method="spawn"`` starts a fresh interpreter per GMI.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing as mp
import os
import queue
import shlex
import signal
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Sequence

from gmi_drl.comm.reduction import Reduction
from gmi_drl.errors import exception_line
from gmi_drl.interrupts import raise_if_interrupted
from gmi_drl.gmi.backends import BackendKind, MPSDaemon, process_env
from gmi_drl.gmi.context import GMIContext, ReductionGroup, shm_group_sizes
from gmi_drl.gmi.devices import Machine
from gmi_drl.gmi.layout import Layout

log = logging.getLogger(__name__)

#: modules the fork server imports once, so that no GMI imports them itself (`launch` adds its
#: target's module: the GMI loop of a training run)
PRELOAD = ("torch", "gmi_drl.gmi.launcher")
#: what a run that compiles its gradient step adds to `PRELOAD` (2 s of imports on machine A)
COMPILER = ("torch._dynamo",)
START_METHODS = ("forkserver", "spawn")


NO_RENDERING = "disable"
"""``MUJOCO_GL`` for processes that never render (GMIs, a training controller) where the user
set none: ``import mujoco`` then loads no OpenGL backend. The default one, GLFW, checks its
library's version in a Python subprocess, which costs a start-up and, when Ctrl-C reaches the
process group during it, prints that subprocess's traceback."""


def mp_context(start_method: str, preload: Sequence[str] = ()):
    """The multiprocessing context of ``start_method``; the fork server's imports `PRELOAD` and
    ``preload`` when this process starts it (a server already running keeps what it has).

    Raises:
        ValueError: not one of `START_METHODS`.
    """
    if start_method not in START_METHODS:
        raise ValueError(f"start_method {start_method!r}: use one of {', '.join(START_METHODS)}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload([*PRELOAD, *preload])
        _start_fork_server()
    return ctx


def _start_fork_server() -> None:
    """Start multiprocessing's fork server (if it is not running) with SIGINT and SIGHUP
    ignored: the server ignores SIGINT itself only once its preload imports are done, and a
    Ctrl-C during those seconds printed their traceback on the terminal; a hangup (the terminal
    closed) reaches the whole process group, and is the controller's to handle: it stops the
    GMIs as after Ctrl-C. An ignored signal stays ignored across the server's exec and in the
    GMIs it forks; the controller's own handling is unchanged, and a GMI sets its SIGINT and
    SIGTERM handlers first thing (`_gmi_main`). The server is this process's for good: any
    other child it forks later (multiprocessing's forkserver context, used outside gmi-drl)
    starts with both ignored too."""
    from multiprocessing import forkserver, util

    with signals_ignored(signal.SIGINT, signal.SIGHUP):
        try:
            forkserver.ensure_running()
        except OSError as e:
            if "AF_UNIX path too long" not in str(e):
                raise
            raise OSError(f"the GMIs' fork server listens on a socket in {util.get_temp_dir()}, "
                          "a path too long for a UNIX socket (108 bytes): set TMPDIR to a "
                          "shorter directory (TMPDIR=/tmp)") from None


@contextlib.contextmanager
def signals_ignored(*signums: int):
    """Ignore ``signums`` inside the block, then restore their handlers: a helper process
    started inside (the fork server, multiprocessing's resource tracker, a local Ray instance)
    keeps them ignored for good, across its exec, so a signal to the whole process group (Ctrl-C,
    a hangup) is left to this process to handle. Only the main thread sets dispositions; in
    another thread the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_deferred(*signums: int):
    """Hold ``signums`` inside the block and deliver them, to the handlers they had, once it
    has ended: a step that must not be cut in the middle (a child whose pid is not known yet
    would be left running) finishes first. A signal ignored before stays ignored; in another
    thread than the main one the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
                for s in signums if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)


class GMIError(RuntimeError):
    """A GMI raised, died or hung; the run was stopped.

    Attributes:
        summary: one line: which GMI, what happened (for a GMI that raised, its exception).
        details: the GMI's traceback, or ``""``.
        exception: the exception a GMI raised, in one line (``"EnvWorkerError: ..."``), or
            ``""`` (it died or hung).
    """

    def __init__(self, summary: str, details: str = "", exception: str = "") -> None:
        super().__init__(summary + (f":\n{details}" if details else ""))
        self.summary, self.details, self.exception = summary, details, exception

    @classmethod
    def raised(cls, gmi_id: int, tb: str) -> "GMIError":
        """GMI ``gmi_id`` raised; ``tb`` is its formatted traceback."""
        line = exception_line(tb)
        code = line.removeprefix("SystemExit: ")
        if code.isdigit() and 128 < int(code) < 128 + signal.NSIG:  # `_stop_once`'s exit
            name = signal.Signals(int(code) - 128).name
            return cls(f"GMI {gmi_id} was stopped by {name} from outside the run; the run was "
                       "stopped", tb, line)
        return cls(f"GMI {gmi_id} raised {line}; the run was stopped", tb, line)


def _gmi_main(gmi_id, environ, env, affinity, threads, target, ctx, beats, results, netns,
              controller):
    if environ is not None:  # forked by the fork server: the controller's environment at
        os.environ.clear()  # launch, not the server's (a spawned GMI has its own, with what a
        os.environ.update(environ)  # prefix such as nsys added)
    os.environ.update(env)  # before anything initialises CUDA
    os.environ.setdefault("MUJOCO_GL", NO_RENDERING)
    if affinity:
        os.sched_setaffinity(0, affinity)
    inductor = sys.modules.get("torch._inductor.config")  # preloaded: set from the server's
    if inductor is not None and inductor.compile_threads is not None:  # cores and environment
        inductor.compile_threads = inductor.decide_compile_threads()  # at its start, not ours
    if netns is not None:  # before any socket or thread: both stay in the namespace
        _enter_netns(netns)
    import torch

    torch.set_num_threads(threads)

    def beat():  # and end this GMI when the controller is gone (killed: no one would stop it)
        while True:
            beats[gmi_id] = time.time()
            time.sleep(0.5)
            try:
                os.kill(controller, 0)
            except ProcessLookupError:
                os._exit(70)

    threading.Thread(target=beat, daemon=True, name="gmi-heartbeat").start()
    signal.signal(signal.SIGTERM, _stop_once)
    signal.signal(signal.SIGINT, _stop_once)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a hangup is the controller's: it stops us
    try:
        results.put(("ok", gmi_id, run_target(target, ctx)))
    except BaseException:
        results.put(("error", gmi_id, traceback.format_exc()))
    finally:  # past the target, a stop may kill outright: an exception in atexit would print
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_once(signum: int, _frame) -> None:
    """A GMI's handler of Ctrl-C (SIGINT to the terminal's process group) and of `_stop`'s
    SIGTERM: the first of them unwinds the target as an exception, so that it leaves its group
    and closes its shared memory; later ones do nothing, since `_stop` follows Ctrl-C at once
    and would cut that clean-up short (SIGKILL follows a grace period anyway). It ignores
    them by returning, not by setting SIG_IGN: a signal that arrived before such a change and
    is handled after it makes Python raise ``OSError`` ("ignored due to race condition")."""
    global _STOPPING
    if _STOPPING:
        return
    _STOPPING = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(128 + signum)


_STOPPING = False


def run_target(target: str, ctx: GMIContext) -> Any:
    """Inside a GMI process: import ``target`` (``"package.module:function"``), call it with
    ``ctx``, let CUDA finish, leave the reduction group; return what the target returned.
    Both launchers (local processes, Ray actors) run a GMI through this one function."""
    import torch

    module, name = target.split(":")
    try:
        result = getattr(importlib.import_module(module), name)(ctx)
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()  # an MPS client must finish its GPU work before it exits
    except BaseException:  # failed or stopped: still leave, or a switch holds the job (and
        with contextlib.suppress(Exception), _cleaning_up():  # refuses the resumed run)
            ctx.close()
        raise
    with _cleaning_up():
        ctx.close()
    return result


@contextlib.contextmanager
def _cleaning_up():
    """Leaving the reduction group takes a moment that the stop, which follows Ctrl-C at once,
    must not cut short (SIGKILL follows a grace period anyway): in a GMI process `_stop_once`
    ignores Ctrl-C and SIGTERM from here on; in the main thread of the controller (a GMI run in
    its process) SIGTERM and a hangup wait for the block."""
    global _STOPPING
    if signal.getsignal(signal.SIGTERM) is _stop_once:
        _STOPPING = True
        yield
        return
    try:
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGHUP)}
    except ValueError:  # not the main thread (a Ray actor's, a serial GMI's): nothing to defer
        yield
        return
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _signals_deferred(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM,
                                                 signal.SIGHUP)):
    """Hold Ctrl-C, SIGTERM and a hangup until the block ends, then handle the first that came
    as the handler in place would have. Around a GMI's start: interrupted inside it, the controller
    never learned the pid of a child the fork server forked anyway, so `_stop` could not stop
    it, and the child, unpickling the queue the controller had just unlinked, printed a
    traceback. The wait is the fork server's (its imports, at the first start: seconds)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old: dict[int, Any] = {}
    try:
        for n in signums:
            old[n] = signal.signal(n, lambda signum, _frame: pending.append(signum))
        yield
    finally:
        for n, handler in old.items():
            signal.signal(n, handler)
        if pending:
            handler = old[pending[0]]
            if callable(handler):
                handler(pending[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), pending[0])


def _enter_netns(name: str) -> None:
    """Join network namespace ``name``; gloo binds to its one non-loopback interface unless
    ``GLOO_SOCKET_IFNAME`` says otherwise."""
    import socket

    from gmi_drl.comm.switch.netns import enter_netns

    enter_netns(name)
    devs = [dev for _, dev in socket.if_nameindex() if dev != "lo"]
    if len(devs) == 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", devs[0])


def launch(target: str, layout: Layout, machine: Machine, payload: Any = None,
           reducer_capacity: int = 1 << 20, heartbeat_timeout_s: float = 60.0,
           poll_s: float = 0.2, service_addrs: Sequence[str] = (),
           netns: Sequence[str] | None = None, prefixes: dict[int, list[str]] | None = None,
           exit_timeout_s: float = 5.0, tolerate: frozenset[int] = frozenset(),
           job_id: str | None = None, token: str = "",
           start_method: str = "forkserver", preload: Sequence[str] = (),
           staleness: int = 0) -> list[Any]:
    """Run ``target(ctx)`` in one process per GMI of ``layout``; return the results by gmi_id.

    Args:
        target: ``"package.module:function"`` taking a `GMIContext`.
        layout: from `gmi_drl.gmi.layout.plan`; its ``reduction`` says how the GMIs reduce.
        machine: discovered devices.
        payload: a picklable argument every GMI receives.
        reducer_capacity: most float32 values one `allreduce_` may carry (shared-memory sizing).
        heartbeat_timeout_s: a GMI silent this long counts as hung.
        service_addrs: with the ``switch`` / ``ps`` reductions, the ``HOST:PORT`` GMI k
            aggregates through (its switch, the parameter server) at index k.
        netns: network namespace of GMI k at index k (root; e.g. the worker hosts of an
            emulated rack, `gmi_drl.comm.switch.netns.Rack`); ``None``: this process's.
        prefixes: per GMI id, a command its Python interpreter runs under (e.g. the
            `gmi_drl.telemetry.profiler.nsys_command`); other GMIs run Python directly.
        exit_timeout_s: after every GMI returned, how long each may take to exit by itself
            before it is terminated (a profiler running it writes its report then).
        tolerate: GMI ids whose failure (raised, died, hung) does not stop the run: it is
            logged with the GMI id, and its result is ``None``.
        job_id, token: the run's job id at an aggregation switch (``None``: one per launch)
            and the switch's shared secret.
        start_method: ``"forkserver"``: GMIs forked from a server that imported `PRELOAD`
            once per controller process; ``"spawn"``: a fresh interpreter each. A GMI under a
            prefix is always spawned.
        preload: modules the fork server imports besides `PRELOAD` (e.g. `COMPILER`), if
            this launch starts it.
        staleness: with the ``ps`` reduction, the staleness bound S of an asynchronous
            parameter server group (0: synchronous; `ReductionGroup`).

    Raises:
        ValueError: ``service_addrs`` / ``netns`` not one per GMI, or an unknown
            ``start_method``.
        GMIError: a GMI raised (its traceback in ``details``), died, or hung.
    """
    from gmi_drl.comm.shm import ShmGroup

    raise_if_interrupted()
    mpctx = mp_context(start_method, (target.partition(":")[0], *preload))
    n = layout.num_gmis
    if layout.reduction in (Reduction.SWITCH, Reduction.PS) and n > 1 and \
            len(service_addrs) != n:
        raise ValueError(f"{len(service_addrs)} {layout.reduction.value} addresses for {n} GMIs")
    if netns is not None and len(netns) != n:
        raise ValueError(f"{len(netns)} network namespaces for {n} GMIs")
    made = [ShmGroup.create(size, reducer_capacity) for size in shm_group_sizes(layout)]
    owners = [o for _, o in made]
    tmp = tempfile.mkdtemp(prefix="gmi-drl-")
    group = ReductionGroup(tuple(g for g, _ in made), f"file://{tmp}/rendezvous",
                           tuple(service_addrs), job_id or f"gmi-drl-{os.getpid()}", token,
                           staleness)
    del made
    mps = None
    if layout.backend is BackendKind.CUDA_MPS:
        mps = MPSDaemon(os.path.join(tmp, "mps"), [g.uuid for g in machine.gpus])
        mps.start()
    beats = mpctx.Array("d", [time.time()] * n, lock=False)
    results = mpctx.Queue()
    procs, error = [], None
    try:
        _start(procs, mpctx, layout, machine, target, payload, group, beats, results,
               os.path.join(tmp, "mps") if mps else None, netns, prefixes or {}, tmp)
        try:
            out = _watch(procs, results, beats, heartbeat_timeout_s, poll_s, tolerate)
            deadline = time.time() + exit_timeout_s
            for p in procs:
                p.join(timeout=max(0.0, deadline - time.time()))
            return out
        except GMIError as e:
            error = (e.summary, e.details, e.exception)  # re-raised below, without frames that hold the queue and barriers
    finally:
        _stop(procs, frozenset(prefixes or ()))
        results.close()
        # drop our references so the named semaphores of spawn (queue, barriers) are unlinked
        # now rather than whenever a traceback holding this frame is collected
        del results, beats, group, procs
        for owner in owners:
            ShmGroup.destroy(owner)
        if mps is not None:
            mps.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    raise GMIError(*error)


def _start(procs: list, mpctx, layout, machine, target, payload, group, beats, results,
           mps_dir, netns, prefixes, tmp) -> None:
    """Start every GMI, appending each to ``procs`` just before it starts (so that an interrupt
    midway still stops those already running: they are not daemonic)."""
    for spec in layout.specs:
        env, aff, threads = process_env(spec, machine, len(layout.mpl[spec.device]), mps_dir)
        ns = None if netns is None else netns[spec.gmi_id]
        ctx = GMIContext(spec.gmi_id, layout, payload, group)
        # not daemonic: a GMI starts env worker processes of its own (the gymnasium engine),
        # which a daemonic process may not; the launcher stops its GMIs itself (`_stop`), and a
        # GMI whose controller died exits on its own (the heartbeat checks the controller pid)
        prefix = prefixes.get(spec.gmi_id)
        pctx = mpctx if prefix is None else mp.get_context("spawn")
        environ = dict(os.environ) if pctx.get_start_method() == "forkserver" else None
        p = pctx.Process(target=_gmi_main, name=f"gmi-{spec.gmi_id}", daemon=False,
                         args=(spec.gmi_id, environ, env, aff, threads, target, ctx, beats,
                               results, ns, os.getpid()))
        # listed before it starts: a Ctrl-C handled as `start` returns must still find it, or
        # `_stop` would pass it by and the interpreter's exit would wait on it for good
        # (multiprocessing joins every non-daemonic child at exit, without a timeout)
        procs.append(p)
        if prefix is None:
            with _signals_deferred():
                p.start()
                p.started_ticks = (_proc_stat(p.pid) or ("", None))[1]  # see `_running`
        else:
            with _interpreter(pctx, _prefixed_python(prefix, tmp, spec.gmi_id)):
                p.start()


def _prefixed_python(prefix: list[str], tmp: str, gmi_id: int) -> str:
    """Write an executable script that runs this interpreter under ``prefix``; return its path.

    The prefix (``nsys profile``) runs the interpreter as its child, so the process the
    launcher holds is the prefix's: ``setsid`` makes it the leader of a process group of its
    own (same pid, no fork), and `_stop` signals that whole group, the GMI's Python included.
    """
    path = os.path.join(tmp, f"gmi-{gmi_id}-python")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec setsid {shlex.join([*prefix, sys.executable])} "$@"\n')
    os.chmod(path, 0o755)
    return path


@contextlib.contextmanager
def _interpreter(mpctx, executable: str):
    """Spawn children with ``executable`` inside the block (the setting is process-wide)."""
    from multiprocessing import resource_tracker, spawn

    resource_tracker.ensure_running()  # with the real interpreter, never under the prefix
    previous = spawn.get_executable()
    mpctx.set_executable(executable)
    try:
        yield
    finally:
        mpctx.set_executable(previous)


def _watch(procs, results, beats, heartbeat_timeout_s, poll_s,
           tolerate: frozenset[int] = frozenset()) -> list[Any]:
    n, done = len(procs), {}

    def failed(g: int, error: GMIError) -> None:
        if g not in tolerate:
            raise error
        log.warning("%s; the run goes on without it", error.summary.removesuffix(
            "; the run was stopped"))
        _signal(procs[g], signal.SIGKILL)
        done[g] = None

    def received(status: str, g: int, value) -> None:
        if status == "error":
            killed = _killed_sibling(procs, g, done)
            if killed is not None:  # the cause, not its peer's broken collective
                code = -procs[killed].exitcode
                failed(killed, GMIError(f"GMI {killed} was killed by signal {code} without a "
                                        "result; the run was stopped",
                                        f"GMI {g} then raised:\n{value}"))
            failed(g, GMIError.raised(g, value))
        else:
            done[g] = value

    while len(done) < n:
        try:
            received(*results.get(timeout=poll_s))
            continue
        except queue.Empty:
            pass
        now = time.time()
        for g, p in enumerate(procs):
            if g in done:
                continue
            if p.exitcode is not None:
                try:  # its last words may still be in the queue
                    received(*results.get(timeout=1.0))
                    continue
                except queue.Empty:
                    pass
                failed(g, GMIError(_ended(g, p)))
            elif now - beats[g] > heartbeat_timeout_s:
                failed(g, GMIError(f"GMI {g} sent no heartbeat for {now - beats[g]:.0f} s "
                                   "(hung); the run was stopped"))
    return [done[g] for g in range(n)]


_KILLS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
"""signals that kill a GMI from outside (kill, the OOM killer, a terminal), not a crash of its
own (an abort or a segfault may follow a peer's failure)"""


def _killed_sibling(procs, g: int, done: dict, wait_s: float = 0.5) -> int | None:
    """A GMI other than ``g`` (and not finished) that a signal of `_KILLS` killed, waiting up
    to ``wait_s`` for it to be reaped: when a GMI is killed, its peers in a collective (gloo)
    raise a connection error within moments, so the first error to arrive is not the cause."""
    deadline = time.time() + wait_s
    while True:
        for k, p in enumerate(procs):
            if (k != g and k not in done and p.exitcode is not None
                    and -p.exitcode in _KILLS):
                return k
        if time.time() >= deadline:
            return None
        time.sleep(0.05)


def _ended(g: int, p) -> str:
    """What became of GMI ``g``, whose process reads as ended without a result."""
    if _running(p):
        return (f"GMI {g} cannot be watched (the fork server that started it ended); the run "
                "was stopped")
    code = p.exitcode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    if code == _NO_STATUS and isinstance(p, mp.context.ForkServerProcess):
        how += " (or the fork server that started it ended)"
    return f"GMI {g} {how} without a result; the run was stopped"


_NO_STATUS = 255
"""the exit code multiprocessing gives a forked GMI whose fork server ended before reporting"""


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks)`` of process ``pid`` from /proc, or ``None``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _running(p) -> bool:
    """Whether GMI process ``p`` may still run. A forked GMI's exit status comes from the fork
    server: with the server gone (SIGTERM to the process group ends it at once, and so may the
    OOM killer), multiprocessing reads every GMI as ended with `_NO_STATUS`, so the kernel is
    asked whether the process still exists: under its pid, not a zombie, and started when the
    GMI did (the pid of one that ended may have been given to another process since)."""
    if p.is_alive():
        return True
    if not isinstance(p, mp.context.ForkServerProcess) or p.exitcode != _NO_STATUS:
        return False
    stat = _proc_stat(p.pid)
    return (stat is not None and stat[0] != "Z"
            and stat[1] == getattr(p, "started_ticks", None))


def _signal(p, sig: int) -> None:
    """Send ``sig`` to GMI process ``p`` if it may still run."""
    try:
        if _running(p):
            os.kill(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _wait(p, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for GMI process ``p`` to end (a forked GMI whose server ended
    cannot be joined: its state is polled)."""
    deadline = time.time() + timeout_s
    p.join(timeout=timeout_s)
    while _running(p) and time.time() < deadline:
        time.sleep(0.05)


def _stop(procs, grouped: frozenset[int] = frozenset(), grace_s: float = 3.0) -> None:
    """Terminate, then kill, every GMI still running (``procs`` may end with one that never
    started); a GMI in ``grouped`` (started under a prefix, `_prefixed_python`) with its whole
    process group."""
    def signal_gmi(g: int, p, sig: int) -> None:
        if g not in grouped:
            return _signal(p, sig)
        try:
            os.killpg(p.pid, sig)  # the prefix and the GMI's Python under it
        except (ProcessLookupError, PermissionError):
            pass  # already gone

    # a GMI whose start raised (or was interrupted before its pid was recorded) has no pid
    started = [(g, p) for g, p in enumerate(procs) if p.pid is not None]
    for g, p in started:
        signal_gmi(g, p, signal.SIGTERM)
    deadline = time.time() + grace_s
    for g, p in started:
        _wait(p, max(0.0, deadline - time.time()))
        if _running(p) or g in grouped:
            signal_gmi(g, p, signal.SIGKILL)
            _wait(p, 1.0)
