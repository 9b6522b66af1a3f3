"""`WarpPool`: a GPU simulator behind the pool API, every world in one MuJoCo Warp model/data.

Source: the GMI-DRL paper §1-§3: each GMI holds a GPU simulator with
thousands of environments beside its agent and trainer. MuJoCo Warp steps all of a pool's
worlds with one batched `mujoco_warp.Data`; the task's kernels (`gmi_drl.envs.warp`) take
observations, rewards and terminations and reset ended worlds in the same step, on the device.

On a CUDA device one env step (action clipping, ``frame_skip`` physics steps, the task kernel)
is one captured CUDA graph, launched by `send` on the pool's Warp stream; the caller's torch
stream waits on it through events, so nothing blocks the host. Outputs are torch tensors that
alias the pool's preallocated Warp arrays (`warp.to_torch`, zero copy). On Warp's CPU device
(small ``num_envs``, for tests and debugging) the same kernels run without a graph and outputs
are NumPy views of the same arrays, as the CPU pools return.

Pitfalls handled here, from MuJoCo Warp's documentation: a graph is captured only after one
uncaptured step has compiled and loaded every kernel, with Python's GC off while capturing; the
per-world contact and constraint limits (``nconmax``, ``njmax``) are checked through
``Data.overflow`` by `check_limits` (the collector's caller runs it once per rollout) and a
step past them raises instead of training on dropped contacts; physics is float32, where
MuJoCo C is float64 (`tests/envs/test_warp_pool.py` bounds the difference over a short
horizon).
"""

from __future__ import annotations

import functools
import gc
import os
from typing import Any

import gymnasium as gym
import numpy as np

from gmi_drl.envs.factories import EngineEntry, PoolRequest
from gmi_drl.envs.spec import AutoresetMode, EnvSpec

# Overflow bits that mean the physics dropped something (contacts, constraints, DOFs); the
# solver's iteration limits are not among them (MuJoCo C also just stops iterating there).
_FATAL_OVERFLOWS = ("NEFC", "NJMAX_NNZ", "BROADPHASE", "NARROWPHASE", "CCD", "HFIELD", "NVMAX",
                    "EPA_HORIZON")


def warp_error() -> str | None:
    """Why the Warp engine cannot run here (``None``: it can): the optional dependencies."""
    try:
        import mujoco_warp  # noqa: F401
        import warp  # noqa: F401
    except ImportError as e:
        return (f"the warp engine needs MuJoCo Warp ({e}); install it with "
                "pip install -e '.[gpu]' in the checkout (mujoco-warp==4.0.0 and warp-lang)")
    return None


def init_warp():
    """Import and initialise Warp once, quietly, with its kernel cache where
    ``GMI_DRL_WARP_CACHE`` says (default: Warp's own, ``~/.cache/warp``): compiled kernels
    persist across processes, so only the first pool of a model on a machine compiles them."""
    import warp as wp

    wp.config.quiet = True
    if hasattr(wp, "LOG_WARNING"):  # Warp >= 1.19 logs each kernel module load at INFO
        wp.config.log_level = wp.LOG_WARNING
    cache = os.environ.get("GMI_DRL_WARP_CACHE")
    if cache:
        wp.config.kernel_cache_dir = cache
    wp.init()  # idempotent
    return wp


