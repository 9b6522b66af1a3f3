"""Experience channels (GMI-DRL §4.2): every field round-trips bit for bit between processes,
under MCC and UCC, with several serving GMIs and trainers; back-pressure stays bounded."""

import multiprocessing as mp
import time

import numpy as np
import pytest

from gmi_drl.comm.channels import (Batcher, ChannelClosed, ChannelPlan, Dispenser, Fabric,
                                   FieldSpec, SlotRing)
from gmi_drl.comm.channels.ring import ring_bytes

T, B, OBS = 4, 3, (2, 5)


def _plan(**kw):
    fields = (FieldSpec("obs", (T, B, *OBS), "uint8"), FieldSpec("actions", (T, B, 2), "float32"),
              FieldSpec("rewards", (T, B), "float32"), FieldSpec("terminated", (T, B), "bool"),
              FieldSpec("episode_length", (T, B), "int32"),
              FieldSpec("last_obs", (B, *OBS), "uint8", time_major=False),
              FieldSpec("policy_version", (1,), "int64", time_major=False))
    return ChannelPlan(fields, T, B, **{"num_serving": 2, "num_trainers": 1, **kw})


def _fragment(serving: int, k: int) -> dict[str, np.ndarray]:
    """What serving GMI ``serving`` sends as its fragment ``k`` (deterministic)."""
    rng = np.random.default_rng(1000 * serving + k)
    return {"obs": rng.integers(0, 256, (T + 1, B, *OBS), dtype=np.uint8),
            "actions": rng.standard_normal((T, B, 2)).astype(np.float32),
            "rewards": rng.standard_normal((T, B)).astype(np.float32),
            "terminated": rng.random((T, B)) < 0.3,
            "episode_length": rng.integers(0, 1 << 30, (T, B), dtype=np.int32),
            "policy_version": np.array([1_000_000 * serving + k], np.int64)}


def _serve(plan, serving, count):
    """A serving process: ``count`` fragments into the block ``plan`` names."""
    fabric = Fabric.attach(plan)
    try:
        _serve_here(fabric, count, serving)
    except ChannelClosed:
        pass
    finally:
        fabric.close()


def _check(batch, F):
    """Every column block of ``batch`` is one whole fragment; returns their (serving, k)."""
    seen = []
    for f in range(F):
        cols = slice(f * B, (f + 1) * B)
        version = int(batch["policy_version"][f * B])
        assert (batch["policy_version"][cols] == version).all()
        serving, k = divmod(version, 1_000_000)
        want = _fragment(serving, k)
        np.testing.assert_array_equal(batch["obs"][:, cols].numpy(), want["obs"][:T])
        np.testing.assert_array_equal(batch["last_obs"][cols].numpy(), want["obs"][T])
        for name in ("actions", "rewards", "terminated", "episode_length"):
            np.testing.assert_array_equal(batch[name][:, cols].numpy(), want[name])
        seen.append((serving, k))
    return seen


@pytest.mark.parametrize("mode,per_transfer,trainers,per_batch",
                         [("multi", 1, 1, 2), ("multi", 3, 2, 3), ("uni", 1, 2, 1)])
def test_every_field_round_trips_between_processes(mode, per_transfer, trainers, per_batch):
    """(A trainer's share of the fragments is a multiple of its batch: whole transfers go to
    one trainer.)"""
    plan = _plan(mode=mode, fragments_per_transfer=per_transfer, num_trainers=trainers,
                 num_slots=2)
    fabric = Fabric.create(plan)
    count = 12  # per serving GMI, a multiple of fragments_per_transfer
    procs = [mp.get_context("spawn").Process(target=_serve, args=(fabric.plan, s, count))
             for s in range(2)]
    try:
        for p in procs:
            p.start()
        batchers = [Batcher(fabric, k, per_batch) for k in range(trainers)]
        seen, deadline = [], time.monotonic() + 60
        while len(seen) < 2 * count and time.monotonic() < deadline:
            for b in batchers:
                if b.next(block=False):
                    seen += _check(b.batch, per_batch)
        assert sorted(seen) == [(s, k) for s in range(2) for k in range(count)]
        if trainers == 2:  # the migrator used both trainers
            assert all(b.fragments > 0 for b in batchers)
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
    finally:
        for p in procs:
            p.kill()
        fabric.destroy()


def test_a_full_channel_blocks_the_writer_and_memory_stays_bounded():
    plan = _plan(num_serving=1, num_slots=2)
    fabric = Fabric.create(plan)
    assert plan.nbytes < 64 * 1024  # preallocated once, whatever is written
    proc = mp.get_context("spawn").Process(target=_serve, args=(fabric.plan, 0, 50))
    try:
        proc.start()
        rings, deadline = fabric.rings(0, 0), time.monotonic() + 60
        while rings[-1].written < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the writer filled both slots and waits
        assert rings[-1].written == 2
        batcher = Batcher(fabric, 0, 1)
        for k in range(50):
            batcher.next(timeout_s=30)
            assert _check(batcher.batch, 1) == [(0, k)]  # nothing lost, in order
        proc.join(10)
        assert fabric.stats()["channels/blocked_s"] > 0.5
        assert fabric.stats()["channels/dropped"] == 0
    finally:
        proc.kill()
        fabric.destroy()


