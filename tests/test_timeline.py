"""The GPU idle share's bookkeeping (rose.timeline.IdleShare), on step times in ms."""

from __future__ import annotations

import pytest

from rose.timeline import IdleShare


def test_gaps_between_steps_count_as_idle() -> None:
    share = IdleShare()
    share.take()  # opens window 1
    for start in (0.0, 4.0, 8.0):  # steps of 3 ms, 1 ms apart
        share.add(start, start + 3.0, share.window)
    assert share.take() == pytest.approx(2 / 11)


def test_the_wait_before_a_windows_first_step_is_not_idle() -> None:
    share = IdleShare()
    share.add(0.0, 3.0, share.window)
    assert share.take() == pytest.approx(0.0)
    window = share.window
    share.add(5000.0, 5003.0, window)  # seconds after the previous step: the client's wait
    share.add(5003.0, 5006.0, window)
    assert share.take() == pytest.approx(0.0)


def test_steps_enqueued_before_a_window_opened_do_not_count_in_it() -> None:
    share = IdleShare()
    old = share.window
    share.add(0.0, 3.0, old)
    assert share.take() == pytest.approx(0.0)
    share.add(3.0, 6.0, old)  # finished after the window it belonged to reported
    share.add(9000.0, 9003.0, share.window)
    share.add(9004.0, 9007.0, share.window)
    assert share.take() == pytest.approx(1 / 7)


def test_no_steps_no_share() -> None:
    assert IdleShare().take() is None
