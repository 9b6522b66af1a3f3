"""`EnvPool.xla()` (`gmi_drl.envs.xla`): a pool stepped inside ``jax.jit`` through XLA FFI
handlers equals the Python loop bit for bit (the C++ CartPole, MuJoCo and Atari cores, full and
partial batches), and bad input is refused with the pool's message, nothing sent.

JAX runs in one spawned interpreter per module (`jax_process`), never in pytest's process: its
later tests fork env workers, and a fork after JAX started its threads may deadlock (JAX warns).
Skipped where jax is not installed (but for the message that says so); where it is, a missing
``gmi_drl.envs._xla_ffi`` fails (``make test`` builds it after installing jax)."""

from __future__ import annotations

import concurrent.futures
import gc
import importlib.util
import multiprocessing
import sys

import numpy as np
import pytest

from gmi_drl import envs
from gmi_drl.envs import atari_native, cartpole_native, mujoco_threads
from gmi_drl.envs import xla as envs_xla

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                               reason="pool.xla() needs the optional jax extra "
                               "(pip install -e '.[jax]')")
needs_cartpole = pytest.mark.skipif(cartpole_native.UNAVAILABLE is not None,
                                    reason=f"{cartpole_native.UNAVAILABLE}")
needs_mujoco = pytest.mark.skipif(mujoco_threads.unavailable_reason() is not None,
                                  reason=f"{mujoco_threads.unavailable_reason()}")
needs_atari = pytest.mark.skipif(atari_native.core is None,
                                 reason=f"{atari_native.unavailable_reason}")
pytestmark = pytest.mark.xdist_group("jax")  # one worker, one spawned JAX process


@pytest.fixture(scope="module")
def jax_process():
    """A spawned interpreter that runs the ``_case_*`` functions (``submit(fn, *args).result()``
    re-raises what they raise)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as ex:
        yield ex


def _jax():
    import jax
    import jax.numpy as jnp

    return jax, jnp


def test_without_jax_xla_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax raises ImportError
    with envs.make("CartPole-v1", 2, engine="numpy") as pool:
        with pytest.raises(ImportError, match=r"needs jax .*pip install 'gmi-drl\[jax\]'"):
            pool.xla()


@needs_jax
def test_ffi_module_is_built(jax_process):
    """With jax installed the FFI module must be built (setup.py; `make test` builds it)."""
    jax_process.submit(_case_ffi_module_is_built).result()


def _case_ffi_module_is_built():
    assert envs_xla.unavailable_reason() is None, envs_xla.unavailable_reason()


def _cartpole_policy(obs):
    """Push against the pole's lean (episodes end fast): ``(n,)`` int32 from ``obs (n, 4)``
    (NumPy or jax)."""
    return (obs[:, 2] + 0.5 * obs[:, 3] < 0).astype(np.int32)


def _python_cartpole(pool, steps):
    obs, _ = pool.reset()
    rows = []
    for _ in range(steps):
        obs, rew, term, trunc, info = pool.step(_cartpole_policy(obs))
        rows.append([np.array(x) for x in (obs, rew, term, trunc, info["env_id"],
                                           info["episode_return"], info["episode_length"])])
    return [np.stack(col) for col in zip(*rows)]


@needs_jax
@needs_cartpole
@pytest.mark.parametrize("x64", [True, False])
def test_cartpole_scan_equals_python_loop(jax_process, x64):
    """300 steps (episodes end and autoreset) in one jitted `lax.scan`, actions computed in the
    graph from obs: every output equals the Python loop's, cast to JAX's dtypes."""
    jax_process.submit(_case_cartpole_scan_equals_python_loop, x64).result()


def _case_cartpole_scan_equals_python_loop(x64):
    jax, jnp = _jax()
    n, steps = 6, 300
    with envs.make("CartPole-v1", n, seed=3, engine="native") as pool:
        want = _python_cartpole(pool, steps)
    with jax.enable_x64(x64), envs.make("CartPole-v1", n, seed=3, engine="native") as pool:
        obs0, _ = pool.reset()
        handle, _, _, step = pool.xla()

        def body(carry, _):
            h, obs = carry
            h, (obs, rew, term, trunc, info) = step(h, _cartpole_policy(obs))
            return (h, obs), (obs, rew, term, trunc, info["env_id"], info["episode_return"],
                              info["episode_length"])

        run = jax.jit(lambda h, o: jax.lax.scan(body, (h, o), length=steps))
        handle0 = np.asarray(handle)
        (handle, _), got = run(handle, jnp.asarray(obs0))
        assert want[2].any()  # episodes ended within the run
        for g, w in zip(got, want):
            w = w.astype(jax.dtypes.canonicalize_dtype(w.dtype))
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(np.asarray(g), w)
        np.testing.assert_array_equal(np.asarray(handle), handle0)  # comes back unchanged


@needs_jax
@needs_cartpole
def test_cartpole_partial_batches_send_recv(jax_process):
    """``env_batch_size < num_envs``: send to the ids recv returned, in a `fori_loop`; the
    ids, obs and rewards equal the Python loop's."""
    jax_process.submit(_case_cartpole_partial_batches_send_recv).result()


