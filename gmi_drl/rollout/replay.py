"""Uniform experience replay for off-policy algorithms (DQN; Mnih et al. 2015, §Methods
"experience replay"), in two layouts behind one interface (`make_replay` picks):

- `ReplayBuffer`: each transition stores its observation and the one that followed it
  (preallocated tensors on the learner's device, written through NumPy views on the CPU; on a
  GPU, staged on the host and written in blocks).
- `FrameReplayBuffer`: for frame stacks (Atari's ``uint8 (stack, H, W)``), each frame is
  stored once per env stream, not once per stack and transition; stacks are rebuilt at sampling.

Both store, where an episode ended, the final observation as the next one, so a truncated
episode is bootstrapped from its real last state. Both sample n-step transitions when built
with ``n_step > 1`` (Sutton & Barto §7.1; the "multi-step" component of Rainbow, Hessel et al.
2018): the discounted rewards of up to ``n_step`` steps of the same env, cut where the episode
ended or where no later step is stored yet, and the observation that followed the last of them.
"""

from __future__ import annotations

import math
import logging
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

log = logging.getLogger(__name__)

STAGE_ROWS = 4096
"""transitions a `ReplayBuffer` on a GPU gathers on the host before it writes them to the
device, one copy per tensor (at the latest when it is sampled)"""


class ReplayBatch(NamedTuple):
    """A sampled minibatch of ``B`` transitions (tensors on the buffer's device)."""

    obs: torch.Tensor
    """``(B, *obs_shape)``, the pool's dtype"""
    actions: torch.Tensor
    """``(B,) int64`` (Discrete) or ``(B, A) float32`` (Box)"""
    rewards: torch.Tensor
    """``(B,) float32``"""
    next_obs: torch.Tensor
    """``(B, *obs_shape)``"""
    terminated: torch.Tensor
    """``(B,) float32``: 1 where the episode terminated (no bootstrap), 0 otherwise"""
    discount: torch.Tensor
    """``(B,) float32``: ``gamma ** m``, the discount of the bootstrap from ``next_obs`` after
    the ``m`` rewards summed in ``rewards`` (``m = 1`` without n-step returns)"""


def _check_n_step(n_step: int, gamma: float) -> None:
    if n_step < 1:
        raise ValueError(f"n_step={n_step} must be >= 1")
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")


def replay_config_errors(buffer_size: int, minibatch_size: int, n_step: int,
                         num_envs: int) -> list[str]:
    """What an off-policy config (``algo.*`` fields) gets wrong about its `ReplayBuffer`,
    before one is built: a minibatch larger than the buffer (it would draw the same transitions
    over and over), an n-step buffer that cannot hold one step of every env."""
    errors = []
    if 1 <= buffer_size < minibatch_size:
        errors.append(f"algo.minibatch_size={minibatch_size} must be <= algo.buffer_size="
                      f"{buffer_size}: a minibatch would draw the same transitions again and "
                      "again")
    if n_step > 1 and 1 <= buffer_size < num_envs:
        errors.append(f"algo.buffer_size={buffer_size} must be >= env.num_envs={num_envs} with "
                      f"algo.n_step={n_step} (an n-step buffer holds a step of every env)")
    return errors


def warmup_errors(learning_starts: int, minibatch_size: int,
                  steps_per_iteration: int) -> list[str]:
    """A minibatch larger than the replay holds at the first gradient step (it would draw the
    same few transitions again and again). The first gradient step comes after the iteration
    in which ``learning_starts`` env steps were passed, so the replay then holds
    ``learning_starts`` rounded up to whole iterations of ``steps_per_iteration``."""
    spi = max(steps_per_iteration, 1)
    warm = max(1, math.ceil(learning_starts / spi)) * spi
    if minibatch_size <= warm:
        return []
    return [f"algo.minibatch_size={minibatch_size} is more than the {warm} transitions the "
            f"replay holds at the first gradient step (algo.learning_starts={learning_starts}, "
            f"in whole iterations of {spi} env steps): raise --algo.learning-starts to "
            f"{minibatch_size} or lower --algo.minibatch-size"]


def _window(exists: np.ndarray | torch.Tensor, done: np.ndarray | torch.Tensor):
    """``(B, n)`` mask of the steps an n-step transition sums: step ``k`` is stored
    (``exists``) and no episode ended at a step before it (``done``)."""
    ended_before = (done.cumsum(1) - done) > 0
    return exists & ~ended_before


