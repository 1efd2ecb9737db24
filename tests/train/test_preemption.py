"""The stop handling before the loop's own (train/preemption.py), in this process: a signal that comes
before the config is read is kept until output_dir is known; a command that is not `train` gets the
signal's default action back."""

from __future__ import annotations

import json
import os
import signal

import pytest

from framer_ds.train.preemption import EXIT_PREEMPTED, PREEMPTED_MARKER, STOP_SIGNALS, EarlyStop


@pytest.fixture
def early():
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stop = EarlyStop()
    stop.arm()
    yield stop
    for sig, handler in before.items():  # pytest's own, not the defaults disarm() sets
        signal.signal(sig, handler)


def test_a_signal_before_the_config_waits_for_output_dir_then_exits_75(early, tmp_path, capfd):
    os.kill(os.getpid(), signal.SIGUSR1)  # handled at once, in this thread: only remembered
    assert early.pending == "SIGUSR1" and not list(tmp_path.iterdir())
    with pytest.raises(SystemExit) as stopped:
        early.knows(tmp_path / "run")
    assert stopped.value.code == EXIT_PREEMPTED
    marker = json.loads((tmp_path / "run" / PREEMPTED_MARKER).read_text())
    assert marker["signal"] == "SIGUSR1" and marker["during_startup"] is True and marker["step"] is None
    assert "stopped by SIGUSR1 before training started" in capfd.readouterr().err


def test_without_output_dir_nothing_is_written_and_no_signal_is_lost(early, tmp_path):
    early.knows(None)  # the YAML could not be read cheaply: the full validation will say why
    assert early.armed and early.output_dir is None
    early.knows(tmp_path)  # no signal came: nothing happens
    assert not list(tmp_path.iterdir())


def test_another_command_gets_the_default_action_back(early):
    early.resend_pending()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not early.armed
