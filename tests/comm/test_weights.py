"""The weight store: serving GMIs read the newest weights without blocking, never torn."""

import multiprocessing as mp
import time

import numpy as np
import pytest

from gmi_drl.comm.weights import WeightStore

SHAPES = [(300, 257), (1000,), (7,)]


def _hammer(handle, seconds):
    store = WeightStore.attach(handle)
    arrays = [np.zeros(s, np.float32) for s in SHAPES]
    version, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        version += 1
        for a in arrays:
            a.fill(version)
        store.publish(arrays, version)
    store.close()


def test_no_torn_read_under_a_hammering_publisher():
    store = WeightStore.create(sum(int(np.prod(s)) * 4 for s in SHAPES))
    proc = mp.get_context("spawn").Process(target=_hammer, args=(store.handle, 3.0))
    try:
        proc.start()
        arrays = [np.zeros(s, np.float32) for s in SHAPES]
        have, reads, deadline = 0, 0, time.monotonic() + 60
        while (proc.is_alive() or reads == 0) and time.monotonic() < deadline:
            got = store.read_into(arrays, newer_than=have)
            if got is None:
                continue
            assert got > have  # versions only move forward
            for a in arrays:  # every element of every array from the same publication
                assert a.min() == a.max() == got
            have, reads = got, reads + 1
        proc.join(10)
        assert reads > 50 and have == store.version
        assert store.read_into(arrays, newer_than=have) is None  # nothing newer: untouched
    finally:
        proc.kill()
        store.close()


def test_a_publication_must_fill_the_store():
    store = WeightStore.create(16)
    try:
        with pytest.raises(ValueError, match="8 bytes published into a store of 16"):
            store.publish([np.zeros(2, np.float32)], 1)
        assert store.version is None
    finally:
        store.close()


def test_a_store_never_published_reads_nothing():
    """Its zero bytes are no weights: a follower that read them as version 0 would normalise
    with zero statistics and then skip the real version 0."""
    store = WeightStore.create(8)
    try:
        got = np.full(2, 7, np.float32)
        assert store.version is None and store.read_into([got]) is None
        assert (got == 7).all()
        store.publish([np.ones(2, np.float32)], 0)
        assert store.version == 0 and store.read_into([got]) == 0 and (got == 1).all()
    finally:
        store.close()
