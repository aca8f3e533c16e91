"""Spot rules: the uniform-progress and greedy rules walk through their docstring examples."""

from __future__ import annotations

from hybridtrain.placement.spot_rule import Greedy, SpotAction, SpotProgress, UniformProgress

H = 3600.0
SPOT, OD, WAIT = SpotAction.spot, SpotAction.on_demand, SpotAction.wait


def at(hours, done, total, avail, current, deadline_h=12.0):
    return SpotProgress(now=hours * H, started_at=0.0, deadline=None if deadline_h is None else deadline_h * H,
                        work_done_h=done, work_left_h=total - done, spot_available=avail, current=current)


def test_uniform_progress_example():
    rule = UniformProgress(restart_s=900, margin_s=600)
    assert rule.choose(at(0.0, 0.0, 4, True, WAIT)) is SPOT
    assert rule.choose(at(1.5, 1.5, 4, False, SPOT)) is WAIT  # preempted, ahead of the line (0.5 h)
    assert rule.choose(at(4.4, 1.5, 4, False, WAIT)) is WAIT  # line 1.47 h: still ahead
    assert rule.choose(at(4.55, 1.5, 4, False, WAIT)) is OD  # behind the line
    assert rule.choose(at(4.75, 1.75, 4, True, OD)) is OD  # ahead by 10 min < a 15-min restart
    assert rule.choose(at(5.5, 2.5, 4, True, OD)) is SPOT  # ahead by 40 min: back to spot


def test_uniform_progress_safety_net_and_no_deadline():
    rule = UniformProgress(restart_s=300, margin_s=600)
    # 3 h left, 3 h 10 m to the deadline: switching costs 5 min, leaving less than the 10-min margin
    assert rule.choose(at(8.0 + 50 / 60, 1.0, 4, True, SPOT)) is OD
    assert rule.choose(at(50.0, 1.0, 4, False, WAIT, deadline_h=None)) is WAIT
    assert rule.choose(at(50.0, 1.0, 4, True, WAIT, deadline_h=None)) is SPOT


def test_greedy_example():
    rule = Greedy(restart_s=300, margin_s=600)
    assert rule.choose(at(1.0, 1.0, 4, False, SPOT, deadline_h=6.0)) is WAIT
    assert rule.choose(at(2.7, 1.0, 4, False, WAIT, deadline_h=6.0)) is WAIT
    assert rule.choose(at(2.75, 1.0, 4, False, WAIT, deadline_h=6.0)) is OD
    assert rule.choose(at(3.0, 1.2, 4, True, OD, deadline_h=6.0)) is OD  # once on-demand, to the end


def test_a_run_on_on_demand_leaves_it_only_with_slack_for_the_restart_back():
    """The sweep simulation's trial 19: 0.75 h of work left from 0 h to a deadline at 1.158 h (restart 5 min, margin
    10 min). On on-demand at 0.833 h with 0.667 h done it is ahead of the line by 7.6 min, and staying leaves 14.5 min
    of slack; stopping to wait for spot would leave 9.5 min after the restart back — less than the margin. It used
    to stop, came back a tick later behind the line, and ended 33 s after its deadline."""
    rule = UniformProgress(restart_s=300, margin_s=600)
    assert rule.choose(at(0.833, 0.667, 0.75, False, OD, deadline_h=1.158)) is OD
    assert rule.choose(at(0.833, 0.667, 0.75, True, OD, deadline_h=1.158)) is OD  # nor for spot that may go again
    # with room for the restart back it still stops to wait while ahead of the line (by more than 4 restarts)
    assert rule.choose(at(0.833, 0.667, 0.75, False, OD, deadline_h=2.0)) is WAIT
    # a run not on on-demand pays no restart back: the same slack lets it wait
    assert rule.choose(at(0.833, 0.667, 0.75, False, WAIT, deadline_h=1.158 + 5 / 60)) is WAIT


def test_on_demand_stops_to_wait_only_when_ahead_by_more_than_four_restarts():
    """A 2-h trial of the sweep simulation (deadline 14 h away, restart 5 min) whose spot stayed gone for 7 h used to
    run one 10-min tick on on-demand, stop (ahead by 8.6 min), fall behind the line and restart: a restart for every
    tick of work. Now it stays on on-demand until 20 min ahead; a run that is not on on-demand waits as before."""
    rule = UniformProgress(restart_s=300, margin_s=600)
    line = 2.0 * 1.0 / 14.0  # the line's progress after 1 h
    assert rule.choose(at(1.0, line + 15 / 60, 2.0, False, OD, deadline_h=14.0)) is OD  # ahead by 3 restarts
    assert rule.choose(at(1.0, line + 21 / 60, 2.0, False, OD, deadline_h=14.0)) is WAIT  # ahead by more than 4
    assert rule.choose(at(1.0, line + 1 / 60, 2.0, False, WAIT, deadline_h=14.0)) is WAIT  # not on on-demand
    assert rule.choose(at(1.0, line + 6 / 60, 2.0, True, OD, deadline_h=14.0)) is SPOT  # spot back: 1 restart suffices
    assert UniformProgress(restart_s=300, margin_s=600, to_wait_restarts=0).choose(
        at(1.0, line + 1 / 60, 2.0, False, OD, deadline_h=14.0)) is WAIT  # the rule without hysteresis
