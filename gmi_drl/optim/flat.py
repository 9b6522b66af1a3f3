"""Parameters and gradients of a module as views into two contiguous buffers, and optimizers on
them (Adam, RMSprop).

With every parameter a view of one ``data`` tensor and every gradient a view of one ``grad``
tensor, zeroing gradients, the global gradient norm, a gradient allreduce and the whole Adam
step are each one or a few vectorised ops instead of a Python loop over parameter tensors: the
per-minibatch fixed cost that dominates small-network training on a CPU. Every quantity that
changes between steps (step count, learning rate) can live in a one-element tensor
(``traced=True``), so the same step runs inside a `torch.compile` graph without recompiling.
`make_flat_optimizer` builds one by name; every optimizer has the same small interface (``lr``,
``steps``, ``step(grad)``, ``state_dict``), so a gradient step never names one.
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

    Attributes:
        params: the module's parameters, in ``module.parameters()`` order.
        names: their names (``module.named_parameters()``).

    Raises:
        ValueError: the module has no parameters, or they differ in dtype or device.
    """

    def __init__(self, module: nn.Module) -> None:
        named = list(module.named_parameters())
        if not named:
            raise ValueError("module has no parameters")
        params = [p for _, p in named]
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
        self.names = [name for name, _ in named]

    @property
    def numel(self) -> int:
        """P, the number of parameters."""
        return self.data.numel()

    def zero_grad(self) -> None:
        self.grad.zero_()


def soft_update_(target: FlatParams, online: FlatParams, tau: float) -> None:
    """``target <- tau online + (1 - tau) target`` over the whole flat vector in one op (a
    copy when ``tau == 1``): a target network's update (Lillicrap et al. 2016, Algorithm 1;
    Mnih et al. 2015 with ``tau = 1``).

    Raises:
        ValueError: the two hold different numbers of parameters.
    """
    if target.numel != online.numel:
        raise ValueError(f"target has {target.numel} parameters, online {online.numel}")
    with torch.no_grad():
        if tau == 1.0:
            target.data.copy_(online.data)
        else:
            target.data.lerp_(online.data, tau)


def clip_grad_norm_(grad: torch.Tensor, max_norm: float) -> None:
    """Scale ``grad (P,)`` in place so its L2 norm is at most ``max_norm`` (the factor of
    ``torch.nn.utils.clip_grad_norm_``: ``min(1, max_norm / (norm + 1e-6))``); nothing where
    ``max_norm`` is infinite. On a CPU the factor is computed on the host (the cheapest form
    there); on a device it stays a tensor there (`clip_factor`: no host sync per step)."""
    if math.isinf(max_norm):
        return
    if grad.device.type != "cpu":
        grad.mul_(clip_factor(grad, max_norm))
        return
    coef = max_norm / (float(torch.linalg.vector_norm(grad)) + 1e-6)
    if coef < 1.0:
        grad.mul_(coef)


