"""Training under a preemption notice (a real SIGTERM to this process); checkpoints timed from the rate."""

from __future__ import annotations

import itertools
import os
import signal

import pytest

from hybridtrain.errors import Preempted
from hybridtrain.specs.job import CheckpointSpec
from hybridtrain.training.checkpoint_interval import MAX_INTERVAL_S, MIN_INTERVAL_S, optimal_interval_s
from hybridtrain.training.preemption import PreemptionNotice, PreemptionReport
from hybridtrain.training.trainer import Trainer
from tests.fixtures.training_data import (
    LABEL,
    SPEC,
    STEPS_PER_EPOCH,
    TOTAL_STEPS,
    TRAIN,
    VAL,
    assert_same_weights,
    ckpt_store,
    trainer,
)

AUTO = CheckpointSpec(interval_steps=None, auto_interval=True, keep_last=100)


def test_sigterm_stops_after_the_step_in_progress_with_a_verified_checkpoint(tmp_path, reference):
    store = ckpt_store(tmp_path)

    def notice_after_first_epoch(epoch: int, metrics: dict) -> None:
        if epoch == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # the spot notice, delivered to this very process

    with PreemptionNotice(grace_s=30) as notice, pytest.raises(Preempted) as err:
        trainer(store).fit(TRAIN, VAL, on_epoch=notice_after_first_epoch, should_stop=notice)
    # The notice came between epochs; the next step still ran, then the trainer stopped.
    assert err.value.step == STEPS_PER_EPOCH + 1
    report = notice.report(err.value)
    assert report.reason == "SIGTERM" and report.within_grace and report.seconds_after_notice < 30
    state, info = store.latest_valid()  # complete and verified (SHA-256 against its manifest)
    assert info.step == err.value.step and info.key == err.value.checkpoint
    assert state["progress"]["global_step"] == err.value.step
    assert report.write(tmp_path) and PreemptionReport.read(tmp_path).error().step == err.value.step

    resumed = trainer(store).fit(TRAIN, VAL)
    assert resumed.resumed_from_step == STEPS_PER_EPOCH + 1
    assert_same_weights(resumed.model, reference[0].model)
    assert resumed.history == reference[0].history


def auto_trainer(store, rate: float | None) -> Trainer:
    return Trainer(SPEC, AUTO, store, LABEL, device="cpu", threads=1, job="churn", preemptions_per_hour=rate)


def test_auto_interval_on_unstable_capacity_uses_the_lower_bound(tmp_path, reference):
    store = ckpt_store(tmp_path, keep_last=100)
    clock = itertools.count(0, 20).__next__  # 20 "seconds" per step
    # 3600 preemptions an hour (MTBF 1 s): sqrt(2 × write × 1) is far below the bound → every 60 s.
    result = auto_trainer(store, 3600).fit(TRAIN, VAL, clock=clock)
    assert result.checkpoint_interval_s == MIN_INTERVAL_S
    assert [c.step for c in store.list()] == list(range(3, TOTAL_STEPS + 1, 3)) + [TOTAL_STEPS]
    assert result.checkpoint_seconds > 0 and result.checkpoints_written == len(store.list())
    assert_same_weights(result.model, reference[0].model)  # when checkpoints happen never changes training


def test_auto_interval_without_observed_preemptions_uses_the_upper_bound(tmp_path):
    store = ckpt_store(tmp_path, keep_last=100)
    clock = itertools.count(0, 20).__next__
    for rate in (None, 0.0):
        result = auto_trainer(store, rate).fit(TRAIN, VAL, clock=clock)
        assert result.checkpoint_interval_s == MAX_INTERVAL_S  # 3600 s = 180 steps: only the final one
    assert [c.step for c in store.list()] == [TOTAL_STEPS]


def test_auto_interval_follows_the_measured_write_time(tmp_path):
    # 0.001 preemptions an hour (MTBF 1000 h): Young's interval lies between the bounds for any
    # write time from 0.5 ms to 1.8 s (a write here takes milliseconds: state, hash, fsync, manifest).
    store = ckpt_store(tmp_path, keep_last=100)
    result = auto_trainer(store, 0.001).fit(TRAIN, VAL, clock=itertools.count(0, 20).__next__)
    mean_write = result.checkpoint_seconds / result.checkpoints_written
    assert 0.0005 < mean_write < 1.8
    assert result.checkpoint_interval_s == pytest.approx(optimal_interval_s(mean_write, 0.001))
    assert MIN_INTERVAL_S < result.checkpoint_interval_s < MAX_INTERVAL_S
    # The first checkpoint came at the lower bound (nothing timed yet): 60 s = step 3.
    assert store.list()[0].step == 3


def test_a_negative_rate_is_refused(tmp_path):
    with pytest.raises(ValueError, match="preemptions_per_hour"):
        auto_trainer(ckpt_store(tmp_path), -1.0)
