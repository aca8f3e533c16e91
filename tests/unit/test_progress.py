"""Progress events: what stages report, the one-line placement headline, the host's lines, the CLI's plain lines."""

from __future__ import annotations

import io
import logging
from datetime import UTC, datetime

import pytest

from hybridtrain.reporting import progress


@pytest.fixture
def events():
    """Every progress event reported while the test runs."""
    seen: list[progress.ProgressEvent] = []

    class Collect(logging.Handler):
        def emit(self, record):
            event = progress.event_of(record)
            if event is not None:
                seen.append(event)

    logger = logging.getLogger(progress.LOGGER)
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield seen
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_stage_reports_its_start_and_end_with_the_site(events):
    with progress.stage("preprocess", "onprem-dc1") as st:
        st.detail = "6,000 rows in"
    assert [(e.stage, e.kind) for e in events] == [("preprocess", "start"), ("preprocess", "end")]
    assert events[0].message == "preprocess started at onprem-dc1"
    assert events[1].message.startswith("preprocess finished at onprem-dc1 in ")
    assert events[1].message.endswith(": 6,000 rows in")


def test_a_failing_stage_reports_why_and_the_error_goes_on(events):
    with pytest.raises(ValueError):
        with progress.stage("sync", "onprem-dc1"):
            raise ValueError("store unreachable")
    assert events[-1].kind == "failed"
    assert "ValueError: store unreachable" in events[-1].message


def test_training_progress_reports_epochs_with_loss_metric_and_throughput(events):
    ticks = iter([0.0, 0.0, 2.0, 3.0])
    shown = progress.TrainingProgress("cloud-eu", epochs=2, rows=1000, clock=lambda: next(ticks))
    shown.start()
    shown.epoch(0, {"train_loss": 0.61234, "val_auc": 0.71})
    shown.checkpoint(40, 31200)
    shown.epoch(1, {"train_loss": 0.5, "val_auc": 0.75})
    lines = [e.message for e in events]
    assert lines[0] == "train started at cloud-eu: 2 epochs, 1,000 rows"
    assert lines[1] == "train epoch 1/2 at cloud-eu: loss 0.6123, val_auc 0.7100, 500 rows/s"
    assert lines[2] == "train checkpoint at step 40 written at cloud-eu (31,200 bytes)"
    assert lines[3] == "train epoch 2/2 at cloud-eu: loss 0.5000, val_auc 0.7500, 1,000 rows/s"
    assert [e.fraction for e in events if e.kind == "step"] == [0.5, 1.0]


def test_a_hosts_epoch_and_checkpoint_lines_become_events(events):
    shown = progress.TrainingProgress("onprem-dc1", epochs=4)
    got = shown.host_line("hybridtrain: epoch 2/4 train_loss=0.5512 val_auc=0.7710 val_log_loss=0.5")
    assert got == (1, {"train_loss": 0.5512, "val_auc": 0.771, "val_log_loss": 0.5})
    assert shown.host_line("hybridtrain: checkpoint step 80 written (1234 bytes)") is None
    assert shown.host_line("hybridtrain: data ready: 100 train rows, 20 val rows") is None
    assert [(e.kind, e.fields.get("step")) for e in events] == [("step", None), ("checkpoint", 80)]


