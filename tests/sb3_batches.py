"""Helper of the tests that pin an off-policy update against Stable-Baselines3's: both learners
draw the same minibatches."""

from __future__ import annotations

import numpy as np
import torch

from gmi_drl.rollout.replay import ReplayBatch


def feed_same_batches(ours, ref, updates: int, batch_size: int = 32, gamma: float = 0.9) -> None:
    """Make ``ours.replay.sample`` and ``ref.replay_buffer.sample`` return the same ``updates``
    Pendulum-shaped minibatches (obs (batch_size, 3), actions (batch_size, 1), reward,
    next obs, terminated about 20%), one per call, in order; ours with ``gamma`` as each row's
    discount."""
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    rng = np.random.default_rng(0)
    batches = [[torch.as_tensor(x, dtype=torch.float32) for x in (
        rng.normal(size=(batch_size, 3)), rng.uniform(-1, 1, (batch_size, 1)),
        rng.normal(size=batch_size), rng.normal(size=(batch_size, 3)),
        rng.random(batch_size) < 0.2)] for _ in range(updates)]
    theirs, mine = iter(batches), iter(batches)
    ref.replay_buffer.sample = lambda *_, **__: (lambda o, a, r, n, t: ReplayBufferSamples(
        o, a, n, t[:, None], r[:, None]))(*next(theirs))
    ours.replay = type("Batches", (), {"sample": lambda self, *_: ReplayBatch(
        *next(mine), torch.full((batch_size,), gamma))})()
