"""`GradStep`: how a gradient becomes a weight update, for one optimised module.

A gradient step owns the module's flat parameters (`FlatParams`), its optimizer (`FlatAdam` or
`FlatRMSprop`, by name),
gradient-norm clipping and the `GradReducer` the gradient leaves through. An algorithm hands it
a loss once, at construction, and then calls it with one minibatch per step; it never touches
the reducer or the optimizer itself. Two variants:

- `GradStep` (synchronous): gradient, ``allreduce_`` over the trainers (a collective), clip,
  Adam. Every trainer holds identical weights after every step.
- `StaleSyncGradStep` ("stale-sync", iSwitch §4.1): the gradient is handed to the switch
  pipeline (`gmi_drl.comm.switch.pipeline.StaleSyncPipeline`) and computed on weights that miss
  at most ``S`` aggregated steps; the pipeline's thread takes the steps. `drain` ends the overlap.
- `AsyncPSGradStep` ("Async PS", the iSwitch paper's asynchronous baseline, §2.2 Fig. 3, §6.2):
  the step's clip and optimizer turn the gradient into an update of the weights it was computed
  on, the update goes to an asynchronous parameter server (`gmi_drl.comm.ps.AsyncPSClient`),
  which applies it unless it is more than ``S`` versions stale, and the server's weights come
  back.

With ``compile=True`` the gradient is one `torch.compile` graph: ``torch.func.grad`` of the loss
at the flat parameter vector (forward and backward fused, no autograd engine per step). With one
trainer and no reducer the clip and the Adam step join the same graph, so a whole step is one
call. The eager path (``loss.backward()``) is the reference the compiled one is tested against.
With ``cuda_graphs=True`` on a CUDA device the compiled body is replayed as one CUDA graph per
minibatch shape (`gmi_drl.optim.cuda_graph.GraphedStep`): one launch instead of dozens.
With ``precision="bf16-mixed"`` the loss and its gradient are computed under
``torch.autocast`` to bfloat16 (matrix products in bfloat16, reductions and the loss's
``float32`` ops as autocast chooses); the weights, the gradient, its reduction and the
optimizer's state stay ``float32`` (mixed precision, Micikevicius et al. 2018, with bfloat16's
range: no loss scaling). It serves every algorithm, compiled or eager, on a CPU with bfloat16
instructions (AVX512-BF16, AMX) or a CUDA GPU from Ampere on.

Timer sections per step: ``forward`` and ``backward`` (eager) or ``compiled_grad`` (compiled)
or ``compiled_step`` (compiled, with clip and optimizer); ``allreduce``; ``optimizer``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from typing import Callable, NamedTuple

import numpy as np
import torch
from torch import nn

from gmi_drl.comm.ps import AsyncPSClient
from gmi_drl.comm.reducer import GradReducer, IdentityReducer
from gmi_drl.models.compiled import compile_graph
from gmi_drl.optim.cuda_graph import CaptureError, GraphedStep
from gmi_drl.optim.flat import (FlatParams, clip_factor, clip_grad_norm_, make_flat_optimizer,
                               soft_update_)
from gmi_drl.telemetry.timer import timer

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16-mixed")
"""what `GradStep` computes a loss and its gradient in (see the module docstring)"""

RECOMPILE_LIMIT = 64
"""graphs one process may compile for gradient steps (one per model and minibatch shape)"""

Loss = Callable[..., tuple[torch.Tensor, tuple[torch.Tensor, ...]]]
"""``loss(module, *batch) -> (loss, aux)``: a 0-d loss to minimise and a tuple of tensors to
return to the caller (loss terms, per-sample statistics). A pure function of its arguments
(hyper-parameters bound in a closure are constants), so it can be compiled."""


@functools.cache
def _warn_without_bf16_instructions() -> None:
    """Once per process: a warning where the CPU lists neither AVX512-BF16 nor AMX (Linux's
    ``/proc/cpuinfo``), whose bfloat16 products are emulated and slower than float32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return  # not Linux: no way to tell, no warning
    if not {"avx512_bf16", "amx_bf16"} & set(flags):
        log.warning("precision bf16-mixed on a CPU without AVX512-BF16 or AMX: bfloat16 "
                    "products are emulated there and likely slower than --precision fp32")