def _case_cartpole_partial_batches_send_recv():
    jax, jnp = _jax()
    n, b, steps = 5, 2, 40

    def python_loop(pool):
        pool.reset()
        pool.send(np.zeros(n, np.int64))
        ids, obs_log = [], []
        for t in range(steps):
            obs, _, _, _, info = pool.recv()
            ids.append(info["env_id"].copy())
            obs_log.append(obs.copy())
            pool.send(np.full(b, t % 2), info["env_id"])
        return np.stack(ids), np.stack(obs_log)

    with envs.make("CartPole-v1", n, env_batch_size=b, seed=11, engine="native") as pool:
        want_ids, want_obs = python_loop(pool)
    with envs.make("CartPole-v1", n, env_batch_size=b, seed=11, engine="native") as pool:
        pool.reset()
        handle, recv, send, _ = pool.xla()

        def body(t, carry):
            h, ids, obs = carry
            h, (o, _, _, _, info) = recv(h)
            h = send(h, jnp.full(b, t % 2, jnp.int32), info["env_id"])
            return h, ids.at[t].set(info["env_id"]), obs.at[t].set(o)

        @jax.jit
        def run(h):
            h = send(h, jnp.zeros(n, jnp.int32))
            init = (h, jnp.zeros((steps, b), jnp.int32), jnp.zeros((steps, b, 4), jnp.float32))
            return jax.lax.fori_loop(0, steps, body, init)

        _, ids, obs = run(handle)
        np.testing.assert_array_equal(np.asarray(ids), want_ids)
        np.testing.assert_array_equal(np.asarray(obs), want_obs)


@needs_jax
@needs_mujoco
def test_mujoco_core_scan_equals_python_loop(jax_process):
    """Hopper-v5 on the C++ thread core (same_step autoreset: ``final_obs`` too), float64
    under x64: 60 jitted steps equal the Python loop bit for bit."""
    jax_process.submit(_case_mujoco_core_scan_equals_python_loop).result()


def _case_mujoco_core_scan_equals_python_loop():
    _, jnp = _jax()
    n, steps = 3, 60
    actions = np.sin(np.arange(steps * n * 3, dtype=np.float32).reshape(steps, n, 3) * 0.37)
    got, want = _same_step_scan_and_loop("Hopper-v5", n, actions, seed=5, engine="native",
                                         num_workers=2)
    assert got[0].dtype == jnp.float64
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)


def _same_step_scan_and_loop(task: str, n: int, actions: np.ndarray, **kw):
    """``(got, want)``: (obs, reward, terminated, truncated, final_obs) of ``actions (steps,
    n, ...)`` on a same_step pool of ``task``, from a jitted ``lax.scan`` over ``pool.xla()``'s
    step (64-bit on) and from the Python loop on a second pool made alike."""
    jax, _ = _jax()
    kw = dict(autoreset="same_step", **kw)
    with envs.make(task, n, **kw) as pool:
        pool.reset()
        want = []
        for a in actions:
            obs, rew, term, trunc, info = pool.step(a)
            want.append([np.array(x) for x in (obs, rew, term, trunc, info["final_obs"])])
        want = [np.stack(col) for col in zip(*want)]
    with jax.enable_x64(True), envs.make(task, n, **kw) as pool:
        pool.reset()
        handle, _, _, step = pool.xla()

        def body(h, a):
            h, (obs, rew, term, trunc, info) = step(h, a)
            return h, (obs, rew, term, trunc, info["final_obs"])

        _, got = jax.jit(lambda h, xs: jax.lax.scan(body, h, xs))(handle, actions)
        return got, want


