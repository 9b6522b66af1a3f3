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

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

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
    sig = _Signature.of(pool, extra_info)
    handle_id = _xla_ffi.register(pool, [name for name, _, _ in sig.info_fields])
    weakref.finalize(pool, _xla_ffi.unregister, handle_id)
    handle = jnp.asarray(np.array([handle_id], np.uint64).view(np.uint8))
    handle_type = jax.ShapeDtypeStruct((HANDLE_BYTES,), np.uint8)

    def send(handle: Any, actions: Any, env_id: Any = None) -> Any:
        _check_handle(handle)
        operands = sig.send_operands(jnp.asarray(actions),
                                     None if env_id is None else jnp.asarray(env_id))
        return jax.ffi.ffi_call(SEND_TARGET, handle_type, has_side_effect=True)(handle,
                                                                                 *operands)

    def recv(handle: Any) -> tuple[Any, tuple[Any, Any, Any, Any, dict[str, Any]]]:
        _check_handle(handle)
        results = [jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype))
                   for _, shape, dtype in sig.fields]
        handle, *out = jax.ffi.ffi_call(RECV_TARGET, [handle_type, *results],
                                        has_side_effect=True)(handle)
        info = {name: value for (name, _, _), value in zip(sig.info_fields, out[4:])}
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


@dataclasses.dataclass(frozen=True)
class _Signature:
    """What the functions of `xla` check and declare, taken from the pool (they hold no reference
    to it: a jitted program must not keep a pool alive)."""

    num_envs: int
    action_shape: tuple[int, ...]
    action_kinds: str  # the dtype kinds `EnvPool.send` accepts
    action_space: str
    fields: list[tuple[str, tuple[int, ...], Any]]  # recv's (name, shape, dtype), in order
    info_fields: list[tuple[str, tuple[int, ...], Any]]  # the tail of ``fields``: info's

    @classmethod
    def of(cls, pool: Any, extra_info: dict[str, np.ndarray]) -> _Signature:
        b, obs, act = pool.env_batch_size, pool.observation_space, pool.action_space
        info = [("env_id", (b,), np.int64), ("episode_return", (b,), np.float64),
                ("episode_length", (b,), np.int64), ("episode_end", (b,), np.bool_)]
        if pool.autoreset is AutoresetMode.SAME_STEP:
            info.append(("final_obs", (b, *obs.shape), obs.dtype))
        info += [(name, (b, *v.shape[1:]), v.dtype) for name, v in extra_info.items()]
        fields = [("obs", (b, *obs.shape), obs.dtype), ("reward", (b,), np.float64),
                  ("terminated", (b,), np.bool_), ("truncated", (b,), np.bool_), *info]
        kinds = "iu" if np.issubdtype(act.dtype, np.integer) else "fiu"
        return cls(pool.num_envs, tuple(act.shape), kinds, str(act), fields, info)

    def send_operands(self, actions: Any, env_id: Any | None) -> list[Any]:
        """``[actions]`` or ``[actions, env_id]``, checked.

        Raises:
            ValueError: ``env_id`` not a non-empty 1-d int array; ``actions`` not ``(n,
                *action_shape)`` for ``n`` ids (``num_envs`` without ids), or of a wrong dtype.
        """
        n = self.num_envs
        if env_id is not None:
            if env_id.ndim != 1 or env_id.dtype.kind not in "iu" or len(env_id) == 0:
                raise ValueError(f"env_id must be a non-empty 1-d int array, got shape "
                                 f"{env_id.shape} dtype {env_id.dtype}")
            n = len(env_id)
        if actions.shape != (n, *self.action_shape):
            raise ValueError(f"actions have shape {actions.shape}, expected "
                             f"{(n, *self.action_shape)} (one action of shape "
                             f"{self.action_shape} per env_id)")
        if actions.dtype.kind not in self.action_kinds:
            raise ValueError(f"actions have dtype {actions.dtype}, expected a dtype of kind "
                             f"{self.action_kinds!r} for {self.action_space}")
        return [actions] if env_id is None else [actions, env_id]


def _check_handle(handle: Any) -> None:
    if getattr(handle, "shape", None) != (HANDLE_BYTES,) or handle.dtype != np.uint8:
        raise ValueError(f"handle must be the ({HANDLE_BYTES},) uint8 array of pool.xla(), got "
                         f"{getattr(handle, 'shape', None)} {getattr(handle, 'dtype', None)}")
