"""Long work says how long is left (trtflow/progress.py `Eta`): the CLI's status line and the Prefect progress
artifact show it, estimated from the steps timed so far."""
from __future__ import annotations

from trtflow.progress import Eta


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_time_left_follows_the_steps_timed_so_far():
    clock = Clock()
    eta = Eta(clock)
    assert eta.said("validating fp16", 0, 29) == "validating fp16 0/29"  # nothing timed yet
    clock.now += 12.0  # 3 clips in 12 s: 4 s a clip
    assert eta.left("validating fp16", 3, 29) == 104.0
    assert eta.said("validating fp16", 3, 29) == "validating fp16 3/29, about 2 min left"
    clock.now += 100.0
    assert eta.said("validating fp16", 28, 29) == "validating fp16 28/29, about 4 s left"
    assert eta.said("validating fp16", 29, 29) == "validating fp16 29/29"  # done: nothing left to say


def test_each_piece_of_work_has_its_own_clock_from_its_first_report():
    clock = Clock()
    eta = Eta(clock)
    eta.left("calibrating", 0, 200)
    clock.now += 50.0
    eta.left("building engines", 2, 6)  # starts now, at 2 of 6: only what it does from here is timed
    clock.now += 10.0
    assert eta.left("building engines", 3, 6) == 30.0
    assert eta.left("calibrating", 120, 200) == 60 / 120 * 80


def test_hours_are_said_in_hours():
    clock = Clock()
    eta = Eta(clock)
    eta.left("building engines", 0, 10)
    clock.now += 3600.0
    assert eta.said("building engines", 1, 10) == "building engines 1/10, about 9.0 h left"