class WarpPool:
    """``num_envs`` worlds of one MuJoCo Warp task, stepped together (``engine="warp"``).

    Made by ``gmi_drl.envs.make(task_id, num_envs, autoreset="same_step", device=...)``. Same API as
    `gmi_drl.envs.EnvPool` with full batches and ``same_step`` autoreset: `reset`, `send`,
    `recv`, `step`. Returned by `recv`/`step`: ``obs (num_envs, obs_dim) float32``, ``rewards
    (num_envs,) float32``, ``terminated``/``truncated (num_envs,) bool`` and ``info`` with
    ``env_id``, ``episode_return (num_envs,) float64`` and ``episode_length (num_envs,) int32``
    (totals including this step; the finished episode's where it ended), ``episode_end`` and
    ``final_obs (num_envs, obs_dim)`` (rows valid where the episode ended), and for a task with
    its own per-episode count (its definition's ``episode_metric``, e.g. ShadowHand's
    ``successes``) ``episode_<name> (num_envs,) float32``, totalled as ``episode_return``. On
    CUDA these are
    torch tensors on ``device``; on the CPU, NumPy arrays. Both alias the pool's buffers and stay
    valid until the next `send`/`step`/`reset`. Actions are clipped to [-1, 1] on the device.

    Args:
        task: a warp task definition (`gmi_drl.envs.warp.tasks`).
        num_envs: worlds (sub-environments).
        seeds: ``(num_envs,) int64`` (`env_seeds`): world ``i`` draws every reset from a
            generator keyed by ``seeds[i]`` and its count of resets.
        device: ``"cpu"`` (Warp's CPU device, no graph) or ``"cuda[:k]"``.
        nconmax, njmax: contacts and constraint rows per world (``None``: the task's).
        graph: capture one env step as a CUDA graph (``None``: on CUDA devices).
        tensors: return torch tensors (``None``: on CUDA devices; NumPy on the CPU).

    Raises:
        ValueError: an invalid ``num_envs``, ``device``, ``nconmax`` or ``njmax``, or seeds
            outside [0, 2**31).
        RuntimeError: MuJoCo Warp is not installed (the message says how to install it).
    """

    def __init__(self, task, num_envs: int, seeds: np.ndarray, device: str = "cpu",
                 nconmax: int | None = None, njmax: int | None = None,
                 graph: bool | None = None, tensors: bool | None = None) -> None:
        err = warp_error()
        if err:
            raise RuntimeError(err)
        wp = self._wp = init_warp()
        import importlib

        import mujoco_warp as mjw
        import torch

        from gmi_drl.envs.warp import worlds

        wt = importlib.import_module(f"gmi_drl.envs.warp.{task.kernels}")
        self._mjw, self._wt, self._worlds_mod, self._torch = mjw, wt, worlds, torch
        self.task = task
        self.num_envs = self.env_batch_size = int(num_envs)
        self.autoreset = AutoresetMode.SAME_STEP
        for name, value in (("nconmax", nconmax), ("njmax", njmax)):
            if value is not None and int(value) < 1:
                raise ValueError(f"{name}={value} must be >= 1 (None: the task's)")
        seeds = np.asarray(seeds, np.int64)
        if seeds.size and (seeds.min() < 0 or seeds.max() >= 2**31):
            raise ValueError(f"the worlds' seeds run from {seeds.min()} to {seeds.max()}; the "
                             f"warp engine takes seeds in [0, 2**31): seed + num_envs <= 2**31")
        n_cuda = wp.get_cuda_device_count()
        try:
            self._device = wp.get_device(str(device))  # (a torch.device names the same one)
        except Exception as e:
            if str(device).startswith("cuda") and n_cuda == 0:
                raise ValueError(f"device={device!r}: Warp sees no CUDA device here (no GPU, or "
                                 "no CUDA driver); use device='cpu' (Warp's CPU device, small "
                                 "num_envs)") from None
            cuda = f" or 'cuda:<k>' with k < {n_cuda}" if n_cuda else " (no CUDA device here)"
            raise ValueError(f"device={device!r} is not a Warp device ({e}); use "
                             f"'cpu'{cuda}") from None
        self.device = torch.device("cpu" if self._device.is_cpu else f"cuda:{self._device.ordinal}")
        self._on_cuda = self._device.is_cuda
        self.tensors = self._on_cuda if tensors is None else bool(tensors)
        self._graph_wanted = self._on_cuda if graph is None else bool(graph)
        if self._graph_wanted and not self._on_cuda:
            raise ValueError("graph=True needs a CUDA device (CUDA graphs)")
        self._body_states = getattr(wt, "BODY_STATES", False)
        self.model = task.build_model()
        self.layout = task.layout(self.model)
        task.check_model(self.model, self.layout)
        obs_space = gym.spaces.Box(-np.inf, np.inf, (task.obs_dim,), np.float32)
        act_space = gym.spaces.Box(-1.0, 1.0, (task.action_dim,), np.float32)
        self.spec = EnvSpec(task.task_id, obs_space, act_space, task.max_episode_steps)
        self.observation_space, self.action_space = obs_space, act_space
        n, nu = self.num_envs, self.model.nu
        with wp.ScopedDevice(self._device):
            self._m = mjw.put_model(self.model)
            self._m.opt.warn_overflow = 0  # in-kernel prints; `check_limits` raises instead
            self._d = mjw.make_data(self.model, nworld=n,
                                    nconmax=task.nconmax if nconmax is None else nconmax,
                                    njmax=task.njmax if njmax is None else njmax)
            self._params = wt.make_params(task, self.layout, self._device)
            z = wp.zeros
            self._seed = wp.array(seeds.astype(np.int32))
            self._resets = z(n, dtype=wp.int32)
            self._actions_in = z((n, nu), dtype=wp.float32)
            self._actions = z((n, nu), dtype=wp.float32)
            self._potentials = z(n, dtype=wp.float64)
            self._running_return = z(n, dtype=wp.float64)
            self._running_length = z(n, dtype=wp.int32)
            self._running_metric = z(n, dtype=wp.float32)
            self._obs = z((n, task.obs_dim), dtype=wp.float32)
            self._final_obs = z((n, task.obs_dim), dtype=wp.float32)
            self._reward = z(n, dtype=wp.float32)
            self._terminated = z(n, dtype=wp.bool)
            self._truncated = z(n, dtype=wp.bool)
            self._episode_return = z(n, dtype=wp.float64)
            self._episode_length = z(n, dtype=wp.int32)
            self._episode_metric = z(n, dtype=wp.float32)
            self._mask = z(n, dtype=wp.int32)
            self._task_state = z((n, max(task.state_dim, 1)), dtype=wp.float32)
            if not hasattr(wt, "apply_actions"):  # the shared kernel: ctrl = scale x a + offset
                scale, offset = task.action_map(self.layout)
                self._act_scale, self._act_offset = wp.array(scale), wp.array(offset)
            self._stream = wp.get_stream(self._device) if self._on_cuda else None
            self._worlds = worlds.make_worlds(
                self._d, seed=self._seed, resets=self._resets, actions=self._actions,
                potentials=self._potentials, running_return=self._running_return,
                running_length=self._running_length, running_metric=self._running_metric,
                obs=self._obs,
                task_state=self._task_state, final_obs=self._final_obs, reward=self._reward,
                terminated=self._terminated, truncated=self._truncated,
                episode_return=self._episode_return, episode_length=self._episode_length,
                episode_metric=self._episode_metric)
        view = self._view
        self._out = {k: view(getattr(self, "_" + k)) for k in (
            "obs", "final_obs", "reward", "terminated", "truncated", "episode_return",
            "episode_length", "episode_metric", "actions_in")}
        self._metric = getattr(task, "episode_metric", None)
        self._all_ids = (torch.arange(n, device=self.device) if self.tensors
                         else np.arange(n, dtype=np.int64))
        self._unreset = np.ones(n, bool)  # worlds never reset: stepping them is refused
        self._graph = None
        self._stepped = False  # one uncaptured step before capture (kernel loading)
        self._pending = False
        self._closed = False
        self._fatal_bits = 0
        from mujoco_warp._src.types import OverflowType

        for name in _FATAL_OVERFLOWS:
            self._fatal_bits |= int(getattr(OverflowType, name, 0))
        self._overflow_type = OverflowType

    # --- the pool API ---------------------------------------------------------------------------
    @property
    def partial_batch(self) -> bool:
        return False

    def reset(self, env_id: Any = None):
        """Start new episodes in ``env_id`` (default: every world); returns ``(obs, info)``
        with ``obs (n, obs_dim)`` of those worlds and ``info["env_id"]``.

        Raises:
            ValueError: an id out of range or repeated; a step in flight.
        """
        self._check_open()
        if self._pending:
            raise ValueError("a step is in flight; recv() it before reset()")
        ids = self._check_ids(env_id)
        mask = np.zeros(self.num_envs, np.int32)
        mask[ids] = 1
        wp = self._wp
        self._mask.assign(wp.array(mask, device=self._device) if self._on_cuda else mask)
        with wp.ScopedDevice(self._device):
            self._launch(self._wt.reset_worlds, [self._params, self._worlds, self._mask])
            if self._body_states:
                self._observe_reset()
        self._sync_to_caller()
        if self._unreset is not None:
            self._unreset[ids] = False
            if not self._unreset.any():
                self._unreset = None
        obs = self._out["obs"]
        if len(ids) == self.num_envs:
            return obs, {"env_id": self._all_ids}
        if self.tensors:  # ids in the pool's own array type, as every other output
            ids = self._torch.as_tensor(ids, device=self.device)
        return obs[ids], {"env_id": ids}

    def send(self, actions, env_id: Any = None) -> None:
        """Start one env step of every world with ``actions (num_envs, action_dim)`` (NumPy or
        a torch tensor; clipped to [-1, 1] on the device). Returns at once on CUDA.

        Raises:
            ValueError: ``env_id`` other than every world, wrong action shape, NaN actions (CPU),
                or a step already in flight.
            gymnasium.error.ResetNeeded: a world never reset.
        """
        self._check_open()
        if self._pending:
            raise ValueError("a step is already in flight; recv() it first")
        if self._unreset is not None:
            raise gym.error.ResetNeeded(
                f"env_id {np.flatnonzero(self._unreset).tolist()} never reset: call reset() "
                "before stepping them")
        if env_id is not None and not self._is_all(env_id):
            raise ValueError("the warp engine steps every world at once: send actions for all "
                             f"{self.num_envs} envs (env_id=None)")
        self._put_actions(actions)
        wp = self._wp
        if self._graph is not None:
            self._caller_to_pool()
            wp.capture_launch(self._graph, stream=self._stream)
        elif self._graph_wanted and self._stepped:
            self._caller_to_pool()
            self._capture()
            wp.capture_launch(self._graph, stream=self._stream)
        else:
            self._caller_to_pool()
            with wp.ScopedDevice(self._device):
                self._step_kernels()
            self._stepped = True
        self._pending = True

    def recv(self):
        """The step started by `send`: ``(obs, rewards, terminated, truncated, info)``.

        Raises:
            RuntimeError: no step in flight.
        """
        self._check_open()
        if not self._pending:
            raise RuntimeError("recv() needs a step in flight; send() actions first")
        self._pending = False
        self._sync_to_caller()
        o = self._out
        end = o["terminated"] | o["truncated"]
        info = {"env_id": self._all_ids, "episode_return": o["episode_return"],
                "episode_length": o["episode_length"], "episode_end": end,
                "final_obs": o["final_obs"]}
        if self._metric is not None:
            info[f"episode_{self._metric}"] = o["episode_metric"]
        return o["obs"], o["reward"], o["terminated"], o["truncated"], info

    def step(self, actions, env_id: Any = None):
        """`send` then `recv`."""
        self.send(actions, env_id)
        return self.recv()

    def check_limits(self) -> None:
        """Raise if any world overflowed its contact or constraint buffers since the last check
        (a host read of ``(num_envs,)`` flags: call it once per rollout, not per step).

        Raises:
            RuntimeError: names the worlds and overflows, and the argument to raise; the pool
                is closed.
        """
        self._check_open()
        flags = self._d.overflow.numpy()
        bad = np.flatnonzero(flags & self._fatal_bits)
        if len(bad):
            kinds = sorted({t.name for w in bad for t in self._overflow_type
                            if t.value and t.value & int(flags[w]) & self._fatal_bits})
            raise RuntimeError(
                f"{self.task.task_id}: MuJoCo Warp overflowed {kinds} in worlds "
                f"{bad[:8].tolist()}{'...' if len(bad) > 8 else ''} (contacts or constraints "
                "were dropped); make the pool with a larger nconmax= (contacts) or njmax= "
                "(constraints) per world")
        self._d.overflow.zero_()

    def close(self) -> None:
        """Free the device buffers and the graph, once the pool's stream has finished the step
        in flight (a run stopped mid-rollout may close a pool whose graph is still executing).
        Idempotent."""
        if not self._closed:
            self._closed = True
            if self._on_cuda:
                self._wp.synchronize_stream(self._stream)
            self._graph = None
            self._out = {}
            self._d = self._m = None

    def __enter__(self) -> "WarpPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError(f"{self!r} cannot be copied or pickled: its worlds live in one Warp "
                        "model on its device; make another with gmi_drl.envs.make(...)")

    def __repr__(self) -> str:
        return (f"WarpPool({self.task.task_id!r}, num_envs={self.num_envs}, "
                f"device={str(self.device)!r})")

    # --- internals ------------------------------------------------------------------------------
    def _view(self, a):
        return self._wp.to_torch(a) if self.tensors else a.numpy()

    def _step_kernels(self) -> None:
        """One env step: clip actions into controls, ``frame_skip`` physics steps, the task
        kernel (observe, reward, terminate, reset ended worlds)."""
        wp, d, n, nu = self._wp, self._d, self.num_envs, self.model.nu
        if hasattr(self._wt, "apply_actions"):  # the task's own (BallBalance: integrate)
            wp.launch(self._wt.apply_actions, dim=(n, nu),
                      inputs=[self._params, self._worlds, self._actions_in, d.ctrl])
        else:
            wp.launch(self._worlds_mod.apply_actions, dim=(n, nu),
                      inputs=[self._actions_in, self._act_scale, self._act_offset],
                      outputs=[self._actions, d.ctrl])
        for _ in range(self.task.frame_skip):
            self._mjw.step(self._m, d)
        if self._body_states:
            self._body_kinematics()
        self._launch(self._wt.finish_step, [self._params, self._worlds])
        if self._body_states:
            self._observe_reset()

    def _body_kinematics(self) -> None:
        """Body poses and velocities of the current qpos/qvel (``mj_step`` leaves those of the
        last substep's start): for tasks that observe bodies (``BODY_STATES``)."""
        mjw, m, d = self._mjw, self._m, self._d
        mjw.kinematics(m, d)
        mjw.com_pos(m, d)
        mjw.com_vel(m, d)

    def _observe_reset(self) -> None:
        """The first observation of worlds whose episode started, from their new state."""
        self._body_kinematics()
        self._launch(self._wt.observe_reset, [self._params, self._worlds])

    def _launch(self, kernel, args) -> None:
        self._wp.launch(kernel, dim=self.num_envs, inputs=args)

    def _capture(self) -> None:
        wp = self._wp
        enabled = gc.isenabled()
        gc.disable()  # a collection during capture may free arrays the graph records
        try:
            with wp.ScopedDevice(self._device), wp.ScopedCapture(stream=self._stream) as cap:
                self._step_kernels()
        finally:
            if enabled:
                gc.enable()
        self._graph = cap.graph

    def _put_actions(self, actions) -> None:
        torch, shape = self._torch, (self.num_envs, self.model.nu)
        if isinstance(actions, torch.Tensor):
            if tuple(actions.shape) != shape:
                raise ValueError(f"actions have shape {tuple(actions.shape)}, expected {shape}")
            if not actions.is_floating_point():
                raise ValueError(f"actions have dtype {actions.dtype}, expected a float dtype")
            actions = actions.detach()
            if actions.device.type == "cpu" and bool(actions.isnan().any()):
                raise ValueError("actions contain NaN")  # (a device tensor: not checked, a sync)
        a = actions if isinstance(actions, torch.Tensor) else np.asarray(actions)
        if isinstance(a, np.ndarray):
            if a.shape != shape:
                raise ValueError(f"actions have shape {a.shape}, expected {shape} (one action "
                                 f"of {self.model.nu} floats per env)")
            if a.dtype.kind != "f":
                raise ValueError(f"actions have dtype {a.dtype}, expected a floating-point "
                                 "dtype")
            if np.isnan(a).any():
                raise ValueError("actions contain NaN")
        dst = self._out["actions_in"]
        if not self.tensors:
            np.copyto(dst, a if isinstance(a, np.ndarray) else a.cpu().numpy(),
                      casting="same_kind")
        elif isinstance(a, np.ndarray):
            dst.copy_(torch.from_numpy(a))
        else:
            dst.copy_(a)  # on the caller's stream; `_caller_to_pool` orders the pool after it

    def _caller_to_pool(self) -> None:
        """The pool's stream waits for the caller's torch stream (the actions it wrote)."""
        if self._on_cuda:
            torch = self._torch
            caller = torch.cuda.current_stream(self.device)
            self._wp.stream_to_torch(self._stream).wait_stream(caller)

    def _sync_to_caller(self) -> None:
        """The caller's torch stream waits for the pool's stream (its outputs); no host wait."""
        if self._on_cuda:
            torch = self._torch
            torch.cuda.current_stream(self.device).wait_stream(
                self._wp.stream_to_torch(self._stream))

    def _is_all(self, env_id) -> bool:
        ids = np.asarray(env_id.cpu() if hasattr(env_id, "cpu") else env_id)
        return ids.shape == (self.num_envs,) and bool((ids == np.arange(self.num_envs)).all())

    def _check_ids(self, env_id) -> np.ndarray:
        if env_id is None:
            return np.arange(self.num_envs)
        ids = np.asarray(env_id.cpu() if hasattr(env_id, "cpu") else env_id).reshape(-1)
        if ids.dtype.kind not in "iu" or len(ids) == 0:
            raise ValueError(f"env_id must be a non-empty 1-d array of ints, got {env_id!r}")
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(f"env_id {ids.tolist()} out of range [0, {self.num_envs})")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"env_id {ids.tolist()} repeats an id")
        return ids.astype(np.int64)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")