@needs_jax
@pytest.mark.skipif(importlib.util.find_spec("gmi_drl.envs._cpp_examples") is None,
                    reason="gmi_drl.envs._cpp_examples (the C++ env template's example) is not "
                    "built")
def test_a_cpp_template_env_scan_equals_python_loop(jax_process):
    """The C++ env template's example (Pendulum-cpp-v1, docs/add-a-cpp-env.md) on the XLA face:
    50 jitted steps equal the Python loop bit for bit, as its other faces do."""
    jax_process.submit(_case_cpp_template_env_scan_equals_python_loop).result()


def _case_cpp_template_env_scan_equals_python_loop():
    from gmi_drl.envs.cpp_env import EXAMPLE_TASK

    n, steps = 3, 50
    actions = np.cos(np.arange(steps * n, dtype=np.float32).reshape(steps, n, 1) * 0.61) * 2
    got, want = _same_step_scan_and_loop(EXAMPLE_TASK, n, actions, seed=11, num_workers=2,
                                         max_episode_steps=20)
    assert np.asarray(got[3]).any()  # (time limits within the loop: autoreset too)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)


@needs_jax
@needs_atari
def test_atari_core_scan_equals_python_loop(jax_process):
    """Pong-v5 on the C++ Atari core: uint8 frames and the engine's extra ``lives`` too."""
    jax_process.submit(_case_atari_core_scan_equals_python_loop).result()


def _case_atari_core_scan_equals_python_loop():
    jax, jnp = _jax()
    n, steps = 2, 20
    actions = (np.arange(steps * n).reshape(steps, n) % 6).astype(np.int32)
    kw = dict(seed=1, engine="native", num_workers=2)
    with envs.make("Pong-v5", n, **kw) as pool:
        pool.reset()
        want = []
        for a in actions:
            obs, rew, _, _, info = pool.step(a)
            want.append([np.array(x) for x in (obs, rew, info["lives"])])
        want = [np.stack(col) for col in zip(*want)]
    with envs.make("Pong-v5", n, **kw) as pool:
        pool.reset()
        handle, _, _, step = pool.xla()

        def body(h, a):
            h, (obs, rew, _, _, info) = step(h, a)
            return h, (obs, rew, info["lives"])

        _, got = jax.jit(lambda h, xs: jax.lax.scan(body, h, xs))(handle, actions)
        assert got[0].dtype == jnp.uint8
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w.astype(g.dtype))


@needs_jax
@needs_cartpole
def test_wrong_shapes_and_dtypes_are_refused_at_trace_time(jax_process):
    jax_process.submit(_case_wrong_shapes_and_dtypes_are_refused_at_trace_time).result()


def _case_wrong_shapes_and_dtypes_are_refused_at_trace_time():
    jax, jnp = _jax()
    with envs.make("CartPole-v1", 4, seed=0, engine="native") as pool:
        pool.reset()
        handle, recv, send, _ = pool.xla()
        with pytest.raises(ValueError, match=r"actions have shape \(3,\), expected \(4,\)"):
            jax.jit(send)(handle, jnp.zeros(3, jnp.int32))
        with pytest.raises(ValueError, match="actions have dtype float32"):
            jax.jit(send)(handle, jnp.zeros(4, jnp.float32))
        with pytest.raises(ValueError, match="env_id must be a non-empty 1-d int array"):
            jax.jit(send)(handle, jnp.zeros(4, jnp.int32), jnp.zeros(4, jnp.float32))
        with pytest.raises(ValueError, match=r"handle must be the \(8,\) uint8 array"):
            jax.jit(recv)(handle.astype(jnp.int32))
        # nothing was sent: the pool steps on from Python
        _, rew, *_ = pool.step(np.ones(4, np.int64))
        np.testing.assert_array_equal(rew, np.ones(4))


@needs_jax
@needs_cartpole
def test_pool_errors_come_out_of_the_jitted_call_nothing_sent(jax_process):
    """What the pool's send/recv refuse at run time comes out as jax's runtime error with the
    pool's message; nothing was stepped, nothing waits."""
    jax_process.submit(_case_pool_errors_come_out_of_the_jitted_call_nothing_sent).result()


