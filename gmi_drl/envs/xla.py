"""`EnvPool.xla()`: a pool's ``send``/``recv``/``step`` as JAX functions that run in ``jax.jit``.

Source: the EnvPool paper's XLA interface (``handle, recv, send, step = env.xla()``): env steps
become XLA custom calls, so a whole rollout (or training loop) is one compiled
function. Here the calls are XLA FFI handlers (``csrc/xla_ffi.cpp``, module
``gmi_drl.envs._xla_ffi``) registered for JAX's CPU backend with `jax.ffi.register_ffi_target`
and called with `jax.ffi.ffi_call`.

The handle is an ``(8,) uint8`` array naming the pool; every call takes it and returns it, and
the caller threads it through the program (the carry of a ``fori_loop`` or ``scan``): that
data dependency keeps the calls in program order (they are declared side-effecting, so XLA
neither merges nor drops them). A handler takes the GIL and calls the pool's own ``send`` or
``recv``: the same validation, errors, engines and arithmetic as the Python loop, so a jitted
loop gives the Python loop's results bit for bit (``tests/envs/test_xla.py``); results are
copied into XLA's buffers, cast to the dtypes JAX uses (``float64``/``int64`` become
``float32``/``int32`` unless ``jax_enable_x64`` is on).

Needs the optional ``jax`` extra, and ``gmi_drl.envs._xla_ffi`` built against it (setup.py builds
it where jax is importable at build time). Runs on JAX's CPU backend only.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

from gmi_drl.envs.spec import AutoresetMode

try:
    from gmi_drl.envs import _xla_ffi
except ImportError as e:  # built only where jax was importable at build time (setup.py)
    _xla_ffi = None
    _BUILD_ERROR = (f"gmi_drl.envs._xla_ffi is not built ({e}): it builds only where jax is "
                    "importable at build time; with jax installed run `python setup.py build_ext "
                    "--inplace` in the source tree (or `pip install --no-build-isolation -e .`)")
else:
    _BUILD_ERROR = None

SEND_TARGET = "gmi_drl_env_send"
RECV_TARGET = "gmi_drl_env_recv"
HANDLE_BYTES = 8
_registered = False

XlaFunctions = tuple[Any, Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def unavailable_reason() -> str | None:
    """Why `xla` cannot run here (jax missing, or the FFI module not built), or ``None``."""
    try:
        import jax.ffi  # noqa: F401
    except ImportError as e:
        return (f"pool.xla() needs jax ({e}): pip install 'gmi-drl[jax]', then build "
                "gmi_drl.envs._xla_ffi (`python setup.py build_ext --inplace`)")
    return _BUILD_ERROR


def xla(pool: Any, extra_info: dict[str, np.ndarray]) -> XlaFunctions:
    """``handle, recv, send, step`` of ``pool`` (an `EnvPool`; `EnvPool.xla` calls this) for use
    inside ``jax.jit`` (CPU backend).

    - ``handle``: ``(8,) uint8`` jax array naming the pool; thread it through the program.
    - ``send(handle, actions, env_id=None) -> handle``: `EnvPool.send` of ``actions (n,
      *action_shape)`` to ``env_id (n,)`` int (default: all ``num_envs``).
    - ``recv(handle) -> (handle, (obs, reward, terminated, truncated, info))``: `EnvPool.recv`;
      ``obs (env_batch_size, *obs_shape)`` in the observation dtype, ``reward (..,) float64``,
      ``terminated``/``truncated (..,) bool``, ``info`` with ``env_id (..,) int64``,
      ``episode_return``, ``episode_length``, ``episode_end`` (and ``final_obs`` in
      ``same_step`` mode, and the engine's ``extra_info`` arrays, e.g. Atari's ``lives``); 64-bit
      dtypes are 32-bit unless ``jax_enable_x64`` is on.
    - ``step(handle, actions, env_id=None)``: ``send`` then ``recv``.

    Reset the pool in Python first (``pool.reset()``): the functions step it, autoresetting as
    configured. While a jitted program that steps the pool runs, do not call the pool from
    Python. Args: ``extra_info``: the engine's per-env extras ``(num_envs, ...)`` (their shapes
    and dtypes; `EnvPool` passes its engine's).

    Raises:
        ImportError: jax is not installed, or ``gmi_drl.envs._xla_ffi`` is not built (the
            message says how to build it).
        ValueError (from ``send``/``recv``/``step`` at trace time): a handle, ``actions`` or
            ``env_id`` of the wrong shape or dtype. At run time, what the pool's ``send``/
            ``recv`` raise (an action outside the space, an id in flight, a closed pool) comes
            out of the jitted call as jax's runtime error carrying the pool's message.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    import jax
    import jax.numpy as jnp

    _register_targets(jax)
    info_fields = _info_fields(pool, extra_info)
    handle_id = _xla_ffi.register(pool, [name for name, _, _ in info_fields])
    weakref.finalize(pool, _xla_ffi.unregister, handle_id)
    handle = jnp.asarray(np.array([handle_id], np.uint64).view(np.uint8))
    b = pool.env_batch_size
    fields = [("obs", (b, *pool.observation_space.shape), pool.observation_space.dtype),
              ("reward", (b,), np.float64), ("terminated", (b,), np.bool_),
              ("truncated", (b,), np.bool_), *info_fields]
    handle_type = jax.ShapeDtypeStruct((HANDLE_BYTES,), np.uint8)
    # the functions hold no reference to the pool (a jitted program must not keep it alive)
    num_envs, act_space = pool.num_envs, str(pool.action_space)
    act_shape, act_kinds = _action_rule(pool.action_space)

    def send(handle: Any, actions: Any, env_id: Any = None) -> Any:
        _check_handle(handle)
        actions = jnp.asarray(actions)
        operands = [handle, actions]
        n = num_envs
        if env_id is not None:
            env_id = jnp.asarray(env_id)
            if env_id.ndim != 1 or env_id.dtype.kind not in "iu" or len(env_id) == 0:
                raise ValueError(f"env_id must be a non-empty 1-d int array, got shape "
                                 f"{env_id.shape} dtype {env_id.dtype}")
            n = len(env_id)
            operands.append(env_id)
        if actions.shape != (n, *act_shape):
            raise ValueError(f"actions have shape {actions.shape}, expected {(n, *act_shape)} "
                             f"(one action of shape {act_shape} per env_id)")
        if actions.dtype.kind not in act_kinds:
            raise ValueError(f"actions have dtype {actions.dtype}, expected a dtype of kind "
                             f"{act_kinds!r} for {act_space}")
        return jax.ffi.ffi_call(SEND_TARGET, handle_type, has_side_effect=True)(*operands)

    def recv(handle: Any) -> tuple[Any, tuple[Any, Any, Any, Any, dict[str, Any]]]:
        _check_handle(handle)
        results = [jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype))
                   for _, shape, dtype in fields]
        handle, *out = jax.ffi.ffi_call(RECV_TARGET, [handle_type, *results],
                                        has_side_effect=True)(handle)
        info = {name: value for (name, _, _), value in zip(info_fields, out[4:])}
        return handle, (out[0], out[1], out[2], out[3], info)

    def step(handle: Any, actions: Any, env_id: Any = None):
        return recv(send(handle, actions, env_id))

    return handle, recv, send, step


