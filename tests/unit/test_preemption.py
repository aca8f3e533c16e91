"""PreemptionNotice: real signals to this process are recorded, not fatal; handlers come back; reports."""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import threading

import pytest

from hybridtrain.errors import EXIT_PREEMPTED, Preempted, is_retryable
from hybridtrain.training.preemption import REPORT_FILE, PreemptionNotice, PreemptionReport


@pytest.fixture
def recorded_signals():
    """SIGTERM and SIGUSR1 routed to a recording handler for the test (the previous handlers come back)."""
    seen: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: seen.append(signum)) for s in (signal.SIGTERM,
                                                                                         signal.SIGUSR1)}
    yield seen
    for s, handler in previous.items():
        signal.signal(s, handler)


def test_sigterm_inside_the_trap_is_recorded_not_fatal(recorded_signals):
    ticks = itertools.count(100.0, 0.5)
    with PreemptionNotice(grace_s=30, clock=lambda: next(ticks)) as notice:
        assert not notice() and notice.deadline is None and notice.elapsed() is None
        os.kill(os.getpid(), signal.SIGTERM)  # handled before os.kill returns to this frame
        assert notice() and notice.received
        assert notice.reason == "SIGTERM" and notice.count == 1
        assert notice.received_at == 100.0 and notice.deadline == 130.0
        assert notice.received_wall is not None
        assert notice.wait(timeout=0)  # already set: no waiting
    assert recorded_signals == []  # the previous handler did not see it


def test_a_repeated_notice_keeps_the_first_time_and_reason(recorded_signals):
    with PreemptionNotice() as notice:
        os.kill(os.getpid(), signal.SIGUSR1)
        first = notice.received_at
        os.kill(os.getpid(), signal.SIGTERM)
    assert notice.reason == "SIGUSR1" and notice.received_at == first and notice.count == 2


def test_previous_handlers_are_restored_on_exit(recorded_signals):
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionNotice(signals=(signal.SIGTERM,)):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    os.kill(os.getpid(), signal.SIGTERM)
    assert recorded_signals == [signal.SIGTERM]


def test_only_the_main_thread_may_install_it_but_any_thread_may_trigger_it():
    notice = PreemptionNotice()
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with notice:
                pass
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=enter)
    t.start()
    t.join(timeout=10)
    assert len(errors) == 1 and "main thread" in str(errors[0])

    watcher = threading.Thread(target=lambda: notice.trigger("spot metadata: instance-action terminate"))
    watcher.start()
    assert notice.wait(timeout=10)
    watcher.join(timeout=10)
    assert notice() and notice.reason == "spot metadata: instance-action terminate"


def test_grace_must_be_positive_and_a_notice_is_installed_once():
    with pytest.raises(ValueError):
        PreemptionNotice(grace_s=0)
    with PreemptionNotice() as notice, pytest.raises(RuntimeError, match="already installed"):
        notice.__enter__()


def test_report_says_whether_the_checkpoint_came_within_the_grace(tmp_path):
    times = iter([10.0, 14.0, 10.0, 50.0])  # notice, report; notice, report
    on_time = PreemptionNotice(grace_s=30, clock=lambda: next(times))
    on_time.trigger("SIGTERM")
    exc = Preempted("churn", 342, "checkpoints/churn/r/ckpt-000000000342-000.pt", site="cloud-eu")
    report = on_time.report(exc, checkpoint_uri="s3://b/checkpoints/churn/r/ckpt-000000000342-000.pt")
    assert (report.step, report.checkpoint, report.site, report.reason) == (342, exc.checkpoint, "cloud-eu",
                                                                            "SIGTERM")
    assert report.seconds_after_notice == 4.0 and report.within_grace and report.exit_status == EXIT_PREEMPTED

    late = PreemptionNotice(grace_s=30, clock=lambda: next(times))
    late.trigger("SIGTERM")
    assert not late.report(exc).within_grace  # 40 s after the notice: the step ran past the grace

    path = report.write(tmp_path)
    assert path.name == REPORT_FILE and [p.name for p in tmp_path.iterdir()] == [REPORT_FILE]  # no temp left
    assert PreemptionReport.read(tmp_path) == report
    assert PreemptionReport.read(tmp_path / "nowhere") is None
    err = report.error()
    assert isinstance(err, Preempted) and (err.job, err.step, err.checkpoint, err.site) == (
        "churn", 342, exc.checkpoint, "cloud-eu")


def test_a_stop_without_a_notice_is_reported_as_such():
    report = PreemptionNotice().report(Preempted("churn", 5, None))
    assert report.reason is None and report.notice_at is None and report.within_grace


def test_preempted_exits_75_is_retried_and_survives_pickling():
    exc = Preempted("churn", 7, "k", site="onprem-dc1")
    assert exc.exit_code == EXIT_PREEMPTED == 75 and is_retryable(exc)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.job, back.step, back.checkpoint, back.site) == ("churn", 7, "k", "onprem-dc1")
    assert str(back) == str(exc) == "job 'churn' was preempted at site onprem-dc1 at step 7; resume from k"


def test_a_trap_around_the_step_is_reused_by_the_task_inside_and_catches_a_late_notice(recorded_signals):
    """The flow's trap covers its whole body: the training task inside gets the same notice, and a
    notice after training ended (while the step saves its result) is recorded, not fatal."""
    from hybridtrain.training.preemption import preemption_trap

    assert PreemptionNotice.installed() is None
    with preemption_trap(30) as step:
        assert PreemptionNotice.installed() is step
        with preemption_trap(5) as task:  # the task's trap: the step's notice, not a second one
            assert task is step and not task()
        os.kill(os.getpid(), signal.SIGTERM)  # training has ended: the step is saving its result
        assert step.received and step.reason == "SIGTERM"
    assert recorded_signals == [] and PreemptionNotice.installed() is None


def test_a_notice_before_the_task_starts_stops_its_training(recorded_signals):
    from hybridtrain.training.preemption import preemption_trap

    with preemption_trap(30) as step:
        os.kill(os.getpid(), signal.SIGUSR1)  # e.g. while the step waits for the training lease
        with preemption_trap(30) as task:
            assert task()  # should_stop is already true: training stops after its first step


def test_outside_the_main_thread_the_trap_is_the_installed_one_or_none():
    from hybridtrain.training.preemption import preemption_trap

    seen: list[object] = []

    def in_thread() -> None:
        with preemption_trap(30) as notice:
            seen.append(notice)

    t = threading.Thread(target=in_thread)
    t.start(), t.join()
    with PreemptionNotice() as main:
        t = threading.Thread(target=in_thread)
        t.start(), t.join()
    assert seen == [None, main]
