"""Weights published by a trainer and read by serving GMIs without blocking (GMI-DRL §4.2:
serving GMIs never wait for an update).

A shared-memory double buffer under a seqlock: the trainer writes the buffer readers are not
pointed at, bumping that buffer's sequence number to odd before and to even after, then points
readers at it. A reader copies the newest buffer and keeps the copy only if the sequence number
was even and unchanged across the copy, so it never keeps a torn read; it retries otherwise
(only when the trainer lapped it twice during one copy). Every publication carries its
``policy_version``. Like the rings (`gmi_drl.comm.channels.ring`) and the MPR block, it relies
on x86's store order (no fences from Python); on a weakly ordered CPU (aarch64) a reader could
see a sequence number before the data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Sequence

import numpy as np

from gmi_drl import blocks

_HEADER = 128  # line 0: latest buffer index; line 1: per buffer (seq, version) x 2


def _nbytes(arrays: Sequence[np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays)


@dataclass(frozen=True)
class WeightStoreHandle:
    """Picklable: the block's name and the payload's size in bytes."""

    name: str
    nbytes: int


class WeightStore:
    """One side of a weight store (`create` it in the parent, `attach` in each GMI).

    The payload is a fixed sequence of arrays (weights, normaliser statistics), the same shapes
    and dtypes on both sides, copied in order.
    """

    def __init__(self, handle: WeightStoreHandle, shm: shared_memory.SharedMemory,
                 owner: bool = False) -> None:
        self.handle, self._shm, self._owner = handle, shm, owner
        buf = np.frombuffer(shm.buf, np.uint8, count=_HEADER + 2 * handle.nbytes)
        head = buf[:_HEADER].view(np.int64)
        self._latest, self._seq, self._version = head[0:1], head[8:16:2], head[9:16:2]
        self._bufs = [buf[_HEADER + i * handle.nbytes:_HEADER + (i + 1) * handle.nbytes]
                      for i in range(2)]

    @classmethod
    def create(cls, nbytes: int) -> "WeightStore":
        """A zeroed store of ``nbytes`` payload bytes, nothing published."""
        shm = blocks.create(_HEADER + 2 * max(nbytes, 1))
        np.frombuffer(shm.buf, np.uint8, count=_HEADER)[:] = 0
        return cls(WeightStoreHandle(shm.name, nbytes), shm, owner=True)

    @classmethod
    def attach(cls, handle: WeightStoreHandle) -> "WeightStore":
        return cls(handle, shared_memory.SharedMemory(name=handle.name))

    @property
    def version(self) -> int | None:
        """The newest published version (``None``: none yet)."""
        i = int(self._latest[0])
        return int(self._version[i]) if int(self._seq[i]) else None

    def publish(self, arrays: Sequence[np.ndarray], version: int) -> None:
        """Make ``arrays`` (in order) the newest weights, as ``version`` (the one writer).

        Raises:
            ValueError: the arrays do not add up to the store's size.
        """
        if _nbytes(arrays) != self.handle.nbytes:
            raise ValueError(f"{_nbytes(arrays)} bytes published into a store of "
                             f"{self.handle.nbytes}")
        i = 1 - int(self._latest[0])
        self._seq[i] += 1  # odd: being written
        _pack(arrays, self._bufs[i])
        self._version[i] = version
        self._seq[i] += 1
        self._latest[0] = i

    def read_into(self, arrays: Sequence[np.ndarray], newer_than: int = -1) -> int | None:
        """Copy the newest weights into ``arrays`` when their version is above
        ``newer_than``; returns that version, or ``None`` (nothing newer, or nothing
        published yet: ``arrays`` untouched). Never returns a torn copy; never blocks on the
        writer."""
        while True:
            i = int(self._latest[0])
            s1 = int(self._seq[i])
            version = int(self._version[i])
            if s1 == 0:  # never written: its zero bytes are no weights of version 0
                return None
            if s1 % 2 or version <= newer_than:
                if s1 % 2:  # the writer lapped the readers' buffer: read the other one
                    os.sched_yield()
                    continue
                return None
            scratch = self._bufs[i].copy()
            if int(self._seq[i]) == s1:
                _unpack(scratch, arrays)
                return version

    def __del__(self) -> None:
        # a store dropped unclosed (a clean-up that raised before reaching it): release the
        # views before the mapping, or the mapping's own __del__ prints a BufferError at exit
        # (the owner's block is unlinked only by `close`)
        if getattr(self, "_shm", None) is not None:
            self._release()

    def close(self) -> None:
        if self._shm is None:
            return
        shm = self._release()
        if self._owner:
            shm.unlink()

    def _release(self) -> shared_memory.SharedMemory:
        """Drop the views and close the mapping; the block itself stays."""
        shm, self._shm = self._shm, None
        self._bufs = self._latest = self._seq = self._version = None
        try:
            shm.close()
        except BufferError:  # a caller still holds a view
            shm.close = lambda: None
        return shm


def _pack(arrays: Sequence[np.ndarray], out: np.ndarray) -> None:
    offset = 0
    for a in arrays:
        n = a.nbytes
        out[offset:offset + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        offset += n


def _unpack(src: np.ndarray, arrays: Sequence[np.ndarray]) -> None:
    offset = 0
    for a in arrays:
        n = a.nbytes
        a.reshape(-1).view(np.uint8)[...] = src[offset:offset + n]
        offset += n
