"""The agent role's one call: ``policy.act(obs) -> ActResult``, its implementation chosen once.

A collector never asks how a policy runs. One choice (`implementation`) decides, at
construction, for every network that acts: an actor-critic (`make_acting`), a Q network or a
deterministic actor (`mlp_forward`, which `gmi_drl.algos.dqn.EpsilonGreedy` and
`gmi_drl.algos.ddpg.GaussianExploration` act with):

- ``numpy``: NumPy on views of the torch weights (`NumpyMLP`), on host arrays for MLPs that
  have a NumPy twin (`NumpyActing`: separate tanh MLPs of an actor-critic; `NumpyForward`: a
  tanh or ReLU MLP). Small-network acting on a CPU is bound by the fixed cost per tensor op,
  which NumPy pays several times less than torch; it samples with the same torch generator
  draws as the module.
- ``compiled``: one `torch.compile` graph (`CompiledActing`: `ActorCritic.act_with`, the head's
  random draws taken eagerly from the generator and passed in; `TorchForward` of the compiled
  module).
- ``torch``: the module itself, under ``torch.inference_mode`` or ``torch.no_grad`` (the
  reference: `TorchActing`, `TorchForward`).

Every implementation takes and returns arrays of the collector's `Arrays` kind (NumPy on the
CPU, tensors on a device) and reads the module's current weights on every call.
"""

from __future__ import annotations

import math
from typing import Callable, Literal, Protocol

import numpy as np
import torch
from torch import nn

from gmi_drl.models.actor_critic import ActorCritic, ActResult
from gmi_drl.models.compiled import compile_graph
from gmi_drl.models.heads import CategoricalHead, DiagGaussianHead
from gmi_drl.models.mlp import MLP, Tanh
from gmi_drl.rollout.arrays import Array, Arrays, HostArrays

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class Acting(Protocol):
    """What a collector (and ``gmi-drl eval``) calls; arrays of one `Arrays` kind."""

    def act(self, obs: Array, deterministic: bool = False) -> ActResult:
        """``obs (N, *obs_shape)`` -> action ``(N, A) float32`` or ``(N,) int64``, its
        ``logprob (N,) float32`` and ``value (N,) float32`` (new arrays). Samples with the
        policy's generator, or takes the mode when ``deterministic``."""

    def value(self, obs: Array) -> Array:
        """``V(obs)``: ``(N,) float32``."""


Implementation = Literal["numpy", "compiled", "torch"]


def implementation(arrays: Arrays, numpy_twin: bool, compile: bool) -> Implementation:
    """How a network acts on ``arrays`` (module doc): ``numpy`` on host arrays where it has a
    NumPy twin (``numpy_twin``), else ``compiled`` with ``compile``, else ``torch``."""
    if isinstance(arrays, HostArrays) and numpy_twin:
        return "numpy"
    return "compiled" if compile else "torch"


def make_acting(model: ActorCritic, generator: torch.Generator, arrays: Arrays,
                compile: bool = False) -> Acting:
    """The fastest `Acting` for ``model`` where the collector's arrays live (module doc)."""
    kind = implementation(arrays, NumpyActing.supports(model), compile)
    if kind == "numpy":
        return NumpyActing(model, generator)
    if kind == "compiled":
        return CompiledActing(model, generator, arrays)
    return TorchActing(model, generator, arrays)


Forward = Callable[[Array], Array]
"""``forward(obs (N, *obs_shape)) -> (N, out)``: a network's output, arrays of one kind"""


def mlp_forward(module: nn.Module, mlp: nn.Module, arrays: Arrays,
                post: Callable[[np.ndarray], np.ndarray] | None = None,
                compile: bool = False) -> Forward:
    """``module(obs)`` on ``arrays`` by `implementation`, for a ``module`` that is ``mlp`` on
    flattened observations followed by ``post`` (its NumPy twin: ``np.tanh`` for a
    deterministic actor; ``None``: nothing), e.g. a Q network or a deterministic actor: a
    `NumpyForward` of ``mlp`` where it is a tanh or ReLU `MLP` (`mlp_linears`) and the arrays
    are the host's, else a `TorchForward` of ``module`` (compiled with ``compile``)."""
    kind = implementation(arrays, mlp_linears(mlp) is not None, compile)
    if kind == "numpy":
        return NumpyForward(mlp, post)
    if kind == "compiled":
        return TorchForward(compile_graph(module, arrays.device.type), arrays)
    return TorchForward(module, arrays)


