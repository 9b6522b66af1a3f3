"""`ProgressRelay` / `ProgressSender`: GMI 0's progress from another process reaches the
caller's callback, in order and all of it by `close`; a relay nobody connected to closes at
once; a sender whose relay is gone warns and lets training go on."""

import logging
import multiprocessing as mp
import os
import time

from gmi_drl.telemetry.progress import Progress, ProgressRelay


def _send(sender, n):
    for k in range(n):
        sender(Progress(k + 1, n, 10.0, float("nan"), 0.1 * k))


def test_progress_from_another_process_reaches_the_callback_in_order():
    seen = []
    relay = ProgressRelay(seen.append)
    proc = mp.get_context("spawn").Process(target=_send, args=(relay.sender(), 50))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    address_dir = os.path.dirname(relay.sender().address)
    relay.close()
    assert [p.global_step for p in seen] == list(range(1, 51))
    assert not os.path.exists(address_dir)  # the socket's directory is removed


def test_a_relay_nobody_connected_to_closes_at_once():
    relay = ProgressRelay(lambda p: None)
    t0 = time.monotonic()
    relay.close()
    assert time.monotonic() - t0 < 2


def test_a_sender_whose_relay_is_gone_warns_once_and_training_goes_on(caplog):
    relay = ProgressRelay(lambda p: None)
    sender = relay.sender()
    relay.close()
    with caplog.at_level(logging.WARNING):
        for k in range(3):
            sender(Progress(k, 3, 1.0, float("nan"), 0.0))  # no exception
    assert caplog.text.count("progress no longer reaches the caller's on_progress") == 1


def test_a_relay_that_cannot_be_made_falls_back_to_printing(tmp_path, monkeypatch, caplog):
    """A TMPDIR too long for a Unix socket's path: the GMIs print the progress line, the run
    is not stopped, and no directory is left behind."""
    import tempfile

    from gmi_drl.telemetry.progress import ProgressPrinter, relayed

    long_dir = tmp_path / ("d" * 100)
    long_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_dir))
    with caplog.at_level(logging.WARNING):
        with relayed(print) as progress:
            assert isinstance(progress, ProgressPrinter)
    assert "on_progress cannot be relayed from the GMI processes" in caplog.text
    assert list(long_dir.iterdir()) == []
