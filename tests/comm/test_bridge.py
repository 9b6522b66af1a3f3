"""The TCP bridge between a serving GMI's channels and the trainer's (loopback): every field
of every fragment arrives bit for bit, weights come back, and closing stops the serving side."""

import threading
import time

import numpy as np
import pytest

from gmi_drl.comm.channels import Batcher, Fabric
from gmi_drl.comm.channels.bridge import (CREDITS, BridgeClient, BridgeDirectory, BridgeError,
                                          BridgeServer, WeightFollower)
from gmi_drl.comm.weights import WeightStore
from tests.comm.test_channels import _check, _plan, _serve_here


@pytest.mark.parametrize("mode", ["multi", "uni"])
def test_fragments_cross_the_bridge_whole_and_weights_come_back(mode):
    plan = _plan(num_serving=2, num_slots=2, mode=mode)
    trainer, sides = Fabric.create(plan), [Fabric.create(plan) for _ in range(2)]
    stores = [WeightStore.create(64) for _ in range(3)]
    server = BridgeServer(trainer, stores[0], 64, ("127.0.0.1", 0))
    clients = [BridgeClient(sides[s], stores[1 + s], 64, s, [server.address]) for s in range(2)]
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


def test_two_trainers_share_the_transfers_and_the_second_follows_the_first_s_weights():
    """The migrator across sockets: two serving GMIs, two trainer GMIs (each its own fabric,
    as on two hosts); every fragment arrives once, whole, at one of them, both get work,
    trainer 0 counts every env step, and only trainer 0's weights travel (to the serving GMIs
    and to trainer 1, which follows them)."""
    plan = _plan(num_serving=2, num_slots=2)
    trainers, sides = [Fabric.create(plan) for _ in range(2)], [Fabric.create(plan)
                                                               for _ in range(2)]
    stores = [WeightStore.create(64) for _ in range(4)]  # trainers 0, 1; serving GMIs 0, 1
    servers = [BridgeServer(trainers[k], stores[k], 64, ("127.0.0.1", 0), push=k == 0)
               for k in range(2)]
    follower = WeightFollower(stores[1], 64, servers[0].address, rank=1)
    clients = [BridgeClient(sides[s], stores[2 + s], 64, s, [v.address for v in servers])
               for s in range(2)]
    try:
        count = 30
        writers = [threading.Thread(target=_serve_here, args=(sides[s], count, s, 12))
                   for s in range(2)]
        for w in writers:
            w.start()
        batchers, seen = [Batcher(f, 0, 1) for f in trainers], [[], []]
        deadline = time.monotonic() + 30
        while len(seen[0]) + len(seen[1]) < 2 * count and time.monotonic() < deadline:
            for k in range(2):
                if batchers[k].next(block=False):
                    seen[k] += _check(batchers[k].batch, 1)
        assert sorted(seen[0] + seen[1]) == [(s, k) for s in range(2) for k in range(count)]
        assert seen[0] and seen[1], [len(x) for x in seen]
        for w in writers:
            w.join(10)
        assert [sum(c.sent) for c in clients] == [count, count]
        assert trainers[0].env_steps() == 2 * count * 12 and trainers[1].env_steps() == 0
        stores[0].publish([np.arange(64, dtype=np.uint8)], 7)
        got = np.zeros(64, np.uint8)
        deadline = time.monotonic() + 10
        while (any(s.version != 7 for s in (stores[1], *stores[2:]))
               and time.monotonic() < deadline):
            time.sleep(0.01)
        for s in (stores[1], *stores[2:]):
            assert s.read_into([got]) == 7 and (got == np.arange(64)).all()
        servers[1].close()  # one trainer ended: every serving side stops
        _assert_every_side_stops(sides)
    finally:
        follower.close()
        servers[0].close()
        _close(servers[1], clients, [*trainers, *sides], stores)