def _case_pool_errors_come_out_of_the_jitted_call_nothing_sent():
    jax, jnp = _jax()
    with envs.make("CartPole-v1", 4, seed=0, engine="native") as pool:
        pool.reset()
        handle, recv, _, step = pool.xla()
        step_jit = jax.jit(step)
        with pytest.raises(jax.errors.JaxRuntimeError, match="outside the action space"):
            step_jit(handle, jnp.array([0, 1, 2, 0], jnp.int32))
        with pytest.raises(jax.errors.JaxRuntimeError, match="needs 4 envs in flight"):
            jax.jit(recv)(handle)  # would wait forever: refused instead
        with pytest.raises(jax.errors.JaxRuntimeError, match="out of range"):
            step_jit(handle, jnp.zeros(1, jnp.int32), jnp.array([7], jnp.int32))
        _, (_, rew, *_) = step_jit(handle, jnp.ones(4, jnp.int32))  # the pool still runs
        np.testing.assert_array_equal(np.asarray(rew), np.ones(4))
        pool.close()
        with pytest.raises(jax.errors.JaxRuntimeError, match="closed"):
            step_jit(handle, jnp.ones(4, jnp.int32))


@needs_jax
@needs_mujoco
def test_mujoco_bad_action_then_close_leaves_nothing_in_flight(jax_process):
    jax_process.submit(_case_mujoco_bad_action_then_close_leaves_nothing_in_flight).result()


def _case_mujoco_bad_action_then_close_leaves_nothing_in_flight():
    jax, jnp = _jax()
    with envs.make("Hopper-v5", 2, seed=0, engine="native", num_workers=2) as pool:
        pool.reset()
        handle, _, send, _ = pool.xla()
        with pytest.raises(jax.errors.JaxRuntimeError, match="outside the action space"):
            jax.jit(send)(handle, jnp.full((2, 3), jnp.nan, jnp.float32))
        with pytest.raises(RuntimeError, match="needs 2 envs in flight"):
            pool.recv()  # the refused send queued nothing on the core's threads


@needs_jax
@needs_cartpole
def test_handlers_check_their_buffers(jax_process):
    """Calls that bypass the Python checks (`jax.ffi.ffi_call` itself) get the handlers' own
    FFI errors: a handle that is not 8 bytes, results of shapes the pool does not return."""
    jax_process.submit(_case_handlers_check_their_buffers).result()


def _case_handlers_check_their_buffers():
    jax, jnp = _jax()
    with envs.make("CartPole-v1", 2, seed=0, engine="native") as pool:
        pool.reset()
        handle, _, send, _ = pool.xla()
        bad_handle = jax.ffi.ffi_call(envs_xla.RECV_TARGET,
                                      [jax.ShapeDtypeStruct((4,), jnp.int32)] * 5,
                                      has_side_effect=True)
        with pytest.raises(jax.errors.JaxRuntimeError, match=r"handle must be the \(8,\) uint8"):
            jax.jit(bad_handle)(jnp.zeros(4, jnp.int32))
        send(handle, jnp.zeros(2, jnp.int32))
        results = [jax.ShapeDtypeStruct((8,), jnp.uint8), jax.ShapeDtypeStruct((3, 4), jnp.float32),
                   *[jax.ShapeDtypeStruct((2,), jnp.float32)] * 7]
        wrong_obs = jax.ffi.ffi_call(envs_xla.RECV_TARGET, results, has_side_effect=True)
        with pytest.raises(jax.errors.JaxRuntimeError,
                           match=r"obs has shape \(2, 4\), not the shape pool.xla\(\) declared"):
            jax.jit(wrong_obs)(handle)


@needs_jax
def test_handle_of_a_collected_pool_is_refused(jax_process):
    jax_process.submit(_case_handle_of_a_collected_pool_is_refused).result()


def _case_handle_of_a_collected_pool_is_refused():
    jax, jnp = _jax()
    pool = envs.make("CartPole-v1", 2, seed=0, engine="numpy")  # (the C++ pool is in a cycle)
    pool.reset()
    handle, recv, send, step = pool.xla()
    step_jit = jax.jit(step)
    step_jit(handle, jnp.zeros(2, jnp.int32))
    pool.close()
    del pool, recv, send, step
    gc.collect()
    with pytest.raises(jax.errors.JaxRuntimeError, match="names no live pool"):
        step_jit(handle, jnp.zeros(2, jnp.int32))