class WarpTaskFactory:
    """The ``warp`` engine's pool factory of one warp task; `spec` gives its spaces without
    building a model."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def time_limit_problem(self, task_kwargs: dict) -> str | None:
        """Why ``task_kwargs``' ``max_episode_steps`` cannot be (a warp task's episodes are
        its definition's length), or ``None``."""
        from gmi_drl.envs.warp import tasks

        steps, fixed = task_kwargs.get("max_episode_steps"), tasks()[self.task_id].max_episode_steps
        if steps is None or steps == fixed:
            return None
        return (f"max_episode_steps={steps}: a warp task's episodes are {fixed} steps (its "
                "definition; leave it None)")

    def spec(self) -> EnvSpec:
        from gmi_drl.envs.warp import tasks

        t = tasks()[self.task_id]
        return EnvSpec(t.task_id, gym.spaces.Box(-np.inf, np.inf, (t.obs_dim,), np.float32),
                       gym.spaces.Box(-1.0, 1.0, (t.action_dim,), np.float32),
                       t.max_episode_steps)

    def __call__(self, request: PoolRequest, **kwargs: Any) -> WarpPool:
        """Raises ``ValueError`` (every problem at once) for partial batches or an autoreset
        mode other than ``same_step``, or as `WarpPool`."""
        from gmi_drl.envs.warp import tasks

        errors = []
        if request.env_batch_size != request.num_envs:
            errors.append("the warp engine steps every world at once: env_batch_size must be "
                          f"num_envs ({request.num_envs})")
        if request.autoreset is not AutoresetMode.SAME_STEP:
            errors.append("the warp engine resets ended worlds in the same step: make the pool "
                          "with autoreset='same_step'")
        task = tasks()[self.task_id]
        if (problem := self.time_limit_problem(kwargs)) is not None:
            errors.append(problem)
        kwargs.pop("max_episode_steps", None)
        pool_keywords = {"nconmax", "njmax", "graph", "tensors"}
        unknown = sorted(set(kwargs) - pool_keywords)
        if unknown:
            errors.append(f"{self.task_id} does not take the keyword(s) {unknown}; it takes "
                          f"{sorted(pool_keywords | {'max_episode_steps'})}")
        if errors:
            raise ValueError(f"invalid pool of {self.task_id}: " + "; ".join(errors))
        return WarpPool(task, request.num_envs, request.seeds, request.device, **kwargs)


def _unavailable(factory: WarpTaskFactory, task_kwargs: dict) -> str | None:
    """Why the warp engine cannot run ``factory``'s task with ``task_kwargs`` here: no Warp, or a
    time limit the task does not have (found before a pool, or its spec, is built)."""
    return warp_error() or factory.time_limit_problem(task_kwargs)


def engines() -> dict[str, dict[str, EngineEntry]]:
    """The ``warp`` engine of each warp task (`gmi_drl.envs.warp.tasks`): the registry's table,
    task id -> engine name -> `EngineEntry`."""
    from gmi_drl.envs.warp import tasks

    table = {}
    for task_id in tasks():
        factory = WarpTaskFactory(task_id)
        table[task_id] = {"warp": EngineEntry(factory, unavailable=functools.partial(
                                                  _unavailable, factory),
                                              spec=factory.spec,
                                              autoreset_modes=(AutoresetMode.SAME_STEP,))}
    return table
