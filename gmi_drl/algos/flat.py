"""Parameters and gradients of a module as views into two contiguous buffers, and Adam on them.

With every parameter a view of one ``data`` tensor and every gradient a view of one ``grad``
tensor, zeroing gradients, the global gradient norm, a gradient all-reduce and the whole Adam
step are each one or a few vectorised ops, instead of a Python loop over parameter tensors:
the per-minibatch fixed cost that dominates small-network PPO on a CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class FlatParams:
    """Re-home ``module``'s parameters into ``data (P,) float32`` and their grads into ``grad (P,)``.

    After construction ``p.data`` and ``p.grad`` of every parameter are views of `data` / `grad`
    (backward accumulates into them in place); ``module.load_state_dict`` copies into the views.
    Moving the module to another device or dtype afterwards breaks the link.

    Raises:
        ValueError: the module has no parameters, or they differ in dtype or device.
    """

    def __init__(self, module: nn.Module) -> None:
        params = list(module.parameters())
        if not params:
            raise ValueError("module has no parameters")
        if len({(p.dtype, p.device) for p in params}) != 1:
            raise ValueError("all parameters must share one dtype and device")
        total = sum(p.numel() for p in params)
        self.data = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
        self.grad = torch.zeros_like(self.data)
        offset = 0
        for p in params:
            n = p.numel()
            self.data[offset:offset + n].copy_(p.data.view(-1))
            p.data = self.data[offset:offset + n].view_as(p)
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        self.params = params

    def zero_grad(self) -> None:
        self.grad.zero_()

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale ``grad`` in place so its L2 norm is at most ``max_norm`` (as
        ``torch.nn.utils.clip_grad_norm_``: factor ``min(1, max_norm / (norm + 1e-6))``).

        Returns the norm before clipping. Reads the norm on the host (free on a CPU; a device
        sync on a GPU).
        """
        norm = float(torch.linalg.vector_norm(self.grad))
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            self.grad.mul_(coef)
        return norm


class FlatAdam:
    """Adam (Kingma & Ba 2015, Algorithm 1) on a `FlatParams`: the update of ``torch.optim.Adam``
    (eps added after the bias-corrected sqrt), equal up to float rounding.

    Args:
        flat: the parameters. lr: step size (mutable attribute, for annealing). betas, eps: Adam's.
    """

    def __init__(self, flat: FlatParams, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.flat, self.lr, self.betas, self.eps = flat, lr, betas, eps
        self.exp_avg = torch.zeros_like(flat.data)
        self.exp_avg_sq = torch.zeros_like(flat.data)
        self._denom = torch.zeros_like(flat.data)
        self.steps = 0

    def step(self) -> None:
        """One Adam step from ``flat.grad`` into ``flat.data`` (in place)."""
        b1, b2 = self.betas
        self.steps += 1
        grad = self.flat.grad
        self.exp_avg.lerp_(grad, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        bias1 = 1 - b1 ** self.steps
        bias2_sqrt = math.sqrt(1 - b2 ** self.steps)
        # lr/b1 * m / (sqrt(v)/b2s + eps) == (lr*b2s/b1) * m / (sqrt(v) + eps*b2s): two ops fewer
        denom = torch.sqrt(self.exp_avg_sq, out=self._denom).add_(self.eps * bias2_sqrt)
        self.flat.data.addcdiv_(self.exp_avg, denom, value=-self.lr * bias2_sqrt / bias1)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "lr": self.lr, "exp_avg": self.exp_avg.clone(),
                "exp_avg_sq": self.exp_avg_sq.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Raises ``ValueError`` when the stored moments have another size."""
        if state["exp_avg"].shape != self.exp_avg.shape:
            raise ValueError(f"optimizer state for {state['exp_avg'].numel()} parameters, this "
                             f"model has {self.exp_avg.numel()}")
        self.steps, self.lr = int(state["steps"]), float(state["lr"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