def _n_step_sum(per_step: torch.Tensor, window: torch.Tensor,
                gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rewards, discount)``, both ``(B,) float32``: the sums of the ``(B, n)`` per-step
    rewards inside ``window`` (`_window`) discounted by ``gamma ** k``, and ``gamma ** m`` for
    the ``m`` rewards each sums (in float64, then rounded once)."""
    k = torch.arange(per_step.shape[1], device=per_step.device, dtype=torch.float64)
    rewards = (per_step.double() * gamma ** k * window).sum(1).float()
    return rewards, (gamma ** window.sum(1).double()).float()


class ReplayBuffer:
    """A circular buffer of ``capacity`` transitions, filled ``num_envs`` at a time.

    Args:
        capacity: transitions held (the oldest are overwritten first).
        observation_space, action_space: the task's single-env spaces.
        device: where the tensors live (sampling returns tensors there).
        n_step: rewards summed per sampled transition (1: one-step transitions).
        gamma: their discount factor.
        num_envs: transitions per `add` (one per env, in env order); with ``n_step > 1`` every
            `add` must bring this many, since an env's next step is ``num_envs`` rows later.

    On a device other than the CPU, `add` gathers transitions on the host (up to
    `STAGE_ROWS`) and `flush` writes them; `sample`, `get` and `state_dict` flush first, but the
    tensors themselves (``obs``, ``actions``, ...) lag behind until a `flush`. Transitions whose
    ``done`` is a device tensor (a pool of device tensors: the warp engine), or a CPU tensor
    into a CPU buffer, are written at once with torch ops, never copied to the host.

    Raises:
        ValueError: ``capacity < 1``, ``num_envs < 1``, ``n_step < 1``, ``gamma`` outside
            [0, 1], or ``n_step > 1`` with ``capacity < num_envs``; an action space that is
            neither Discrete nor Box.
    """

    def __init__(self, capacity: int, observation_space: gym.spaces.Box,
                 action_space: gym.spaces.Space, device: torch.device | str = "cpu",
                 n_step: int = 1, gamma: float = 0.99, num_envs: int = 1) -> None:
        if capacity < 1 or num_envs < 1:
            raise ValueError(f"replay capacity={capacity} and num_envs={num_envs} must be >= 1")
        _check_n_step(n_step, gamma)
        if n_step > 1 and capacity < num_envs:
            raise ValueError(f"an n-step replay needs capacity={capacity} >= num_envs={num_envs}"
                             " (one step of every env)")
        self.n_step, self.gamma, self.num_envs = n_step, gamma, num_envs
        self.capacity, self.device = capacity, torch.device(device)
        obs_dtype = torch.from_numpy(np.zeros(0, observation_space.dtype)).dtype
        if obs_dtype != torch.uint8:
            obs_dtype = torch.float32
        shape = (capacity, *observation_space.shape)
        act_shape, act_dtype = _action_layout(action_space)
        d = self.device
        self.obs = torch.zeros(shape, dtype=obs_dtype, device=d)
        self.next_obs = torch.zeros(shape, dtype=obs_dtype, device=d)
        self.actions = torch.zeros((capacity, *act_shape), dtype=act_dtype, device=d)
        self.rewards = torch.zeros(capacity, dtype=torch.float32, device=d)
        self.terminated = torch.zeros(capacity, dtype=torch.float32, device=d)
        self.done = torch.zeros(capacity, dtype=torch.bool, device=d)
        """where an episode ended (terminated or truncated): n-step sums stop there"""
        self._tensors = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated,
                         self.done)
        self._host = [t.numpy() for t in self._tensors] if d.type == "cpu" else None
        # on a device: host rows that `flush` writes with one copy per tensor, from storage row
        # _stage_pos on (one add of a few transitions would be seven small copies otherwise)
        self._stage = None if self._host is not None else [
            np.zeros((min(capacity, STAGE_ROWS), *t.shape[1:]),
                     torch.empty(0, dtype=t.dtype).numpy().dtype) for t in self._tensors]
        self._staged, self._stage_pos = 0, 0
        self.pos, self.size, self.added = 0, 0, 0

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds (all of it is allocated up front)."""
        return sum(t.numel() * t.element_size() for t in self._tensors)

    def flush(self) -> None:
        """Write the transitions staged on the host into the device tensors (one copy per
        tensor, two where the rows wrap). `sample`, `get` and `state_dict` call it; the
        tensors (``obs``, ``actions``, ...) are current after it. A no-op on the CPU."""
        k = self._staged
        if not k:
            return
        start = self._stage_pos
        first = min(k, self.capacity - start)
        for dst, src in zip(self._tensors, self._stage):
            dst[start:start + first].copy_(torch.from_numpy(src[:first]))
            if first < k:
                dst[:k - first].copy_(torch.from_numpy(src[first:k]))
        self._staged = 0

    def add(self, obs, actions, rewards, next_obs, terminated, done=None) -> None:
        """Append ``n`` transitions (NumPy arrays or tensors with a leading ``n`` dim): the
        oldest are overwritten once the buffer is full. ``done``: ``(n,) bool``, where an
        episode ended by termination or truncation (default: ``terminated``).

        Raises:
            ValueError: with ``n_step > 1``, a batch of another size than ``num_envs``.
        """
        n = len(rewards)
        if self.n_step > 1 and n != self.num_envs:
            raise ValueError(f"an n-step replay takes one transition per env ({self.num_envs}) "
                             f"per add, got {n}")
        if done is None:
            done = terminated
        if isinstance(done, torch.Tensor) and (done.device.type != "cpu"
                                               or self._host is not None):
            self._add_tensors((obs, actions, rewards, next_obs, terminated, done), n)
            return
        data = (obs, actions, rewards, next_obs, terminated,
                np.asarray(done.cpu() if isinstance(done, torch.Tensor) else done).astype(bool))
        idx = (self.pos + np.arange(n)) % self.capacity
        if self._host is not None:
            for dst, src in zip(self._host, data):
                dst[idx] = src.numpy() if isinstance(src, torch.Tensor) else src
        elif n <= len(self._stage[0]) and not any(
                isinstance(src, torch.Tensor) and src.device.type != "cpu" for src in data):
            if self._staged + n > len(self._stage[0]):
                self.flush()
            if self._staged == 0:
                self._stage_pos = self.pos
            rows = slice(self._staged, self._staged + n)
            for dst, src in zip(self._stage, data):
                dst[rows] = src.numpy() if isinstance(src, torch.Tensor) else src
            self._staged += n
        else:  # more than the stage holds: straight in
            self.flush()
            index = torch.from_numpy(idx).to(self.device)
            for dst, src in zip(self._tensors, data):
                src = torch.as_tensor(src).to(self.device, dst.dtype)
                dst.index_copy_(0, index, src)
        self._advance(n)

    def _add_tensors(self, data: tuple, n: int) -> None:
        """`add` of tensors (a tensor pool's step) on their device, or of CPU tensors into a CPU
        buffer: torch ops only, no copy to the host (of ``n`` rows over ``capacity``, the
        newest)."""
        self.flush()
        skip = max(n - self.capacity, 0)
        index = (torch.arange(skip, n, device=self.device) + self.pos) % self.capacity
        for dst, src in zip(self._tensors, data):
            src = torch.as_tensor(src[skip:]).to(self.device, dst.dtype, non_blocking=True)
            dst.index_copy_(0, index, src)
        self._advance(n)

    def _advance(self, n: int) -> None:
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.added += n

    def indices(self) -> np.ndarray:
        """``(size,) int64``: the held transitions, numbered in the order they were added
        (0 = the first ever added); what `get` takes."""
        return np.arange(self.added - self.size, self.added, dtype=np.int64)

    def get(self, index: np.ndarray) -> ReplayBatch:
        """The transitions numbered ``index`` (`indices`), ``(B,) int64``.

        Raises:
            IndexError: a transition that is not held.
        """
        index = np.asarray(index, np.int64)
        if index.size and (index.min() < self.added - self.size or index.max() >= self.added):
            raise IndexError(f"transitions {self.added - self.size}..{self.added - 1} are held")
        return self._gather(torch.from_numpy(index % self.capacity).to(self.device))

    def sample(self, batch_size: int, generator: torch.Generator) -> ReplayBatch:
        """``batch_size`` transitions drawn uniformly with replacement from those held, the
        rows drawn on ``generator``'s device (the buffer's, for no copy per sample).

        Raises:
            ValueError: the buffer is empty.
        """
        if self.size == 0:
            raise ValueError("sample from an empty replay buffer")
        return self._gather(torch.randint(self.size, (batch_size,), generator=generator,
                                          device=generator.device).to(self.device))

    def _gather(self, idx: torch.Tensor) -> ReplayBatch:
        """The transitions at storage rows ``idx`` ``(B,)``, as n-step transitions."""
        self.flush()
        obs, actions, rewards, next_obs, terminated = (t.index_select(0, idx)
                                                       for t in self._tensors[:5])
        if self.n_step == 1:
            discount = torch.full_like(rewards, self.gamma)
            return ReplayBatch(obs, actions, rewards, next_obs, terminated, discount)
        k = torch.arange(self.n_step, device=self.device)
        rows = (idx[:, None] + k * self.num_envs) % self.capacity  # (B, n): the env's steps
        newer = (self.pos - 1 - idx) % self.capacity  # rows written after idx
        valid = _window(k * self.num_envs <= newer[:, None], self.done[rows].long())
        rewards, discount = _n_step_sum(self.rewards[rows], valid, self.gamma)
        last = rows.gather(1, (valid.sum(1) - 1)[:, None]).squeeze(1)
        return ReplayBatch(obs, actions, rewards, self.next_obs.index_select(0, last),
                           self.terminated.index_select(0, last), discount)

    def state_dict(self) -> dict:
        """The held transitions (``size`` rows of each tensor, on the CPU), the write
        position, the capacity and ``num_envs`` (rows are laid out by both)."""
        self.flush()
        return {"pos": self.pos, "size": self.size, "added": self.added,
                "capacity": self.capacity, "num_envs": self.num_envs,
                # copies: a CPU slice would be saved with the whole capacity's storage
                "tensors": [t[:self.size].to("cpu", copy=True) for t in self._tensors]}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output. The newest step of each env ends its episode here: the
        run that goes on starts new episodes, which no n-step sum may join. A checkpoint
        written before ``done`` was stored has it rebuilt from the transitions: an episode
        ended where it terminated or where the next step of its env does not start from the
        stored next observation.

        Raises:
            ValueError: the stored transitions do not fit this buffer (another capacity or
                ``num_envs``, where the state records them, or other shapes), or do not hold
                the ``size`` rows the state says.
        """
        size = int(state["size"])
        stored = list(state["tensors"])
        rebuild = len(stored) == len(self._tensors) - 1
        if rebuild:
            stored.append(stored[4] > 0)
        layout = (state.get("capacity", self.capacity), state.get("num_envs", self.num_envs))
        if size > self.capacity or layout != (self.capacity, self.num_envs) or len(
                stored) != len(self._tensors) or any(
                s.shape[0] != size or s.shape[1:] != t.shape[1:]
                for s, t in zip(stored, self._tensors)):
            raise ValueError(f"stored replay of {size} transitions does not fit a buffer of "
                             f"capacity {self.capacity} with these spaces")
        self._staged = 0  # (the loaded rows replace whatever was staged)
        for dst, src in zip(self._tensors, stored):
            dst[:size].copy_(src)
        self.pos, self.size = int(state["pos"]), size
        # checkpoints written before ``added`` existed: the smallest count that fits ``pos``
        self.added = int(state.get("added", size + (self.pos - size) % self.capacity))
        if rebuild and size:
            self._rebuild_done()
        self._end_streams()

    def _rebuild_done(self, chunk: int = 4096) -> None:
        """``done`` of the held rows from the data: terminated, or the env's next step is held
        and does not start from this row's next observation (compared ``chunk`` rows at a
        time, so a large buffer is not copied whole)."""
        for start in range(0, self.size, chunk):
            rows = torch.arange(start, min(start + chunk, self.size), device=self.device)
            after = (rows + self.num_envs) % self.capacity  # the env's next step
            held = (self.pos - 1 - rows) % self.capacity >= self.num_envs
            differs = (self.next_obs[rows] != self.obs[after]).flatten(1).any(1)
            self.done[rows] = (self.terminated[rows] > 0) | (held & differs)

    def _end_streams(self) -> None:
        """Mark the newest stored step of each env as an episode end."""
        newest = (self.pos - 1 - np.arange(min(self.num_envs, self.size))) % self.capacity
        self.done[torch.from_numpy(newest).to(self.device)] = True


class FrameReplayBuffer:
    """Replay of frame-stacked observations that stores each frame once.

    Observations are stacks ``(K, *frame_shape)`` along axis 0 whose next stack, inside an
    episode, is the previous one shifted by one new frame (Atari's ``uint8 (4, 84, 84)``). Each
    env has a circular stream of single frames; a transition holds the stream positions of the
    newest frames of its observation and next observation, and both stacks are the ``K`` frames
    ending there. A step appends one frame per env (the next observation's newest); a stack
    that does not continue its stream (the first observation of an episode, a final
    observation that is not a shift) appends its ``K`` frames. So memory is about one frame
    per transition instead of ``2K`` (`ReplayBuffer`), and any input is stored exactly: what
    continues is found by comparing contents, not assumed.

    The streams hold ``slots + slots // 4 + 2K`` frames, ``slots = ceil(capacity / num_envs)``
    transitions per env. Episodes shorter than about ``4K`` steps append frames faster than
    that; then the oldest transitions whose frames were overwritten are no longer sampled
    (`size` counts only those that can be).

    Args:
        capacity: transitions held (rounded up to a multiple of ``num_envs``).
        observation_space: ``Box`` of ``uint8 (K, *frame_shape)`` stacks.
        action_space: the task's single-env action space (Discrete or Box).
        num_envs: transitions per `add` (one per env, in env order).
        device: where frames and sampled batches live.
        n_step: rewards summed per sampled transition (1: one-step transitions).
        gamma: their discount factor.

    Raises:
        ValueError: ``capacity < 1``, ``num_envs < 1``, ``n_step < 1`` or ``gamma`` outside
            [0, 1]; observations that are not ``uint8`` arrays of at least two dims; an action
            space that is neither Discrete nor Box.
    """

    def __init__(self, capacity: int, observation_space: gym.spaces.Box,
                 action_space: gym.spaces.Space, num_envs: int,
                 device: torch.device | str = "cpu", n_step: int = 1,
                 gamma: float = 0.99) -> None:
        if capacity < 1 or num_envs < 1:
            raise ValueError(f"replay capacity={capacity} and num_envs={num_envs} must be >= 1")
        _check_n_step(n_step, gamma)
        self.n_step, self.gamma = n_step, gamma
        shape = observation_space.shape
        if observation_space.dtype != np.uint8 or len(shape) < 2:
            raise ValueError(f"frame replay stores uint8 frame stacks (K, *frame_shape), got "
                             f"{observation_space}: use ReplayBuffer")
        self.num_envs, self.stack, self.device = num_envs, shape[0], torch.device(device)
        self.slots = -(-capacity // num_envs)
        self.capacity = self.slots * num_envs
        self.frame_slots = self.slots + self.slots // 4 + 2 * self.stack
        act_shape, act_dtype = _action_layout(action_space)
        d, e, n = self.device, num_envs, self.slots
        self.frames = torch.zeros((e, self.frame_slots, *shape[1:]), dtype=torch.uint8, device=d)
        self.actions = torch.zeros((e, n, *act_shape), dtype=act_dtype, device=d)
        self.rewards = torch.zeros((e, n), dtype=torch.float32, device=d)
        self.terminated = torch.zeros((e, n), dtype=torch.float32, device=d)
        self._rows = (self.actions, self.rewards, self.terminated)
        self._host = self.frames.numpy() if d.type == "cpu" else None
        # stream positions (frames appended so far, never wrapped) of each transition's stacks
        self.obs_end = np.zeros((e, n), np.int64)
        self.next_end = np.zeros((e, n), np.int64)
        self.done = np.zeros((e, n), bool)  # an episode ended there: n-step sums stop
        self.head = np.zeros(e, np.int64)  # frames appended to each env's stream
        self.first_valid = np.zeros(e, np.int64)  # oldest transition whose frames are held
        self.steps = 0  # transitions added per env
        self._last_next = np.zeros((e, *shape), np.uint8)
        self._last_end = np.full(e, -1, np.int64)  # stream end of _last_next; -1: none

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds (all of it is allocated up front)."""
        tensors = (self.frames, *self._rows)
        return (sum(t.numel() * t.element_size() for t in tensors) + self.obs_end.nbytes
                + self.next_end.nbytes + self.done.nbytes + self._last_next.nbytes)

    def _lower(self) -> np.ndarray:
        """``(num_envs,)``: the oldest sampleable transition of each env (per-env count)."""
        return np.maximum(self.first_valid, self.steps - self.slots)

    @property
    def size(self) -> int:
        """Transitions that can be sampled."""
        return int((self.steps - self._lower()).sum())

    def add(self, obs, actions, rewards, next_obs, terminated, done=None) -> None:
        """Append one transition per env (arrays with a leading ``num_envs`` dim, env order).
        ``done``: ``(num_envs,) bool``, where an episode ended by termination or truncation
        (default: ``terminated``).

        Raises:
            ValueError: a batch of another size than ``num_envs``.
        """
        obs, next_obs = np.asarray(obs), np.asarray(next_obs)
        e = self.num_envs
        if len(obs) != e:
            raise ValueError(f"frame replay takes one transition per env ({e}), got {len(obs)}")
        continues = (self._last_end >= 0) & _rows_equal(obs, self._last_next)
        shifts = _rows_equal(next_obs[:, :-1], obs[:, 1:])
        if continues.all() and shifts.all():  # the common step: one new frame per env
            obs_end = self._last_end
            self._write(np.arange(e), self.head, next_obs[:, -1])
            self.head += 1
        else:
            obs_end = np.empty(e, np.int64)
            for i in range(e):
                if continues[i]:
                    obs_end[i] = self._last_end[i]
                else:
                    self._append(i, obs[i])
                    obs_end[i] = self.head[i] - 1
                self._append(i, next_obs[i, -1:] if shifts[i] else next_obs[i])
        slot = self.steps % self.slots
        self.obs_end[:, slot], self.next_end[:, slot] = obs_end, self.head - 1
        for dst, src in zip(self._rows, (actions, rewards, terminated)):
            dst[:, slot] = torch.as_tensor(np.asarray(src)).to(self.device, dst.dtype)
        done = terminated if done is None else done
        self.done[:, slot] = np.asarray(done.cpu() if isinstance(done, torch.Tensor) else done,
                                        bool)
        self.steps += 1
        self._last_next[...] = next_obs
        self._last_end = self.head - 1
        self._evict()

    def _append(self, env: int, frames: np.ndarray) -> None:
        n = len(frames)
        self._write(np.full(n, env), self.head[env] + np.arange(n), frames)
        self.head[env] += n

    def _write(self, env: np.ndarray, pos: np.ndarray, frames: np.ndarray) -> None:
        slot = pos % self.frame_slots
        if self._host is not None:
            self._host[env, slot] = frames
        else:
            index = (torch.from_numpy(env).to(self.device), torch.from_numpy(slot).to(self.device))
            self.frames.index_put_(index, torch.from_numpy(np.ascontiguousarray(frames))
                                   .to(self.device))

    def _evict(self) -> None:
        """Advance ``first_valid`` past transitions whose oldest frame was overwritten."""
        oldest_held = self.head - self.frame_slots
        envs = np.arange(self.num_envs)
        while True:
            lower = self._lower()
            stale = lower < self.steps
            start = self.obs_end[envs, lower % self.slots] - self.stack + 1
            stale &= start < oldest_held
            if not stale.any():
                return
            self.first_valid = np.where(stale, lower + 1, self.first_valid)

    def indices(self) -> np.ndarray:
        """``(size,) int64``: the sampleable transitions, numbered ``step * num_envs + env`` in
        the order they were added; what `get` takes."""
        lower, e = self._lower(), self.num_envs
        ids = [np.arange(lo, self.steps) * e + i for i, lo in enumerate(lower)]
        return np.sort(np.concatenate(ids)) if ids else np.zeros(0, np.int64)

    def get(self, index: np.ndarray) -> ReplayBatch:
        """The transitions numbered ``index`` (`indices`), ``(B,) int64``, stacks rebuilt.

        Raises:
            IndexError: a transition that cannot be sampled.
        """
        index = np.asarray(index, np.int64)
        env, step = index % self.num_envs, index // self.num_envs
        if index.size and ((step < self._lower()[env]) | (step >= self.steps)).any():
            raise IndexError("a transition that is not held (see indices())")
        return self._gather(env, step)

    def sample(self, batch_size: int, generator: torch.Generator) -> ReplayBatch:
        """``batch_size`` transitions drawn uniformly with replacement from the sampleable ones.

        Raises:
            ValueError: the buffer is empty.
        """
        lower = self._lower()
        counts = self.steps - lower
        total = int(counts.sum())
        if total == 0:
            raise ValueError("sample from an empty replay buffer")
        u = torch.randint(total, (batch_size,), generator=generator).numpy()
        ends = np.cumsum(counts)
        env = np.searchsorted(ends, u, side="right")
        step = lower[env] + u - (ends[env] - counts[env])
        return self._gather(env, step)

    def _gather(self, env: np.ndarray, step: np.ndarray) -> ReplayBatch:
        """Transition ``step`` (per-env count) of each ``env``, as n-step transitions."""
        slot = step % self.slots
        rows = env * self.slots + slot
        if self.n_step == 1:
            last_slot, last_rows, rewards, discount = slot, rows, None, None
        else:
            steps = step[:, None] + np.arange(self.n_step)
            window = _window(steps < self.steps, self.done[env[:, None], steps % self.slots])
            last_slot = (step + window.sum(1) - 1) % self.slots
            last_rows = env * self.slots + last_slot
            all_rows = (env[:, None] * self.slots + steps % self.slots).ravel()
            per_step = self.rewards.view(-1).index_select(
                0, torch.from_numpy(all_rows).to(self.device)).view(len(env), -1)
            rewards, discount = _n_step_sum(per_step, torch.from_numpy(window).to(self.device),
                                            self.gamma)
        k = self.stack
        offsets = np.arange(1 - k, 1)
        ends = np.concatenate([self.obs_end[env, slot], self.next_end[env, last_slot]])
        f = self.frame_slots
        flat = np.tile(env, 2)[:, None] * f + (ends[:, None] + offsets) % f
        frames = self.frames.view(-1, *self.frames.shape[2:])  # (num_envs * frame_slots, ...)
        stacks = frames.index_select(0, torch.from_numpy(flat.ravel()).to(self.device))
        obs, next_obs = stacks.view(2 * len(env), k, *stacks.shape[1:]).split(len(env))
        row, last = (torch.from_numpy(r).to(self.device) for r in (rows, last_rows))
        actions = self.actions.view(-1, *self.actions.shape[2:]).index_select(0, row)
        if rewards is None:
            rewards = self.rewards.view(-1).index_select(0, row)
            discount = torch.full_like(rewards, self.gamma)
        terminated = self.terminated.view(-1).index_select(0, last)
        return ReplayBatch(obs, actions, rewards, next_obs, terminated, discount)

    _COUNTERS = ("obs_end", "next_end", "head", "first_valid", "_last_next", "_last_end")

    def state_dict(self) -> dict:
        """Everything held (frames and rows on the CPU) and the stream counters."""
        # (tensors: a safe checkpoint load takes no ndarray)
        return {"layout": "frames", "steps": self.steps, "frames": self.frames.cpu(),
                "rows": [t.cpu() for t in self._rows],
                **{name: torch.from_numpy(getattr(self, name).copy())
                   for name in (*self._COUNTERS, "done")}}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output. The newest step of each env ends its episode here: the
        run that goes on starts new episodes, which no n-step sum may join. A checkpoint
        written before ``done`` was stored has it rebuilt from the streams: an episode ended
        where it terminated or where the next step's observation does not end at this step's
        next observation.

        Raises:
            ValueError: the state is not a frame replay of this capacity, ``num_envs`` and
                these spaces.
        """
        if state.get("layout") != "frames" or state["frames"].shape != self.frames.shape or any(
                s.shape != t.shape for s, t in zip(state["rows"], self._rows)):
            raise ValueError(f"stored replay does not fit a frame replay of capacity "
                             f"{self.capacity} over {self.num_envs} envs with these spaces")
        self.frames.copy_(state["frames"])
        for dst, src in zip(self._rows, state["rows"]):
            dst.copy_(src)
        for name in self._COUNTERS:
            value = state[name]
            getattr(self, name)[...] = value.numpy() if isinstance(value, torch.Tensor) else value
        self.steps = int(state["steps"])
        if "done" in state:
            done = state["done"]
            self.done[...] = done.numpy() if isinstance(done, torch.Tensor) else done
        else:  # written before ``done`` was stored (slots not yet written are never read)
            following = np.roll(self.obs_end, -1, axis=1)  # the env's next step, per slot
            self.done[...] = (self.terminated.cpu().numpy() > 0) | (following != self.next_end)
        if self.steps:
            self.done[:, (self.steps - 1) % self.slots] = True


def refill_steps(learning_starts: int, capacity: int, remaining: int) -> int:
    """Env steps a run resumed without its replay buffer collects before it trains again:
    ``learning_starts`` (as a new run), at most the buffer's ``capacity``, and at most half
    the ``remaining`` env steps of the run (so that a short resumed run still trains)."""
    return max(0, min(learning_starts, capacity, remaining // 2))


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(N,) bool``: whether row ``i`` of ``a`` equals row ``i`` of ``b``."""
    return (a == b).reshape(len(a), -1).all(1)


def _action_layout(action_space: gym.spaces.Space) -> tuple[tuple[int, ...], torch.dtype]:
    if isinstance(action_space, gym.spaces.Discrete):
        return (), torch.int64
    if isinstance(action_space, gym.spaces.Box):
        return tuple(action_space.shape), torch.float32
    raise ValueError(f"replay of {type(action_space).__name__} actions is not supported "
                     "(Discrete or Box)")


def is_frame_stack(space: gym.spaces.Space) -> bool:
    """Whether observations of ``space`` are image frame stacks (``uint8 (K, H, W[, C])``,
    ``K > 1``), which `make_replay` stores once per frame."""
    shape = getattr(space, "shape", None) or ()
    return getattr(space, "dtype", None) == np.uint8 and len(shape) >= 3 and shape[0] > 1


def replay_nbytes(capacity: int, spec, num_envs: int) -> int:
    """Bytes `make_replay` would allocate for ``capacity`` transitions of the task ``spec``
    with ``num_envs`` envs, computed without allocating (so a config can be checked against
    the machine's memory before a run starts).

    Raises:
        ValueError: an action space that is neither Discrete nor Box.
    """
    obs, act = spec.observation_space, spec.action_space
    act_shape, act_dtype = _action_layout(act)
    act_bytes = int(np.prod(act_shape, dtype=np.int64)) * torch.empty(0, dtype=act_dtype
                                                                      ).element_size()
    if is_frame_stack(obs):  # the layout of `FrameReplayBuffer.__init__`
        k, frame = obs.shape[0], int(np.prod(obs.shape[1:], dtype=np.int64))
        slots = -(-capacity // num_envs)
        frame_slots = slots + slots // 4 + 2 * k
        per_transition = act_bytes + 4 + 4 + 8 + 8 + 1  # rewards, terminated, the two ends, done
        return num_envs * (frame_slots * frame + slots * per_transition + k * frame)
    obs_bytes = int(np.prod(obs.shape, dtype=np.int64)) * (1 if obs.dtype == np.uint8 else 4)
    return capacity * (2 * obs_bytes + act_bytes + 4 + 4 + 1)  # `ReplayBuffer.__init__`


def make_replay(capacity: int, spec, num_envs: int, device: torch.device | str,
                state: dict | None = None, n_step: int = 1,
                gamma: float = 0.99) -> ReplayBuffer | FrameReplayBuffer:
    """The replay for the task ``spec`` (an `gmi_drl.envs.spec.EnvSpec`): a
    `FrameReplayBuffer` for frame stacks (`is_frame_stack`), a `ReplayBuffer` otherwise;
    holding ``state`` (`state_dict` output) when given; sampling ``n_step``-step transitions
    discounted by ``gamma``. Logs its size in bytes.

    Raises:
        ValueError: as the constructors and ``load_state_dict``.
    """
    obs_space, act_space = spec.observation_space, spec.action_space
    if is_frame_stack(obs_space):
        buf = FrameReplayBuffer(capacity, obs_space, act_space, num_envs, device, n_step, gamma)
        naive = buf.capacity * 2 * int(np.prod(obs_space.shape))
        log.info("replay buffer: %d transitions, %.1f MB (frames stored once; %.1f MB as "
                 "stacks)", buf.capacity, buf.nbytes / 1e6, naive / 1e6)
    else:
        buf = ReplayBuffer(capacity, obs_space, act_space, device, n_step, gamma, num_envs)
        log.info("replay buffer: %d transitions, %.1f MB", capacity, buf.nbytes / 1e6)
    if state is not None:
        buf.load_state_dict(state)
    return buf
