"""NumPy execution of tanh MLPs whose weights stay in their torch tensors (CPU only, no copy).

Why: on a CPU, small-network PPO (64-64 hidden layers, minibatches of 64, acting for 8 envs) is
bound by the fixed cost per tensor operation, not by arithmetic. NumPy's is ~0.5 us per small op
against torch's ~3 us (numpy 2.4 and torch 2.13 on this project's 2-core CPU machine), so the
same formulas on NumPy views of the same memory run about twice as fast. The torch module stays
the source of truth: checkpoints, autograd, GPUs and every other model use it unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from gmi_drl.models.heads import CategoricalHead, DiagGaussianHead
from gmi_drl.models.mlp import MLP, Tanh

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def tanh_linears(mlp: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of a tanh `MLP` on the CPU, or ``None`` when it is anything else."""
    if not isinstance(mlp, MLP) or not all(isinstance(m, (nn.Linear, Tanh)) for m in mlp):
        return None
    layers = [m for m in mlp if isinstance(m, nn.Linear)]
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in mlp.parameters()):
        return None
    return layers


def numpy_supported(model) -> bool:
    """Whether an `ActorCritic` can run in NumPy: identity trunk, separate tanh `MLP` actor and
    critic, a `DiagGaussianHead` or `CategoricalHead`, all float32 on the CPU."""
    return (isinstance(model.trunk, nn.Identity) and tanh_linears(model.actor) is not None
            and tanh_linears(model.critic) is not None
            and isinstance(model.head, (DiagGaussianHead, CategoricalHead))
            and all(p.device.type == "cpu" for p in model.head.parameters()))


class NumpyTanhMLP:
    """NumPy views of a tanh `MLP`'s weights and (when they exist) gradients.

    The views alias the tensors' storage: in-place updates of the weights (optimizer steps,
    ``load_state_dict``) are seen at once. Re-homing the parameters (``p.data = ...``, as
    `FlatParams` does, or ``.to(device)``) breaks the alias: build the views after that, or call
    `stale` to check.

    Args:
        mlp: a tanh `MLP` with float32 CPU weights.

    Raises:
        ValueError: ``mlp`` is not such an MLP.
    """

    def __init__(self, mlp: nn.Module) -> None:
        layers = tanh_linears(mlp)
        if layers is None:
            raise ValueError("NumpyTanhMLP needs a tanh MLP with float32 CPU weights")
        self._first = layers[0].weight
        self._ptr = self._first.data_ptr()
        self.weights = [layer.weight.detach().numpy() for layer in layers]  # (out, in)
        self.biases = [layer.bias.detach().numpy() for layer in layers]
        self.weight_grads = self.bias_grads = None
        if all(layer.weight.grad is not None and layer.bias.grad is not None for layer in layers):
            self.weight_grads = [layer.weight.grad.numpy() for layer in layers]
            self.bias_grads = [layer.bias.grad.numpy() for layer in layers]

    def stale(self) -> bool:
        """True when the module's weights no longer live where these views point."""
        return self._first.data_ptr() != self._ptr

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        """Activations ``[x, h1, ..., out]`` for ``x (N, in) float32``; ``out (N, out)`` has no tanh."""
        hs = [x]
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            y = hs[-1] @ w.T
            y += b
            if i < last:
                np.tanh(y, out=y)
            hs.append(y)
        return hs

    def backward(self, hs: list[np.ndarray], g: np.ndarray) -> None:
        """Overwrite the weights' and biases' gradients with ``dL/dW``, ``dL/db`` from ``g = dL/d out``
        (``(N, out)``) and the activations ``hs`` of `forward`: ``dW = g^T h``, ``db = sum g``,
        ``g <- (g W) * (1 - h^2)`` (tanh' = 1 - tanh^2).

        Raises:
            ValueError: the module had no gradient tensors when the views were built.
        """
        if self.weight_grads is None:
            raise ValueError("the MLP had no .grad tensors when NumpyTanhMLP was built")
        for i in range(len(self.weights) - 1, -1, -1):
            np.matmul(g.T, hs[i], out=self.weight_grads[i])
            np.add.reduce(g, 0, out=self.bias_grads[i])  # np.sum without its Python wrapper
            if i:
                g = g @ self.weights[i]
                h = hs[i]
                g *= 1.0 - h * h


class NumpyActing:
    """`ActorCritic.act` and `ActorCritic.value` in NumPy for CPU models with separate tanh MLPs.

    Samples with the same torch generator draws as the torch heads (``randn`` for the Gaussian,
    ``rand`` for the categorical's Gumbel-max), so for one generator state both give the same
    actions up to float rounding.

    Args:
        model: an `ActorCritic` whose trunk is ``nn.Identity``, actor and critic tanh `MLP` s,
            head `DiagGaussianHead` or `CategoricalHead`, all float32 on the CPU.

    Raises:
        ValueError: the model is not supported (check `NumpyActing.supports` first).
    """

    def __init__(self, model) -> None:
        if not self.supports(model):
            raise ValueError(f"{type(self).__name__} needs separate tanh MLPs on the CPU and a "
                             "Gaussian or categorical head")
        self.actor, self.critic = NumpyTanhMLP(model.actor), NumpyTanhMLP(model.critic)
        self.head = model.head
        self.gaussian = isinstance(model.head, DiagGaussianHead)
        if self.gaussian:
            self.logstd = model.head.logstd.detach().numpy()  # (1, A)

    supports = staticmethod(numpy_supported)

    def stale(self) -> bool:
        """True when the model's parameters were re-homed after these views were built."""
        return self.actor.stale() or self.critic.stale()

    def act(self, obs: np.ndarray, generator: torch.Generator
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample actions for ``obs (N, D) float32``.

        Returns ``action (N, A) float32`` or ``(N,) int64``, ``logprob (N,) float32`` and
        ``value (N,) float32`` (new arrays).
        """
        out = self.actor.forward(obs)[-1]
        value = self.critic.forward(obs)[-1][:, 0]
        if self.gaussian:
            noise = torch.randn(out.shape, generator=generator).numpy()
            std = np.exp(self.logstd)
            action = noise * std
            action += out
            # z = (action - mean) / std is the noise itself
            logprob = (noise * noise).sum(1)
            logprob *= -0.5
            logprob -= self.logstd.sum() + out.shape[1] * _HALF_LOG_2PI
            return action, logprob, value
        log_neg_log_u = torch.rand(out.shape, generator=generator).log_().neg_().log_().numpy()
        action = (out - log_neg_log_u).argmax(1)  # Gumbel-max, as CategoricalHead.sample
        shifted = out - out.max(1, keepdims=True)
        logp_all = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        return action, logp_all[np.arange(len(action)), action], value

    def value(self, obs: np.ndarray) -> np.ndarray:
        """``V(obs)``: ``(N,) float32`` for ``obs (N, D) float32``."""
        return self.critic.forward(obs)[-1][:, 0]
