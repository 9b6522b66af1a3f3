"""Running observation and reward normalisation, batched over all envs of a pool.

Equivalent to Stable-Baselines3's ``VecNormalize`` (one set of statistics for the whole pool,
updated with a batch per step, clipped to ``[-10, 10]``). The observations are normalised as
Gymnasium's ``NormalizeObservation`` (which CleanRL's ``ppo_continuous_action.py`` uses) does;
the rewards differ from Gymnasium's ``NormalizeReward`` at episode ends: there, as in
``VecNormalize``, the discounted return is zeroed after the step that ended the episode (ended
by termination or truncation) is folded in, where Gymnasium drops it before that step's reward
is added and keeps it across truncations. The state is float64 and lives
where the rollout does (`gmi_drl.rollout.arrays`: NumPy on the CPU, torch on a device); one
implementation serves both.
"""

from __future__ import annotations

import torch

from gmi_drl.rollout.arrays import Array, Arrays, HostArrays


class RunningMeanStd:
    """Mean and variance of a stream of batches (Chan et al. parallel algorithm).

    Starts from ``mean 0, var 1, count epsilon`` exactly as Gymnasium's ``RunningMeanStd``.

    Args:
        shape: shape of one sample.
        epsilon: initial pseudo-count.
        arrays: where the state lives (default: the CPU).
    """

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4,
                 arrays: Arrays | None = None) -> None:
        self.arrays = arrays or HostArrays()
        self.mean = self.arrays.full(shape, 0.0)
        self.var = self.arrays.full(shape, 1.0)
        self.count = float(epsilon)

    def update(self, x: Array) -> None:
        """Fold in a batch ``x (n, *shape)``."""
        n = x.shape[0]
        batch_mean = x.sum(0) / n
        dev = x - batch_mean
        batch_var = (dev * dev).sum(0) / n
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * (n / total)
        m2 = self.var * self.count + batch_var * n + delta * delta * (self.count * n / total)
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict:
        a = self.arrays
        return {"mean": a.to_torch(self.mean), "var": a.to_torch(self.var), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        """Raises ``ValueError`` when the stored shape differs."""
        mean = state["mean"]
        if tuple(mean.shape) != tuple(self.mean.shape):
            raise ValueError(f"normaliser shape {tuple(mean.shape)} != expected "
                             f"{tuple(self.mean.shape)}")
        self.mean = self.arrays.from_torch(mean)
        self.var = self.arrays.from_torch(state["var"])
        self.count = float(state["count"])


class ObsNormalizer:
    """``clip((obs - mean) / sqrt(var + eps), -clip, clip)`` with running statistics.

    Args:
        shape: single observation shape. clip: bound of the output. eps: inside the sqrt.
        arrays: where the statistics live (default: the CPU).
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8,
                 arrays: Arrays | None = None) -> None:
        self.rms = RunningMeanStd(shape, arrays=arrays)
        self.clip, self.eps = clip, eps

    def __call__(self, obs: Array, update: bool = True) -> Array:
        """Normalise ``obs (n, *shape)`` (a new float64 array), first folding it into the
        statistics when ``update``."""
        if update:
            self.rms.update(obs)
        return ((obs - self.rms.mean) / (self.rms.var + self.eps) ** 0.5).clip(-self.clip,
                                                                                self.clip)

    def state_dict(self) -> dict:
        return self.rms.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rms.load_state_dict(state)


class RewardNormalizer:
    """Scale rewards by the running std of each env's discounted return; clip to ``[-clip, clip]``.

    Per step: ``G = gamma * G + r``; fold ``G (num_envs,)`` into the statistics; ``G = 0`` where
    the episode ended (terminated or truncated); return ``clip(r / sqrt(var(G) + eps))``.
    Rewards are not mean-centred. This is SB3's ``VecNormalize`` (see the module docstring for
    Gymnasium's ``NormalizeReward``).

    Args:
        num_envs: envs of the pool. gamma: discount of ``G``. clip, eps: as above.
        arrays: where the statistics live (default: the CPU).
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8,
                 arrays: Arrays | None = None) -> None:
        self.rms = RunningMeanStd((), arrays=arrays)
        self.returns = self.rms.arrays.full((num_envs,), 0.0)
        self.gamma, self.clip, self.eps = gamma, clip, eps

    def __call__(self, rewards: Array, done: Array, rows: slice = slice(None)) -> Array:
        """``rewards (n,) float``, ``done (n,) bool`` of the envs ``rows`` (default: all
        ``num_envs``) -> normalised rewards (a new float64 array)."""
        returns = self.returns[rows] * self.gamma + rewards
        self.rms.update(returns)
        returns[done] = 0.0
        if rows != slice(None):  # a new array, never written in place (state_dict may share it)
            returns, part = self.rms.arrays.copy(self.returns), returns
            returns[rows] = part
        self.returns = returns
        return (rewards / (self.rms.var + self.eps) ** 0.5).clip(-self.clip, self.clip)

    def state_dict(self) -> dict:
        return {"rms": self.rms.state_dict(), "returns": self.rms.arrays.to_torch(self.returns)}

    def load_state_dict(self, state: dict) -> None:
        """Raises ``ValueError`` when the number of envs differs."""
        returns: torch.Tensor = state["returns"]
        if tuple(returns.shape) != tuple(self.returns.shape):
            raise ValueError(f"reward normaliser has {returns.shape[0]} envs, expected "
                             f"{self.returns.shape[0]}")
        self.rms.load_state_dict(state["rms"])
        self.returns = self.rms.arrays.from_torch(returns)
