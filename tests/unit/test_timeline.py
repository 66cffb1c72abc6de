"""The GPU idle share's bookkeeping (rose.serving.timeline.IdleShare), on step times in ms, and the
forecast of a step's end (rose.serving.timeline.FinishForecast), in seconds."""

from __future__ import annotations

import pytest

from rose.serving.timeline import FinishForecast, IdleShare


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


def test_no_forecast_before_a_step_of_the_configuration_finished() -> None:
    finish = FinishForecast()
    finish.add((64, 1), 0.002)
    finish.add(None, 0.001)  # a step not to forecast from
    assert finish.forecast((16, 1), begun=10.0, queued=False) is None
    assert finish.forecast(None, begun=10.0, queued=False) is None


def test_a_forecast_takes_the_shortest_recent_span_of_its_configuration() -> None:
    finish = FinishForecast(keep=3)
    for span in (0.050, 0.001, 0.0012):  # the first run, eager, then replays
        finish.add((16, 1), span)
    assert finish.forecast((16, 1), begun=10.0, queued=False) == pytest.approx(10.001)
    for span in (0.003, 0.003, 0.003):  # the GPU got slower: the short spans age out
        finish.add((16, 1), span)
    assert finish.forecast((16, 1), begun=20.0, queued=False) == pytest.approx(20.003)


def test_a_step_queued_behind_the_previous_one_ends_after_it() -> None:
    finish = FinishForecast()
    finish.add((16, 1), 0.001)
    finish.add((256, 8), 0.004)
    assert finish.forecast((256, 8), begun=10.0, queued=False) == pytest.approx(10.004)
    assert finish.forecast((16, 1), begun=10.0005, queued=True) == pytest.approx(10.005)
    # The previous step was done (it ended before its forecast): this one starts at once.
    assert finish.forecast((16, 1), begun=10.0045, queued=False) == pytest.approx(10.0055)
    # Unknown configurations break the chain: the next forecast counts from its own begin.
    assert finish.forecast((512, 8), begun=10.006, queued=True) is None
    assert finish.forecast((16, 1), begun=10.007, queued=True) == pytest.approx(10.008)