def test_a_trainer_whose_channel_is_full_is_passed_over():
    """Nobody reads trainer 1: once its channel and credits are full, every transfer goes to
    trainer 0 (were the forwarder to wait for trainer 1, trainer 0 would starve and
    ``next`` would time out); at the end trainer 1 holds at most its slots plus the credits."""
    plan = _plan(num_serving=1, num_slots=2)
    trainers, side = [Fabric.create(plan) for _ in range(2)], Fabric.create(plan)
    stores = [WeightStore.create(8) for _ in range(3)]
    servers = [BridgeServer(trainers[k], stores[k], 8, ("127.0.0.1", 0), push=k == 0)
               for k in range(2)]
    client = BridgeClient(side, stores[2], 8, 0, [v.address for v in servers])
    try:
        count, held = 24, plan.num_slots + CREDITS
        writer = threading.Thread(target=_serve_here, args=(side, count, 0))
        writer.start()
        first, seen = Batcher(trainers[0], 0, 1), []
        while len(seen) < count - held:
            first.next(timeout_s=10)
            seen += _check(first.batch, 1)
        second = Batcher(trainers[1], 0, 1)
        deadline = time.monotonic() + 10
        while len(seen) < count and time.monotonic() < deadline:
            for b in (first, second):
                if b.next(block=False):
                    seen += _check(b.batch, 1)
        assert sorted(seen) == [(0, k) for k in range(count)]
        writer.join(10)
        assert client.sent[0] >= count - held and client.sent[1] <= held, client.sent
    finally:
        servers[0].close()
        _close(servers[1], [client], [*trainers, side], stores)


def test_the_directory_tells_every_gmi_where_the_trainers_listen():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = BridgeDirectory(f"tcp://127.0.0.1:{port}", is_host=True, timeout_s=1.0)
    other = BridgeDirectory(f"tcp://127.0.0.1:{port}", is_host=False, timeout_s=1.0)
    assert host.local_ip() == "127.0.0.1"
    host.publish(0, ("127.0.0.1", 4000))
    other.publish(1, ("127.0.0.2", 4001))
    assert other.lookup(2) == host.lookup(2) == [("127.0.0.1", 4000), ("127.0.0.2", 4001)]
    t0 = time.monotonic()
    with pytest.raises(BridgeError, match="did not publish their bridges within 1.0 s"):
        other.lookup(3)
    assert time.monotonic() - t0 < 10


def test_a_trainer_that_never_listens_is_named():
    plan = _plan(num_serving=1)
    side, store = Fabric.create(plan), WeightStore.create(8)
    try:
        with pytest.raises(BridgeError, match="127.0.0.1:9 did not answer within 0.5 s"):
            BridgeClient(side, store, 8, 0, [("127.0.0.1", 9)], connect_timeout_s=0.5)
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
        clients.append(BridgeClient(sides[0], stores[1], 8, 0, [server.address]))
        late = threading.Timer(0.3, lambda: clients.append(
            BridgeClient(sides[1], stores[2], 8, 1, [server.address])))
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


def test_a_serving_gmi_and_a_follower_that_join_late_get_the_current_weights():
    """The pusher sends only versions published after a connection joined: one that joins
    after version 5 (a trainer that started first, or resumed) is handed 5 at once, not left
    with its initial weights until the next update."""
    plan = _plan(num_serving=1)
    trainer, side = Fabric.create(plan), Fabric.create(plan)
    stores = [WeightStore.create(8) for _ in range(3)]
    server = BridgeServer(trainer, stores[0], 8, ("127.0.0.1", 0))
    clients, follower = [], None
    try:
        stores[0].publish([np.arange(8, dtype=np.uint8)], 5)
        time.sleep(0.2)  # the pusher has sent version 5 to nobody
        clients.append(BridgeClient(side, stores[1], 8, 0, [server.address]))
        follower = WeightFollower(stores[2], 8, server.address, rank=1)
        deadline = time.monotonic() + 10
        while any(s.version != 5 for s in stores[1:]) and time.monotonic() < deadline:
            time.sleep(0.01)
        got = np.zeros(8, np.uint8)
        for s in stores[1:]:
            assert s.read_into([got]) == 5 and (got == np.arange(8)).all()
    finally:
        if follower is not None:
            follower.close()
        _close(server, clients, [trainer, side], stores)