class _Bound(nn.Module):
    """``loss`` bound to ``inner``: what ``torch.func.functional_call`` runs on other weights."""

    def __init__(self, inner: nn.Module, loss: Loss) -> None:
        super().__init__()
        self.inner, self.loss = inner, loss

    def forward(self, *batch):
        return self.loss(self.inner, *batch)


class GradStep:
    """Synchronous gradient steps of ``module`` on ``loss`` (see the module docstring).

    Args:
        module: the optimised module; its parameters are re-homed into one flat buffer.
        loss: see `Loss`.
        lr: the optimizer's step size (settable later through `lr`). max_grad_norm: global
            norm bound (``inf``: no clipping). eps: the optimizer's epsilon.
        reducer: the trainers' group (`IdentityReducer` when ``None``: one trainer).
        compile: compile the gradient (and, with one trainer, the whole step).
        optimizer: ``"adam"`` or ``"rmsprop"`` (`gmi_drl.optim.flat.make_flat_optimizer`).
        cuda_graphs: replay the compiled body as a CUDA graph (only with ``compile`` and
            parameters on a CUDA device; ignored elsewhere).
        weight_decay: Adam's decoupled weight decay (AdamW; `gmi_drl.optim.flat.FlatAdam`).
        precision: ``"fp32"`` or ``"bf16-mixed"`` (the forward and backward under autocast to
            bfloat16; see the module docstring).

    Raises:
        ValueError: the module has no parameters; an unknown optimizer or precision.
    """

    def __init__(self, module: nn.Module, loss: Loss, lr: float, max_grad_norm: float,
                 eps: float = 1e-8, reducer: GradReducer | None = None,
                 compile: bool = False, optimizer: str = "adam",
                 cuda_graphs: bool = False, weight_decay: float = 0.0,
                 precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r} must be one of {PRECISIONS}")
        self.module, self.loss, self.max_grad_norm = module, loss, max_grad_norm
        self.reducer = reducer or IdentityReducer()
        self.params = FlatParams(module)
        self.precision = precision
        if precision == "bf16-mixed" and self.params.data.device.type == "cpu":
            _warn_without_bf16_instructions()
        self.fused = compile and self.reducer.world_size == 1 and self._fusable()
        self.optimizer_name, self.weight_decay = optimizer, weight_decay
        self.optimizer = make_flat_optimizer(optimizer, self._stepped(), lr, eps, self.fused,
                                             weight_decay)
        self._compiled, self._compiled_ok = None, False
        self._graphed: GraphedStep | None = None
        self._followers: list[tuple[FlatParams, float, int]] = []
        self._taken = 0  # optimizer steps taken, as the followers count them
        self._want_graphs = cuda_graphs and self.params.data.device.type == "cuda"
        if compile:
            self._bound = _Bound(module, loss)
            # the flat vector's cut as plain Python values: the graph reads no parameter tensor
            self._layout = (tuple(f"inner.{n}" for n in self.params.names),
                            tuple(p.numel() for p in self.params.params),
                            tuple(tuple(p.shape) for p in self.params.params))
            body = self._fused_body if self.fused else self._grad_body
            self._compiled = compile_graph(body, self.params.data.device.type)

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer.lr = value

    def __call__(self, *batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One gradient step on one minibatch; returns the loss's ``aux`` tensors. A collective
        when the reducer has several members (all call it in the same order).

        Raises:
            RuntimeError: the reduction group broke.
        """
        aux = None
        if self.fused:
            with timer("compiled_step"):
                aux = self._try_compiled(batch)
        if aux is None:
            aux = self._gradient(batch)
            self._apply()
        self._step_followers(self.params)
        return aux

    def follow(self, target: FlatParams, tau: float, every: int = 1) -> None:
        """Keep ``target`` (a target network of the same layout) a Polyak average of these
        weights: after every ``every``-th optimizer step, ``target <- tau theta + (1 - tau)
        target`` (Lillicrap et al. 2016, Algorithm 1; Fujimoto et al. 2018's delayed updates
        with ``every`` > 1), where the step is taken: here after each call, and with stale-sync
        steps on the LWU thread after each applied aggregate, so the targets follow the same
        sequence of weights on every worker without a drain.

        Raises:
            ValueError: ``target`` has another number of parameters, ``tau`` outside (0, 1]
                or ``every < 1``.
        """
        if target.numel != self.params.numel or not 0 < tau <= 1 or every < 1:
            raise ValueError(f"a target of {target.numel} parameters (these weights: "
                             f"{self.params.numel}), tau={tau} in (0, 1], every={every} >= 1")
        self._followers.append((target, tau, every))

    def _step_followers(self, weights: FlatParams) -> None:
        """One optimizer step was taken on ``weights``: the targets due follow them."""
        self._taken += 1
        for target, tau, every in self._followers:
            if self._taken % every == 0:
                soft_update_(target, weights, tau)

    def drain(self) -> dict[str, float]:
        """End of an update: every step taken is in the weights. Returns metrics of the steps
        since the last drain (none for synchronous steps)."""
        return {}

    def state_dict(self) -> dict:
        """The optimizer's state (the weights belong to the module's own state dict)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Raises ``ValueError`` when the state is for another number of parameters."""
        self.optimizer.load_state_dict(state)
        self._taken = self.optimizer.steps  # the followers' schedule goes on where it was

    def close(self) -> None:
        """Release what the step holds (nothing here). Idempotent."""

    # ---- the gradient ---------------------------------------------------------------------------

    def _stepped(self) -> FlatParams:
        """The parameters the optimizer steps (the module's own, synchronously)."""
        return self.params

    def _fusable(self) -> bool:
        return True

    def _gradient(self, batch) -> tuple[torch.Tensor, ...]:
        """``params.grad`` = d loss / d params at the module's weights; returns ``aux``."""
        if self._compiled is not None:
            with timer("compiled_grad"):
                aux = self._try_compiled(batch)
            if aux is not None:
                return aux
        with timer("forward"), self._autocast():
            loss, aux = self.loss(self.module, *batch)
        with timer("backward"):
            self.params.zero_grad()
            loss.backward()
        return tuple(a.detach() for a in aux)

    def _try_compiled(self, batch) -> tuple[torch.Tensor, ...] | None:
        """The compiled body's ``aux``; ``None`` when compiling failed on this platform (no C++
        compiler, an unsupported op): the step then runs eagerly from now on, with a warning."""
        if self._compiled_ok:
            return self._run_compiled(batch)
        try:
            # every GradStep of a process shares one code object; each new minibatch shape is one
            # more graph of it, which dynamo's default limit (8) would turn eager
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                aux = self._compiled(*batch)
        except Exception as e:  # noqa: BLE001 - any compiler failure: fall back, say why
            first = str(e).splitlines()[0] if str(e) else ""
            log.warning("torch.compile failed (%s: %s); gradient steps run eagerly (--no-compile "
                        "skips the attempt)", type(e).__name__, first)
            state = self.optimizer.state_dict()
            self._compiled, self.fused = None, False
            self.optimizer = make_flat_optimizer(self.optimizer_name, self._stepped(),
                                                 state["lr"], self.optimizer.eps,
                                                 weight_decay=self.weight_decay)
            self.optimizer.load_state_dict(state)
            return None
        self._compiled_ok = True
        if self._want_graphs:
            self._graphed = (GraphedStep(self._compiled, self._save, self._restore) if self.fused
                             else GraphedStep(self._compiled, lambda: None, lambda _: None))
        return aux

    def _run_compiled(self, batch) -> tuple[torch.Tensor, ...]:
        """The compiled body, replayed as a CUDA graph where one was asked for and captures."""
        if self._graphed is not None:
            try:
                return self._graphed(*batch)
            except CaptureError as e:  # its warm-up undone: run uncaptured, say why
                log.warning("CUDA graph capture of the gradient step failed (%s); steps run "
                            "without it (--no-cuda-graphs skips the attempt)", e)
                self._graphed = None
        return self._compiled(*batch)

    def _save(self) -> tuple[torch.Tensor, dict]:
        """A copy of what a fused step mutates: the weights and the optimizer's state."""
        return self.params.data.clone(), self.optimizer.state_dict()

    def _restore(self, state: tuple[torch.Tensor, dict]) -> None:
        data, optimizer = state
        self.params.data.copy_(data)
        self.optimizer.load_state_dict(optimizer)

    def _autocast(self):
        """The loss's precision: autocast to bfloat16 with ``bf16-mixed``, else no context at
        all (a disabled autocast still enters the traced graph, and a graph with it is one
        torch's AOT autograd cache bypasses: every process would trace the joint graph again)."""
        if self.precision != "bf16-mixed":
            return contextlib.nullcontext()
        return torch.autocast(self.params.data.device.type, torch.bfloat16)

    def _loss_at(self, theta: torch.Tensor, *batch):
        names, sizes, shapes = self._layout
        weights = {name: part.view(shape)
                   for name, part, shape in zip(names, theta.split(sizes), shapes)}
        with self._autocast():
            return torch.func.functional_call(self._bound, weights, batch)

    def _grad_body(self, *batch):
        grad, aux = torch.func.grad(self._loss_at, has_aux=True)(self.params.data, *batch)
        self.params.grad.copy_(grad)
        return aux

    def _fused_body(self, *batch):
        grad, aux = torch.func.grad(self._loss_at, has_aux=True)(self.params.data, *batch)
        self.optimizer.step(grad * clip_factor(grad, self.max_grad_norm))
        return aux

    # ---- the weight update ----------------------------------------------------------------------

    def _apply(self) -> None:
        """Reduce ``params.grad`` over the group, clip it and take the optimizer step."""
        grad = self.params.grad
        with timer("allreduce"):
            self.reducer.allreduce_([grad])
        with timer("optimizer"):
            clip_grad_norm_(grad, self.max_grad_norm)
            self.optimizer.step()


class StaleSyncGradStep(GradStep):
    """Stale-sync gradient steps through the aggregation switch (iSwitch §4.1, Algorithm 1).

    The module's weights are ``θ_local``, what gradients are computed on; the optimizer steps a
    second copy ``θ`` on the pipeline's LWU thread, in aggregation order, so every worker's
    ``θ`` is bit-identical after every step. Each call waits until ``θ`` misses at most
    ``staleness_bound`` steps, copies it into ``θ_local``, computes the gradient and hands it
    over (the ``allreduce`` section times the waits). `drain` waits for every step and copies
    ``θ`` back, so rollouts and checkpoints see every step; it returns
    ``comm/staleness_mean`` and ``comm/staleness_max`` of the steps since the last drain
    (Async iSwitch also ``comm/staleness_dropped``: this worker's gradients dropped so far).
    ``staleness_bound = 0`` gives the synchronous result bit for bit.

    Args:
        as `GradStep`, with ``reducer`` a `gmi_drl.comm.switch.SwitchReducer`, and
        staleness_bound: ``S >= 0``, in steps. A
            `gmi_drl.comm.switch.threshold.ThresholdReducer` runs Async iSwitch instead (its H
            and S; `gmi_drl.comm.switch.threshold.ThresholdPipeline`): each step's gradient
            goes to the switch, aggregates of H gradients of any workers are applied in the
            switch's order.

    Raises:
        ValueError: ``staleness_bound < 0``, or the reducer is not the switch's.
    """

    def __init__(self, module: nn.Module, loss: Loss, lr: float, max_grad_norm: float,
                 eps: float = 1e-8, reducer: GradReducer | None = None,
                 compile: bool = False, optimizer: str = "adam",
                 staleness_bound: int = 0, cuda_graphs: bool = False,
                 weight_decay: float = 0.0, precision: str = "fp32") -> None:
        import copy

        from gmi_drl.comm.switch.pipeline import StaleSyncPipeline
        from gmi_drl.comm.switch.threshold import ThresholdPipeline, ThresholdReducer

        self._weights = FlatParams(copy.deepcopy(module))  # θ, before the module is re-homed
        super().__init__(module, loss, lr, max_grad_norm, eps, reducer, compile, optimizer,
                         cuda_graphs, weight_decay, precision)
        if isinstance(self.reducer, ThresholdReducer):  # Async iSwitch: S is the reducer's
            self.pipeline = ThresholdPipeline(self.reducer, self._apply_mean)
        else:
            self.pipeline = StaleSyncPipeline(self.reducer, staleness_bound, self._apply_mean)
        self._counts_before: Counter[int] = Counter()
        self._shadows: list[tuple[FlatParams, _Shadow]] = []  # (target, what follows θ)

    def follow(self, target: FlatParams, tau: float, every: int = 1) -> None:
        """As `GradStep.follow`; the LWU thread steps a shadow of ``target`` after each
        aggregate it applies to ``θ``, and the shadow is copied into ``target`` with ``θ``
        (`fetch`, `drain`): the target the gradient sees is that of the weights it sees."""
        super().follow(target, tau, every)
        shadow = _Shadow(target.data.clone(), target.numel)
        self._shadows.append((target, shadow))
        self._followers[-1] = (shadow, tau, every)

    def _stepped(self) -> FlatParams:
        return self._weights

    def _fusable(self) -> bool:
        return False  # the optimizer runs on the pipeline's thread

    def __call__(self, *batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with timer("allreduce"):  # blocked by the staleness bound
            self.pipeline.fetch(self._pull)
        aux = self._gradient(batch)
        self.pipeline.push(self.params.grad)
        return aux

    def drain(self) -> dict[str, float]:
        pipe = self.pipeline
        with timer("allreduce"):
            pipe.drain(self._pull)
        counts = pipe.staleness_counts - self._counts_before
        self._counts_before = Counter(pipe.staleness_counts)
        out = {}
        if counts:
            out = {"comm/staleness_mean": sum(k * v for k, v in counts.items()) / counts.total(),
                   "comm/staleness_max": float(max(counts))}
        if hasattr(pipe, "staleness_dropped"):  # Async iSwitch: gradients dropped, in all
            out["comm/staleness_dropped"] = float(pipe.staleness_dropped)
        return out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._weights.data.copy_(self.params.data)  # θ = θ_local = the loaded weights
        for target, shadow in self._shadows:  # (the algorithm loads its targets first)
            shadow.data.copy_(target.data)

    def close(self) -> None:
        """Stop the pipeline's thread, if one still runs (after an error). Idempotent."""
        self.pipeline.close()

    def _pull(self) -> None:
        """``θ_local ← θ``, and each target from its shadow (the pipeline calls it under its
        lock)."""
        self.params.data.copy_(self._weights.data)
        for target, shadow in self._shadows:
            target.data.copy_(shadow.data)

    def _apply_mean(self, mean) -> None:
        """The LWU thread: the synchronous path's step on ``θ`` with the aggregated mean gradient
        ``(P,) float32`` (NumPy): clip the norm, one optimizer step."""
        w = self._weights
        w.grad.copy_(torch.from_numpy(mean))
        clip_grad_norm_(w.grad, self.max_grad_norm)
        self.optimizer.step()
        self._step_followers(w)


class _Shadow(NamedTuple):
    """A stale-sync target's copy on the LWU thread (what `soft_update_` steps)."""

    data: torch.Tensor
    numel: int


class AsyncPSGradStep(GradStep):
    """Asynchronous gradient steps through a parameter server (iSwitch's Async PS baseline,
    §2.2 Fig. 3 and §6.2, staleness bound ``S``; the protocol and the choice of pushing updates
    are in `gmi_drl.comm.ps`).

    A call computes the gradient on the module's weights (the server's weights of version
    ``v``, pulled with the last step), clips it and takes the optimizer step as `GradStep` does,
    pushes the difference it made to the weights, tagged ``v``, and loads the weights the server
    answers with (its version ``u``, with or without this update: the server drops an update
    with ``u - v > S``). The first call pulls the server's weights (this module's become the
    stream's initial weights if it has none). `drain` takes no step and talks to no one: the
    weights are those of the last answer; it returns ``comm/staleness_mean`` and
    ``comm/staleness_max`` of the updates applied and ``comm/dropped`` (updates dropped) since
    the last drain. `close` waits until every worker finished the stream and loads its final
    weights, so every worker ends with the server's weights.

    Args:
        as `GradStep`, with ``reducer`` a `gmi_drl.comm.ps.AsyncPSClient` (the bound is its
        ``staleness_bound``).

    Raises:
        ValueError: the reducer is not an `AsyncPSClient`.
    """

    def __init__(self, module: nn.Module, loss: Loss, lr: float, max_grad_norm: float,
                 eps: float = 1e-8, reducer: GradReducer | None = None,
                 compile: bool = False, optimizer: str = "adam",
                 cuda_graphs: bool = False, weight_decay: float = 0.0,
                 precision: str = "fp32") -> None:
        if not isinstance(reducer, AsyncPSClient):
            raise ValueError("asynchronous steps need the asynchronous parameter server's "
                             f"client (AsyncPSClient); got {type(reducer).__name__}")
        super().__init__(module, loss, lr, max_grad_norm, eps, reducer, compile, optimizer,
                         cuda_graphs, weight_decay, precision)
        self.client: AsyncPSClient = reducer
        self.stream = reducer.new_stream()
        self.version: int | None = None  # of the module's weights at the server; None: unpulled
        self._before = torch.zeros_like(self.params.data)
        self._host = np.zeros(self.params.numel, np.float32)  # the server's weights
        self._update = np.zeros_like(self._host)
        self._staleness: Counter[int] = Counter()
        self._dropped = 0

    def _fusable(self) -> bool:
        return False  # the update is pushed between the optimizer step and the next gradient

    def __call__(self, *batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.version is None:
            with timer("allreduce"):
                torch.from_numpy(self._host).copy_(self.params.data)
                self._load(self.client.pull(self.stream, self._host))
        aux = self._gradient(batch)
        data, version = self.params.data, self.version
        with timer("optimizer"):
            self._before.copy_(data)
            clip_grad_norm_(self.params.grad, self.max_grad_norm)
            self.optimizer.step()
            data.sub_(self._before)  # the update
        with timer("allreduce"):
            torch.from_numpy(self._update).copy_(data)
            applied, now = self.client.push(self.stream, version, self._update, self._host)
            self._load(now)
        if applied:
            self._staleness[now - 1 - version] += 1
        else:
            self._dropped += 1
        self._step_followers(self.params)  # the targets follow the server's weights
        return aux

    def drain(self) -> dict[str, float]:
        counts, dropped = self._staleness, self._dropped
        self._staleness, self._dropped = Counter(), 0
        if not counts and not dropped:
            return {}
        out = {"comm/dropped": float(dropped)}
        if counts:
            out["comm/staleness_mean"] = sum(k * v for k, v in counts.items()) / counts.total()
            out["comm/staleness_max"] = float(max(counts))
        return out

    def close(self) -> None:
        """Finish the stream: wait for every worker, then load the server's final weights.
        Idempotent (a step that never pulled has nothing to finish)."""
        if self.version is not None:
            self.client.finish(self.stream, self._host)
            self.params.data.copy_(torch.from_numpy(self._host))
            self.version = None

    def _load(self, version: int) -> None:
        """The module's weights ← the host buffer (the server's weights of ``version``)."""
        self.version = version
        self.params.data.copy_(torch.from_numpy(self._host))


def make_grad_step(module: nn.Module, loss: Loss, lr: float, max_grad_norm: float,
                   eps: float = 1e-8, reducer: GradReducer | None = None, compile: bool = False,
                   staleness_bound: int | None = None, optimizer: str = "adam",
                   cuda_graphs: bool = False, weight_decay: float = 0.0,
                   precision: str = "fp32") -> GradStep:
    """A `GradStep`; with ``staleness_bound`` an int, an `AsyncPSGradStep` when ``reducer`` is an
    `AsyncPSClient` (whose bound must be ``staleness_bound``) and a `StaleSyncGradStep` otherwise
    (see there).

    Raises:
        ValueError: an `AsyncPSClient` with another bound.
    """
    if staleness_bound is None:
        return GradStep(module, loss, lr, max_grad_norm, eps, reducer, compile, optimizer,
                        cuda_graphs, weight_decay, precision)
    if isinstance(reducer, AsyncPSClient):
        if reducer.staleness_bound != staleness_bound:
            raise ValueError(f"staleness_bound={staleness_bound}, but the parameter server's "
                             f"client announced S = {reducer.staleness_bound}")
        return AsyncPSGradStep(module, loss, lr, max_grad_norm, eps, reducer, compile,
                               optimizer, cuda_graphs, weight_decay, precision)
    return StaleSyncGradStep(module, loss, lr, max_grad_norm, eps, reducer, compile, optimizer,
                             staleness_bound, cuda_graphs, weight_decay, precision)