class NumpyForward:
    """``post(mlp(obs))`` in NumPy on views of ``mlp``'s weights (`NumpyMLP`, re-made when
    the parameters were re-homed), on ``obs`` flattened to float32 rows."""

    def __init__(self, mlp: nn.Module, post: Callable[[np.ndarray], np.ndarray] | None) -> None:
        self.mlp, self.post = mlp, post
        self._net = NumpyMLP(mlp)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self._net.stale():
            self._net = NumpyMLP(self.mlp)
        out = self._net.forward(obs.reshape(len(obs), -1).astype(np.float32, copy=False))
        return out if self.post is None else self.post(out)


class TorchForward:
    """``module(obs)`` under ``torch.no_grad`` on arrays of ``arrays``' kind; observations
    other than float32 or uint8 are made float32 first."""

    def __init__(self, module: Callable[[torch.Tensor], torch.Tensor], arrays: Arrays) -> None:
        self.module = module
        self._host = isinstance(arrays, HostArrays)

    def __call__(self, obs: Array) -> Array:
        x = torch.from_numpy(obs) if self._host else obs
        with torch.no_grad():
            out = self.module(x if x.dtype in (torch.uint8, torch.float32) else x.float())
        return out.numpy() if self._host else out


class TorchActing:
    """``model.act`` / ``model.value`` under ``torch.inference_mode``."""

    def __init__(self, model: ActorCritic, generator: torch.Generator, arrays: Arrays) -> None:
        self.model, self.generator = model, generator
        self._host = isinstance(arrays, HostArrays)

    @torch.inference_mode()
    def act(self, obs: Array, deterministic: bool = False) -> ActResult:
        out = self.model.act(self._in(obs), self.generator, deterministic)
        return ActResult(*(self._out(x) for x in out)) if self._host else out

    @torch.inference_mode()
    def value(self, obs: Array) -> Array:
        return self._out(self.model.value(self._in(obs)))

    def _in(self, obs: Array) -> torch.Tensor:
        return torch.from_numpy(obs) if self._host else obs

    def _out(self, x: torch.Tensor) -> Array:
        return x.numpy() if self._host else x


class CompiledActing(TorchActing):
    """`TorchActing` with sampling compiled: ``act_with(obs, noise)`` is one graph; the noise is
    drawn eagerly from the generator, so results equal `TorchActing`'s up to float rounding."""

    def __init__(self, model: ActorCritic, generator: torch.Generator, arrays: Arrays) -> None:
        super().__init__(model, generator, arrays)
        self._act_with = compile_graph(model.act_with, arrays.device.type)

    @torch.inference_mode()
    def act(self, obs: Array, deterministic: bool = False) -> ActResult:
        if deterministic:
            return super().act(obs, True)
        x = self._in(obs)
        out = self._act_with(x, self.model.head.noise(len(x), self.generator, x.device))
        return ActResult(*(self._out(v) for v in out)) if self._host else out