def test_drop_oldest_never_blocks_and_counts_what_it_dropped():
    plan = _plan(num_serving=1, num_slots=2, backpressure="drop_oldest")
    fabric = Fabric.create(plan)
    try:
        _serve_here(fabric, 10)  # nobody reads: the writer never waits
        batcher = Batcher(fabric, 0, 1)
        got = []
        while batcher.next(block=False):
            got += _check(batcher.batch, 1)
        assert got == [(0, 8), (0, 9)]  # the two newest
        assert fabric.stats()["channels/dropped"] == 8
    finally:
        fabric.destroy()


def _serve_here(fabric, count, serving=0, env_steps=0):
    """Write ``count`` fragments of serving GMI ``serving`` (`_fragment`) as a collector
    does, counting ``env_steps`` after each."""
    disp = Dispenser(fabric, serving)
    for k in range(count):
        want = _fragment(serving, k)
        frag = disp.begin(int(want["policy_version"][0]))
        for t in range(T):
            for name in ("obs", "actions", "rewards", "terminated", "episode_length"):
                frag[name][t] = want[name][t]
            disp.step_done(t, want["obs"][t + 1])
        disp.end()
        fabric.add_env_steps(serving, env_steps)


def test_a_stopped_run_wakes_a_blocked_writer():
    plan = _plan(num_serving=1, num_slots=1)
    fabric = Fabric.create(plan)
    try:
        ring = SlotRing(np.zeros(ring_bytes(8, 1), np.uint8), 0, 8, 1, "block", fabric.stopped)
        ring.claim()
        ring.publish()
        fabric.stop()
        with pytest.raises(ChannelClosed):
            ring.claim()
        with pytest.raises(ValueError, match="backpressure"):
            SlotRing(np.zeros(ring_bytes(8, 1), np.uint8), 0, 8, 1, "newest")
        assert _plan(mode="uni", backpressure="drop_oldest").validate() == [
            "async.backpressure='drop_oldest' with async.channel uni: a dropped step message "
            "would split a fragment; use block"]
        # one slot the writer never waits for is overwritten under every read: none arrives
        assert "give async.channel_slots >= 2" in " ".join(
            _plan(num_slots=1, backpressure="drop_oldest").validate())
    finally:
        fabric.destroy()


@pytest.mark.parametrize("per_transfer", [1, 2])
def test_drop_oldest_under_a_racing_writer_never_gives_a_torn_or_repeated_fragment(per_transfer):
    """The writer overwrites slots while the reader copies them: every fragment read is whole
    (each field of it from the same fragment), in order, never twice; the rest are counted."""
    plan = _plan(num_serving=1, num_slots=2, backpressure="drop_oldest",
                 fragments_per_transfer=per_transfer)
    fabric = Fabric.create(plan)
    count = 400
    proc = mp.get_context("spawn").Process(target=_serve, args=(fabric.plan, 0, count))
    try:
        proc.start()
        batcher = Batcher(fabric, 0, 1)
        got, deadline = [], time.monotonic() + 60
        while proc.is_alive() and time.monotonic() < deadline:
            if batcher.next(block=False):
                got += _check(batcher.batch, 1)  # whole: every field matches its fragment
        while batcher.next(block=False):
            got += _check(batcher.batch, 1)
        proc.join(10)
        ks = [k for _, k in got]
        assert ks == sorted(set(ks)) and ks[-1] == count - 1  # in order, no repeats, the last
        assert len(ks) + fabric.stats()["channels/dropped"] >= count - per_transfer
    finally:
        proc.kill()
        fabric.destroy()


def test_stopping_wakes_a_writer_and_a_batcher_that_wait():
    import threading

    plan = _plan(num_serving=1, num_slots=1)
    fabric = Fabric.create(plan)
    try:
        batcher, caught = Batcher(fabric, 0, 1), []

        def wait_for_data():
            try:
                batcher.next()
            except ChannelClosed as e:
                caught.append(e)

        reader = threading.Thread(target=wait_for_data)
        reader.start()
        ring = fabric.rings(0, 0)[0]
        ring.claim()
        ring.publish()  # the only slot is full (and the batcher waits for the others' rings)

        def write():
            try:
                ring.claim()
            except ChannelClosed as e:
                caught.append(e)

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.5)
        assert writer.is_alive() and reader.is_alive()  # both wait
        fabric.stop()
        writer.join(5)
        reader.join(5)
        assert not writer.is_alive() and not reader.is_alive() and len(caught) == 2
    finally:
        fabric.destroy()


def test_a_batcher_fed_only_stale_fragments_times_out_saying_so():
    """Fragments that keep arriving but are all older than ``min_version`` (max_policy_lag)
    do not hold the deadline off: the batcher times out and says they were stale."""
    import threading

    plan = _plan(num_serving=1, num_slots=2)
    fabric = Fabric.create(plan)
    try:
        batcher, caught = Batcher(fabric, 0, 1), []
        batcher.min_version = 10**9  # every fragment of `_fragment` is older

        def serve():
            try:
                _serve_here(fabric, 10**6)
            except ChannelClosed:
                pass

        def batch():
            try:
                batcher.next(timeout_s=1.0)
            except TimeoutError as e:
                caught.append(e)

        threads = [threading.Thread(target=serve), threading.Thread(target=batch)]
        for t in threads:
            t.start()
        threads[1].join(20)
        fabric.stop()
        threads[0].join(10)
        assert not threads[1].is_alive(), "the batcher kept waiting on stale fragments"
        assert batcher.stale_dropped > 0 and len(caught) == 1
        assert "older than policy version 1000000000" in str(caught[0])
    finally:
        fabric.stop()
        fabric.destroy()