def clip_factor(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_`'s factor as a 0-d tensor on ``grad``'s device (no sync, nothing
    branches on it: what a `torch.compile` graph multiplies the gradient by)."""
    return torch.clamp(max_norm / (torch.linalg.vector_norm(grad) + 1e-6), max=1.0)


class FlatAdam:
    """Adam (Kingma & Ba 2015, Algorithm 1) on a `FlatParams`: ``torch.optim.Adam``'s update (eps
    added after the bias-corrected square root), equal up to float rounding.

    Args:
        flat: the parameters. lr: step size. betas, eps: Adam's.
        weight_decay: decoupled weight decay ``lambda``: each step first scales the weights by
            ``1 - lr lambda`` (AdamW, Loshchilov & Hutter 2019, Algorithm 2; ``torch.optim.AdamW``);
            0: Adam.
        traced: keep the step count and learning rate in tensors, so `step` can run inside a
            `torch.compile` graph without recompiling as they change; otherwise they are host
            numbers (fewer ops per eager step).

    Attributes:
        lr: the step size (settable, for annealing).
        steps: steps taken so far.
    """

    def __init__(self, flat: FlatParams, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, traced: bool = False, weight_decay: float = 0.0) -> None:
        self.flat, self.betas, self.eps, self.traced = flat, betas, eps, traced
        self.weight_decay = weight_decay
        self.exp_avg = torch.zeros_like(flat.data)
        self.exp_avg_sq = torch.zeros_like(flat.data)
        self._lr: torch.Tensor | float = lr
        self._steps: torch.Tensor | int = 0
        if traced:
            # shape (1,), not 0-d: torch.compile (2.13, CPU) drops in-place updates of 0-d
            # float64 tensors that are not graph outputs
            self._lr = torch.full((1,), lr, dtype=torch.float64, device=flat.data.device)
            self._steps = torch.zeros(1, dtype=torch.float64, device=flat.data.device)

    @property
    def lr(self) -> float:
        return float(self._lr)

    @lr.setter
    def lr(self, value: float) -> None:
        if self.traced:
            self._lr.fill_(value)
        else:
            self._lr = float(value)

    @property
    def steps(self) -> int:
        return int(self._steps)

    def step(self, grad: torch.Tensor | None = None) -> None:
        """One Adam step from ``grad`` (default: ``flat.grad``) into ``flat.data`` (in place)."""
        b1, b2 = self.betas
        grad = self.flat.grad if grad is None else grad
        if self.weight_decay:
            decay = 1.0 - self._lr * self.weight_decay
            self.flat.data.mul_(decay.float() if self.traced else decay)
        self.exp_avg.lerp_(grad, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        if self.traced:
            self._steps.add_(1.0)
            # the scalars in float64, then float32 before they meet the (P,) vectors
            bias2_sqrt = torch.sqrt(1.0 - b2 ** self._steps)
            scale = ((1.0 - b1 ** self._steps) / (self._lr * bias2_sqrt)).float()
            eps = (self.eps * bias2_sqrt).float()
            # lr/b1 * m / (sqrt(v)/b2s + eps) == m / ((sqrt(v) + eps*b2s) * b1 / (lr*b2s))
            self.flat.data.sub_(self.exp_avg / self.exp_avg_sq.sqrt().add_(eps).mul_(scale))
            return
        self._steps += 1
        bias1 = 1 - b1 ** self._steps
        bias2_sqrt = math.sqrt(1 - b2 ** self._steps)
        # lr/b1 * m / (sqrt(v)/b2s + eps) == (lr*b2s/b1) * m / (sqrt(v) + eps*b2s): two ops fewer
        denom = self.exp_avg_sq.sqrt().add_(self.eps * bias2_sqrt)
        self.flat.data.addcdiv_(self.exp_avg, denom, value=-self._lr * bias2_sqrt / bias1)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "lr": self.lr, "exp_avg": self.exp_avg.clone(),
                "exp_avg_sq": self.exp_avg_sq.clone()}

    def load_state_dict(self, state: dict) -> None:
        """The moments and step count of ``state``; ``lr`` stays this optimizer's (the run's
        setting: a resumed run may change it), not the stored one.

        Raises:
            ValueError: the stored moments have another size or come from another optimizer."""
        if "exp_avg" not in state:
            raise ValueError("optimizer state is not Adam's (another --algo optimizer?)")
        if state["exp_avg"].shape != self.exp_avg.shape:
            raise ValueError(f"optimizer state for {state['exp_avg'].numel()} parameters, this "
                             f"model has {self.exp_avg.numel()}")
        if self.traced:
            self._steps.fill_(float(state["steps"]))
        else:
            self._steps = int(state["steps"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])


class FlatRMSprop:
    """RMSprop (Tieleman & Hinton 2012) on a `FlatParams`: ``torch.optim.RMSprop``'s update without
    momentum or centring (``v = alpha v + (1 - alpha) g^2``; ``theta -= lr g / (sqrt(v) + eps)``,
    ``v`` starting at 0), the optimizer of A2C in Mnih et al. 2016 and Stable-Baselines3; with
    ``tf_like``, TensorFlow's form (``v`` starting at 1, ``theta -= lr g / sqrt(v + eps)``), which
    Stable-Baselines3's ``RMSpropTFLike`` reproduces and RL-Zoo's Atari A2C uses: its first steps
    are about ``lr`` times the gradient, not ``lr`` per weight.

    Args:
        flat: the parameters. lr: step size. alpha: smoothing constant. eps: added to the root
            (``tf_like``: under it). traced: keep the learning rate in a tensor (see `FlatAdam`).
        tf_like: TensorFlow's form.
    """

    def __init__(self, flat: FlatParams, lr: float, alpha: float = 0.99, eps: float = 1e-8,
                 traced: bool = False, tf_like: bool = False) -> None:
        self.flat, self.alpha, self.eps, self.traced = flat, alpha, eps, traced
        self.tf_like = tf_like
        self.square_avg = (torch.ones_like if tf_like else torch.zeros_like)(flat.data)
        self._lr: torch.Tensor | float = lr
        self._steps: torch.Tensor | int = 0
        if traced:
            self._lr = torch.full((1,), lr, dtype=torch.float32, device=flat.data.device)
            self._steps = torch.zeros(1, dtype=torch.float64, device=flat.data.device)

    lr = FlatAdam.lr
    steps = FlatAdam.steps

    def step(self, grad: torch.Tensor | None = None) -> None:
        """One RMSprop step from ``grad`` (default: ``flat.grad``) into ``flat.data`` (in place)."""
        grad = self.flat.grad if grad is None else grad
        self.square_avg.mul_(self.alpha).addcmul_(grad, grad, value=1 - self.alpha)
        if self.tf_like:
            denom = self.square_avg.add(self.eps).sqrt_()
        else:
            denom = self.square_avg.sqrt().add_(self.eps)
        if self.traced:
            self._steps.add_(1.0)
            self.flat.data.sub_(grad / denom * self._lr)
        else:
            self._steps += 1
            self.flat.data.addcdiv_(grad, denom, value=-self._lr)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "lr": self.lr, "square_avg": self.square_avg.clone()}

    def load_state_dict(self, state: dict) -> None:
        """The average and step count of ``state``; ``lr`` stays this optimizer's (as
        `FlatAdam.load_state_dict`).

        Raises:
            ValueError: the stored average has another size or comes from another optimizer."""
        if "square_avg" not in state:
            raise ValueError("optimizer state is not RMSprop's (another --algo optimizer?)")
        if state["square_avg"].shape != self.square_avg.shape:
            raise ValueError(f"optimizer state for {state['square_avg'].numel()} parameters, "
                             f"this model has {self.square_avg.numel()}")
        if self.traced:
            self._steps.fill_(float(state["steps"]))
        else:
            self._steps = int(state["steps"])
        self.square_avg.copy_(state["square_avg"])


OPTIMIZERS = ("adam", "rmsprop", "rmsprop_tf")
"""names `make_flat_optimizer` knows"""


def make_flat_optimizer(name: str, flat: FlatParams, lr: float, eps: float,
                        traced: bool = False, weight_decay: float = 0.0) -> FlatAdam | FlatRMSprop:
    """``"adam"`` (`FlatAdam`, betas 0.9/0.999; AdamW with ``weight_decay``), ``"rmsprop"``
    (`FlatRMSprop`, alpha 0.99) or ``"rmsprop_tf"`` (the same in TensorFlow's form,
    ``tf_like``) on ``flat``.

    Raises:
        ValueError: another name, or weight decay with RMSprop.
    """
    if name == "adam":
        return FlatAdam(flat, lr, eps=eps, traced=traced, weight_decay=weight_decay)
    if weight_decay:
        raise ValueError(f"weight_decay={weight_decay} is Adam's (AdamW) only, not {name!r}'s")
    if name in ("rmsprop", "rmsprop_tf"):
        return FlatRMSprop(flat, lr, eps=eps, traced=traced, tf_like=name == "rmsprop_tf")
    raise ValueError(f"optimizer {name!r} must be one of {OPTIMIZERS}")