def mlp_linears(mlp: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of an `MLP` with one activation (tanh or ReLU) and float32 CPU weights,
    or ``None`` for anything else."""
    if not isinstance(mlp, MLP):
        return None
    kinds = {type(m) for m in mlp if not isinstance(m, nn.Linear)}
    if len(kinds) > 1 or not kinds <= {Tanh, nn.ReLU}:
        return None
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in mlp.parameters()):
        return None
    return [m for m in mlp if isinstance(m, nn.Linear)]


def tanh_linears(mlp: nn.Module) -> list[nn.Linear] | None:
    """`mlp_linears` of a tanh `MLP` (or of one with a single layer), else ``None``."""
    layers = mlp_linears(mlp)
    return layers if layers is not None and not any(isinstance(m, nn.ReLU) for m in mlp) else None


class NumpyMLP:
    """NumPy views of an `MLP`'s weights (aliasing the tensors' memory, so in-place updates
    such as optimizer steps and ``load_state_dict`` are seen at once; re-homing the parameters
    breaks the alias, which `stale` detects).

    Raises:
        ValueError: ``mlp`` is not a tanh or ReLU MLP with float32 CPU weights.
    """

    def __init__(self, mlp: nn.Module) -> None:
        layers = mlp_linears(mlp)
        if layers is None:
            raise ValueError("NumpyMLP needs a tanh or ReLU MLP with float32 CPU weights")
        self.relu = any(isinstance(m, nn.ReLU) for m in mlp)
        self._first = layers[0].weight
        self._ptr = self._first.data_ptr()
        self.weights = [layer.weight.detach().numpy() for layer in layers]  # (out, in)
        self.biases = [layer.bias.detach().numpy() for layer in layers]

    def stale(self) -> bool:
        """True when the module's weights no longer live where these views point."""
        return self._first.data_ptr() != self._ptr

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(N, out)`` for ``x (N, in) float32``; the last layer has no activation."""
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = x @ w.T
            x += b
            if i < last:
                if self.relu:
                    np.maximum(x, 0.0, out=x)
                else:
                    np.tanh(x, out=x)
        return x


class NumpyActing:
    """`TorchActing` in NumPy for CPU `ActorCritic` s with separate tanh MLPs (module doc).

    Samples with the same torch generator draws as the torch heads (``randn`` for the Gaussian,
    ``rand`` for the categorical's Gumbel-max), so for one generator state both give the same
    actions up to float rounding.

    Raises:
        ValueError: the model is not supported (check `NumpyActing.supports` first).
    """

    def __init__(self, model: ActorCritic, generator: torch.Generator) -> None:
        if not self.supports(model):
            raise ValueError("NumpyActing needs separate tanh MLPs on the CPU and a Gaussian or "
                             "categorical head")
        self.model, self.generator = model, generator
        self._views()

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """Identity trunk, separate tanh `MLP` actor and critic, a `DiagGaussianHead` or
        `CategoricalHead`, all float32 on the CPU."""
        return (isinstance(model, ActorCritic) and isinstance(model.trunk, nn.Identity)
                and tanh_linears(model.actor) is not None
                and tanh_linears(model.critic) is not None
                and isinstance(model.head, (DiagGaussianHead, CategoricalHead))
                and all(p.device.type == "cpu" for p in model.head.parameters()))

    def _views(self) -> None:
        model = self.model
        self.actor, self.critic = NumpyMLP(model.actor), NumpyMLP(model.critic)
        self.gaussian = isinstance(model.head, DiagGaussianHead)
        if self.gaussian:
            self.logstd = model.head.logstd.detach().numpy()  # (1, A)

    def act(self, obs: np.ndarray, deterministic: bool = False) -> ActResult:
        if self.actor.stale() or self.critic.stale():  # parameters were re-homed
            self._views()
        out = self.actor.forward(obs)
        value = self.critic.forward(obs)[:, 0]
        if self.gaussian:
            if deterministic:
                noise = np.zeros(out.shape, np.float32)
            else:
                noise = self.model.head.noise(len(out), self.generator).numpy()
            std = np.exp(self.logstd)
            action = noise * std
            action += out
            # z = (action - mean) / std is the noise itself
            logprob = (noise * noise).sum(1)
            logprob *= -0.5
            logprob -= self.logstd.sum() + out.shape[1] * _HALF_LOG_2PI
            return ActResult(action, logprob, value)
        if deterministic:
            action = out.argmax(1)
        else:
            u = self.model.head.noise(len(out), self.generator)
            action = (out - u.log_().neg_().log_().numpy()).argmax(1)  # Gumbel-max
        shifted = out - out.max(1, keepdims=True)
        logp_all = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        return ActResult(action, logp_all[np.arange(len(action)), action], value)

    def value(self, obs: np.ndarray) -> np.ndarray:
        if self.critic.stale():
            self._views()
        return self.critic.forward(obs)[:, 0]
