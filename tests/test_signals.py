"""runtime/signals.StopSignals, the one stop-at-a-safe-point class of training and the file pipeline:
signals sent to this process, in-process (the commands' tests send them to real processes)."""

from __future__ import annotations

import os
import signal

import pytest

from elmo_jax.runtime.signals import StopSignals


class _Raised(Exception):
    pass


@pytest.fixture
def raising_handlers():
    """SIGINT and SIGTERM raise `_Raised` (as a command's handlers raise KeyboardInterrupt/Terminated)."""

    def handler(signum, frame):
        raise _Raised(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in previous.items():
        signal.signal(s, h)


def _send(signum: int) -> None:
    os.kill(os.getpid(), signum)  # delivered before the next bytecode runs in the main thread


def test_training_policy_records_the_first_and_absorbs_the_second(raising_handlers, capsys):
    with StopSignals("absorb", second_note="already stopping") as stops:
        _send(signal.SIGTERM)
        _send(signal.SIGINT)
        _send(signal.SIGINT)
        assert stops.requested == "SIGTERM" and stops.stopped
    assert capsys.readouterr().err.count("SIGINT again: already stopping") == 1
    with pytest.raises(_Raised):  # the previous handlers are back
        _send(signal.SIGINT)


def test_file_policy_raises_at_the_safe_point_and_a_second_signal_at_once(raising_handlers):
    with StopSignals("at_once") as stops:
        _send(signal.SIGINT)
        assert stops.requested == "SIGINT"  # recorded, not raised where it landed
        with pytest.raises(_Raised, match="SIGINT"):
            stops.check()
        stops.check()  # handed on once
        with pytest.raises(_Raised, match="SIGTERM"):
            _send(signal.SIGTERM)
        with pytest.raises(_Raised, match="SIGINT"):
            stops.raise_stop()  # the first signal again, after its exception was turned into an error


def test_a_signal_while_finishing_is_too_late_to_stop(raising_handlers):
    with StopSignals("at_once") as stops:
        with stops.finishing():
            _send(signal.SIGTERM)
            _send(signal.SIGTERM)
            stops.check()
        stops.check()  # logged as too late, not raised
        assert stops.stopped


def test_an_ignored_signal_stays_ignored_at_the_safe_point():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with StopSignals("at_once") as stops:
            _send(signal.SIGTERM)
            stops.check()
            assert stops.requested == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="second_signal: expected one of"):
        StopSignals("twice")
