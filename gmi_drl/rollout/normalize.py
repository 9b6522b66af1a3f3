"""Running observation and reward normalisation, batched over all envs of a pool.

Equivalent to Gymnasium's ``NormalizeObservation`` / ``NormalizeReward`` wrappers as CleanRL's
``ppo_continuous_action.py`` uses them (plus its clip to ``[-10, 10]``), but with one set of
statistics for the whole pool, updated with a batch per step. All state is float64 NumPy.
"""

from __future__ import annotations

import numpy as np
import torch


class RunningMeanStd:
    """Mean and variance of a stream of batches (Chan et al. parallel algorithm).

    Starts from ``mean 0, var 1, count epsilon`` exactly as Gymnasium's ``RunningMeanStd``.

    Args:
        shape: shape of one sample.
        epsilon: initial pseudo-count.
    """

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = float(epsilon)

    def update(self, x: np.ndarray) -> None:
        """Fold in a batch ``x (n, *shape)``."""
        # = x.mean(0), x.var(0), op for op, without their per-call Python wrappers (hot path)
        n = x.shape[0]
        batch_mean = np.add.reduce(x, 0) / n
        dev = x - batch_mean
        batch_var = np.add.reduce(np.multiply(dev, dev, out=dev), 0) / n
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * (n / total)
        m2 = self.var * self.count + batch_var * n + delta * delta * (self.count * n / total)
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": torch.from_numpy(np.array(self.mean)), "var": torch.from_numpy(np.array(self.var)),
                "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        """Raises ``ValueError`` when the stored shape differs."""
        mean = state["mean"].numpy().astype(np.float64)
        if mean.shape != self.mean.shape:
            raise ValueError(f"normaliser shape {mean.shape} != expected {self.mean.shape}")
        self.mean, self.var = mean, state["var"].numpy().astype(np.float64)
        self.count = float(state["count"])


class ObsNormalizer:
    """``clip((obs - mean) / sqrt(var + eps), -clip, clip)`` with running statistics.

    Args:
        shape: single observation shape. clip: bound of the output. eps: inside the sqrt.
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8) -> None:
        self.rms = RunningMeanStd(shape)
        self.clip, self.eps = clip, eps

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """Normalise ``obs (n, *shape)``, first folding it into the statistics when ``update``."""
        if update:
            self.rms.update(obs)
        out = (obs - self.rms.mean) / np.sqrt(self.rms.var + self.eps)
        return np.minimum(np.maximum(out, -self.clip, out=out), self.clip, out=out)  # clip

    def state_dict(self) -> dict:
        return self.rms.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rms.load_state_dict(state)


class RewardNormalizer:
    """Scale rewards by the running std of each env's discounted return; clip to ``[-clip, clip]``.

    Per step: ``G = gamma * G + r``; fold ``G (num_envs,)`` into the statistics; ``G = 0`` where
    the episode ended; return ``clip(r / sqrt(var(G) + eps))``. Rewards are not mean-centred.

    Args:
        num_envs: envs of the pool. gamma: discount of ``G``. clip, eps: as above.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.rms = RunningMeanStd(())
        self.returns = np.zeros(num_envs, np.float64)
        self.gamma, self.clip, self.eps = gamma, clip, eps

    def __call__(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        """``rewards (num_envs,) float``, ``done (num_envs,) bool`` -> normalised rewards (new array)."""
        self.returns = self.returns * self.gamma + rewards
        self.rms.update(self.returns)
        self.returns[done] = 0.0
        out = rewards / np.sqrt(self.rms.var + self.eps)
        return np.minimum(np.maximum(out, -self.clip, out=out), self.clip, out=out)  # clip

    def state_dict(self) -> dict:
        return {"rms": self.rms.state_dict(), "returns": torch.from_numpy(self.returns.copy())}

    def load_state_dict(self, state: dict) -> None:
        """Raises ``ValueError`` when the number of envs differs."""
        returns = state["returns"].numpy().astype(np.float64)
        if returns.shape != self.returns.shape:
            raise ValueError(f"reward normaliser has {returns.shape[0]} envs, expected "
                             f"{self.returns.shape[0]}")
        self.rms.load_state_dict(state["rms"])
        self.returns = returns