def test_the_placement_headline_says_what_the_table_says():
    from hybridtrain.stages.placing import PlacementOutcome

    pinned = "spec placement.site: the job is pinned to cloud-eu"
    outcome = PlacementOutcome(
        site="cloud-eu", capacity_class="burst", strategy="deadline_aware", cost_usd=0.42,
        finish_at=datetime(2026, 11, 25, 14, 5, tzinfo=UTC), deadline=None, meets_deadline=True, needs_sync=True,
        must_stay=False, queue_tier="normal", queue_wait_s=0.0, run_hours=0.1,
        reasons=["no on-prem site is allowed for this job (see the rejected candidates)", "cheapest: cloud-eu"],
        breakdown=["compute $0.40"], rejected={"onprem-dc1 (fixed)": pinned},
        candidates=[{"site": "onprem-dc1", "capacity": "fixed", "verdict": "rejected", "cost_usd": "", "finish": "",
                     "meets_deadline": "", "queue_wait": "", "rule": "spec placement.site",
                     "reason": "the job is pinned to cloud-eu"},
                    {"site": "cloud-eu", "capacity": "burst", "verdict": "chosen", "cost_usd": "0.42",
                     "finish": "14:05", "meets_deadline": "yes", "queue_wait": "00:00", "rule": "", "reason": ""}],
        tags={})
    assert outcome.why()[0] == f"no on-prem site is allowed for this job ({pinned})"
    assert outcome.headline().startswith("placement: cloud-eu (burst, strategy deadline_aware), est. $0.42, finish ")
    assert pinned in outcome.headline()
    md = outcome.to_markdown()
    header = next(line for line in md.splitlines() if line.startswith("| site"))
    assert "reason" not in header  # long reasons go under the table, in full
    assert f"- **onprem-dc1 (fixed)** — {pinned}" in md


def test_the_cli_prints_plain_lines_when_not_on_a_terminal():
    from rich.console import Console

    from hybridtrain.cli.progress import shown

    out = io.StringIO()
    with shown(Console(file=io.StringIO(), force_terminal=False), stream=out):
        progress.report("sync", "end", "sync finished: 10 bytes", done=1, total=1)
    progress.report("sync", "end", "not shown: the display is off")
    assert out.getvalue() == "[sync] sync finished: 10 bytes\n"


def test_the_cli_shows_bars_on_a_terminal():
    from rich.console import Console

    from hybridtrain.cli.progress import shown

    screen = io.StringIO()
    with shown(Console(file=screen, force_terminal=True, width=100)):
        progress.report("train", "start", "train started at cloud-eu: 2 epochs", done=0, total=2)
        progress.report("train", "step", "train epoch 1/2 at cloud-eu: loss 0.5", done=1, total=2)
    text = screen.getvalue()
    assert "train epoch 1/2 at cloud-eu: loss 0.5" in text
    assert "50%" in text


def test_rates_read_like_people_write_them():
    assert progress.rate(3 * 1024 * 1024, 2.0) == "1.5 MiB/s"
    assert progress.rate(100, 0.0) == "0.0 B/s"


def test_a_transfer_reports_its_bytes_in_steps_ending_at_the_total(events):
    ticks = iter([0.0, *[0.1 * i for i in range(1, 20)]])
    moving = progress.TransferProgress("sync", "onprem-dc1", "cloud-eu", clock=lambda: next(ticks))
    moving.update(0, 4, 0, 4000)
    moving.update(0, 4, 10, 4000)  # 0.25 % more: not worth a line
    for i in range(1, 5):
        moving.update(i, 4, 1000 * i, 4000)
    moving.update(4, 4, 4000, 4000)  # the same again: no repeat
    steps = [e for e in events if e.kind == "step"]
    assert [e.fields["bytes"] for e in steps] == [0, 1000, 2000, 3000, 4000]
    assert steps[-1].fraction == 1.0
    assert steps[1].message.startswith("sync 1,000 B of 3.9 KiB (1/4 files), onprem-dc1 -> cloud-eu, ")


def test_a_transfer_with_nothing_to_move_reports_no_steps(events):
    moving = progress.TransferProgress("sync", "onprem-dc1", "cloud-eu")
    moving.update(0, 0, 0, 0)
    assert events == []


def test_the_cli_moves_the_sync_bar_without_a_line_per_step():
    from rich.console import Console

    from hybridtrain.cli.progress import shown

    screen = io.StringIO()
    with shown(Console(file=screen, force_terminal=True, width=100)):
        progress.report("sync", "start", "sync started: a -> b", done=0, total=4000)
        moving = progress.TransferProgress("sync", "a", "b")
        moving.update(4, 4, 4000, 4000)
    text = screen.getvalue()
    assert "sync started: a -> b" in text and "100%" in text and "3.9 KiB" in text
    assert "4,000 B of" not in text  # the step is on the bar, not a line
