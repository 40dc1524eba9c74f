"""Ctrl-C handling: the first SIGINT is a request read at a step boundary, the second stops at once."""

import os
import signal

import pytest

from arborl.train.interrupt import ITERATION, STEP, Interrupted, StopRequest, between_steps


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # handled in the main thread before the next bytecode returns


def test_the_first_ctrl_c_is_a_request_read_by_check_and_the_second_stops_at_once(capfd):
    before = signal.getsignal(signal.SIGINT)
    with StopRequest(STEP) as stop:
        stop.check()  # nothing requested: no-op
        ctrl_c()
        assert stop.requested
        assert capfd.readouterr().err == f"arborl: Ctrl-C: {STEP}\n"
        with pytest.raises(KeyboardInterrupt):
            stop.check()  # the step boundary
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()  # the second Ctrl-C, mid-step
    assert signal.getsignal(signal.SIGINT) is before  # restored on exit


def test_the_notice_names_what_the_first_ctrl_c_finishes(capfd):
    with StopRequest() as stop:
        ctrl_c()
    assert stop.requested and capfd.readouterr().err == f"arborl: Ctrl-C: {ITERATION}\n"


def test_stop_requests_nest_and_restore_the_outer_handler():
    with StopRequest(STEP) as outer:
        handler = signal.getsignal(signal.SIGINT)
        with StopRequest(STEP) as inner:
            ctrl_c()
        assert inner.requested and not outer.requested
        assert signal.getsignal(signal.SIGINT) == handler


def test_interrupted_says_how_to_continue():
    assert str(Interrupted("sft")) == ("stopped during sft; continue with --resume "
                                       "(sft starts again; finished stages are kept)")
    assert str(Interrupted("rl", 7)) == "stopped at iteration 7; continue with --resume"


def test_between_steps_stops_after_the_step_in_flight_and_restores_the_handler(capfd):
    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        for step in between_steps(range(5)):
            if step == 2:
                ctrl_c()  # during step 2: it still finishes
            done.append(step)
    assert done == [0, 1, 2] and f"arborl: Ctrl-C: {STEP}" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before
    for step in between_steps(range(3)):
        if step == 1:
            break
    assert signal.getsignal(signal.SIGINT) is before  # a loop left early gives the handler back too
    assert list(between_steps(range(3))) == [0, 1, 2] and signal.getsignal(signal.SIGINT) is before
