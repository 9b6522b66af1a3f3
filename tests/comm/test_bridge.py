"""The TCP bridge between a serving GMI's channels and the trainer's (loopback): every field
of every fragment arrives bit for bit, weights come back, and closing stops the serving side."""

import threading
import time

import numpy as np
import pytest

from gmi_drl.comm.channels import Batcher, Fabric
from gmi_drl.comm.channels.bridge import BridgeClient, BridgeError, BridgeServer
from gmi_drl.comm.weights import WeightStore
from tests.comm.test_channels import _check, _plan, _serve_here


@pytest.mark.parametrize("mode", ["multi", "uni"])
def test_fragments_cross_the_bridge_whole_and_weights_come_back(mode):
    plan = _plan(num_serving=2, num_slots=2, mode=mode)
    trainer, sides = Fabric.create(plan), [Fabric.create(plan) for _ in range(2)]
    stores = [WeightStore.create(64) for _ in range(3)]
    server = BridgeServer(trainer, stores[0], 64, ("127.0.0.1", 0))
    clients = [BridgeClient(sides[s], stores[1 + s], 64, s, server.address) for s in range(2)]
    try:
        count = 30  # more than the channels hold on either side: back-pressure crosses
        writers = [threading.Thread(target=_serve_here, args=(sides[s], count, s, 12))
                   for s in range(2)]
        for w in writers:
            w.start()
        batcher, seen = Batcher(trainer, 0, 2), []
        while len(seen) < 2 * count:
            batcher.next(timeout_s=30)
            seen += _check(batcher.batch, 2)
        assert sorted(seen) == [(s, k) for s in range(2) for k in range(count)]
        for w in writers:
            w.join(10)
        assert trainer.env_steps() == 2 * count * 12  # the serving GMIs' counts crossed too
        stores[0].publish([np.arange(64, dtype=np.uint8)], 7)
        got = np.zeros(64, np.uint8)
        deadline = time.monotonic() + 10
        while any(s.version != 7 for s in stores[1:]) and time.monotonic() < deadline:
            time.sleep(0.01)
        for s in stores[1:]:
            assert s.read_into([got]) == 7 and (got == np.arange(64)).all()
        server.close()  # the run ended: every serving side stops
        _assert_every_side_stops(sides)
    finally:
        _close(server, clients, [trainer, *sides], stores)


def test_a_trainer_that_never_listens_is_named():
    plan = _plan(num_serving=1)
    side, store = Fabric.create(plan), WeightStore.create(8)
    try:
        with pytest.raises(BridgeError, match="127.0.0.1:9 did not answer within 0.5 s"):
            BridgeClient(side, store, 8, 0, ("127.0.0.1", 9), connect_timeout_s=0.5)
    finally:
        side.destroy()
        store.close()


def test_a_trainer_with_nothing_left_to_train_waits_for_its_serving_gmis_then_stops_them():
    """A run restarted from its final checkpoint: the trainer is done at once; it keeps its
    bridge open until every serving GMI said HELLO, so a late serving GMI stops cleanly instead
    of knocking at a closed port."""
    plan = _plan(num_serving=2)
    trainer, sides = Fabric.create(plan), [Fabric.create(plan) for _ in range(2)]
    stores = [WeightStore.create(8) for _ in range(3)]
    server = BridgeServer(trainer, stores[0], 8, ("127.0.0.1", 0))
    clients = []
    try:
        assert not server.wait_greeted(2, 0.2)  # nobody yet
        clients.append(BridgeClient(sides[0], stores[1], 8, 0, server.address))
        late = threading.Timer(0.3, lambda: clients.append(
            BridgeClient(sides[1], stores[2], 8, 1, server.address)))
        late.start()
        t0 = time.monotonic()
        assert server.wait_greeted(2, 10)
        assert 0.2 < time.monotonic() - t0 < 10
        server.close()
        _assert_every_side_stops(sides)
    finally:
        _close(server, clients, [trainer, *sides], stores)


def _assert_every_side_stops(sides, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(f.stopped() for f in sides) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(f.stopped() for f in sides)


def _close(server, clients, fabrics, stores) -> None:
    server.close()
    for c in clients:
        c.close()
    for f in fabrics:
        f.destroy()
    for s in stores:
        s.close()