def _register_targets(jax: Any) -> None:
    """Register the handlers with JAX's CPU backend, once per process."""
    global _registered
    if not _registered:
        handlers = _xla_ffi.handlers()
        jax.ffi.register_ffi_target(SEND_TARGET, handlers["send"], platform="cpu")
        jax.ffi.register_ffi_target(RECV_TARGET, handlers["recv"], platform="cpu")
        _registered = True


def _info_fields(pool: Any, extra_info: dict[str, np.ndarray]) -> list[tuple]:
    """``(name, shape, dtype)`` of each ``info`` array `EnvPool.recv` returns."""
    b = pool.env_batch_size
    fields = [("env_id", (b,), np.int64), ("episode_return", (b,), np.float64),
              ("episode_length", (b,), np.int64), ("episode_end", (b,), np.bool_)]
    if pool.autoreset is AutoresetMode.SAME_STEP:
        space = pool.observation_space
        fields.append(("final_obs", (b, *space.shape), space.dtype))
    fields += [(name, (b, *v.shape[1:]), v.dtype) for name, v in extra_info.items()]
    return fields


def _action_rule(space: Any) -> tuple[tuple[int, ...], str]:
    """The shape of one action and the dtype kinds `EnvPool.send` accepts for ``space``."""
    integer = np.issubdtype(space.dtype, np.integer)
    return tuple(space.shape), "iu" if integer else "fiu"


def _check_handle(handle: Any) -> None:
    if getattr(handle, "shape", None) != (HANDLE_BYTES,) or handle.dtype != np.uint8:
        raise ValueError(f"handle must be the ({HANDLE_BYTES},) uint8 array of pool.xla(), got "
                         f"{getattr(handle, 'shape', None)} {getattr(handle, 'dtype', None)}")
