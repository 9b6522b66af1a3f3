"""`gmi_drl.blocks`: every block made is told to the hooks; `unlink` removes what is left."""

import os

import pytest

from gmi_drl import blocks


def test_hooks_hear_of_every_block_and_unlink_removes_those_left(monkeypatch):
    monkeypatch.setattr(blocks, "_HOOKS", [])
    told = []
    blocks.on_create(told.append)
    kept, closed = blocks.create(64), blocks.create(128)
    assert told == [kept.name, closed.name]
    assert bytes(kept.buf[:64]) == bytes(64)
    closed.close()
    closed.unlink()  # its owner's own clean-up ran; the other owner was "killed"
    kept.close()
    assert blocks.unlink(told) == [kept.name]
    assert not set(told) & set(os.listdir("/dev/shm"))


def test_a_hook_that_fails_leaves_no_block(monkeypatch):
    monkeypatch.setattr(blocks, "_HOOKS", [])
    names = []

    def refuse(name):
        names.append(name)
        raise ConnectionError("the node agent is gone")

    blocks.on_create(refuse)
    with pytest.raises(ConnectionError):
        blocks.create(64)
    assert names and names[0] not in os.listdir("/dev/shm")
