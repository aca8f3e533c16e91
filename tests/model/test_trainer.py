import itertools
import logging
import threading
import time

import numpy as np
import pytest
import torch

from hybridtrain.errors import DataError, Preempted, SpecError
from hybridtrain.specs.job import CheckpointSpec
from hybridtrain.training import trainer as trainer_module
from hybridtrain.training.checkpoint_writer import CheckpointWriter
from hybridtrain.training.trainer import epoch_permutation
from tests.fixtures.training_data import (
    LABEL,
    SPEC,
    STEPS_PER_EPOCH,
    TOTAL_STEPS,
    TRAIN,
    VAL,
    assert_same_weights,
    ckpt_store,
    stop_after,
    trainer,
)


# 2000 train rows / batch 128 = 16 steps per epoch (the last one 80 rows), 48 in all.
def test_model_learns_and_clearly_beats_the_majority_class(reference):
    result, epochs = reference
    final = result.history[-1]
    majority = max(VAL[LABEL].mean(), 1 - VAL[LABEL].mean())
    assert final["val_accuracy"] > majority + 0.1
    assert final["val_auc"] > 0.85
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]

    assert result.global_step == TOTAL_STEPS
    assert result.epochs_completed == 3
    assert result.resumed_from_step is None
    assert [e for e, _ in epochs] == [0, 1, 2]
    assert {"train_loss", "val_auc", "val_log_loss", "val_n", "val_positive_rate"} <= set(epochs[0][1])
    assert [h["epoch"] for h in result.history] == [0, 1, 2]
    assert result.best_epoch in (0, 1, 2)
    assert result.best_val_metric == max(h["val_auc"] for h in result.history)
    assert not result.model.training
    assert all(p.device.type == "cpu" for p in result.model.parameters())
    assert result.samples_per_second > 0
    assert result.featurizer.n_features == 3 + 1 + 4  # charges has gaps in train: indicator column


def test_checkpoints_follow_the_step_interval_and_retention_keeps_n(tmp_path, reference):
    store = ckpt_store(tmp_path)
    result = trainer(store, CheckpointSpec(interval_steps=10, keep_last=2, max_overhead=None)).fit(TRAIN, VAL)
    # Steps 10, 20, 30, 40 by the interval, then the final one at 48.
    assert result.checkpoints_written == 5
    assert [c.step for c in store.list()] == [40, 48]
    assert result.last_checkpoint == store.list()[-1]
    state, info = store.latest_valid()
    assert info.step == 48
    assert state["progress"]["epoch"] == 3
    assert len(state["progress"]["history"]) == 3
    assert_same_weights(result.model, reference[0].model)  # checkpointing does not change training


def test_checkpoints_follow_the_time_interval_on_the_injected_clock(tmp_path):
    store = ckpt_store(tmp_path, keep_last=100)
    clock = itertools.count(0, 20).__next__  # 20 "seconds" pass per call, one call per step
    result = trainer(store, CheckpointSpec(interval_steps=None, interval_minutes=1, keep_last=100)).fit(
        TRAIN, VAL, clock=clock
    )
    steps = [c.step for c in store.list()]
    assert steps == list(range(3, TOTAL_STEPS + 1, 3)) + [TOTAL_STEPS]
    assert result.checkpoints_written == len(steps)


def test_step_checkpoints_are_spaced_to_keep_their_measured_cost_under_max_overhead(tmp_path, reference, caplog,
                                                                                   monkeypatch):
    store = ckpt_store(tmp_path, keep_last=100)
    save = store.save

    def costly_save(*args, **kwargs):  # each write uses at least 30 ms of the writer thread's CPU
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass
        return save(*args, **kwargs)

    store.save = costly_save
    writers = []
    init = CheckpointWriter.__init__

    def recorded_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        writers.append(self)

    monkeypatch.setattr(CheckpointWriter, "__init__", recorded_init)
    ticks = itertools.count(0, 0.1)

    def clock():  # one call per due step: 0.1 "seconds" every 2 steps
        # A due step finds the previous write ended, however slowly this host ran it: what spaces
        # the checkpoints is then their measured cost, not a write still in flight.
        deadline = time.monotonic() + 30
        while writers and writers[-1].busy and time.monotonic() < deadline:
            time.sleep(0.001)
        return next(ticks)

    with caplog.at_level(logging.INFO, logger="hybridtrain.training.trainer"):
        result = trainer(store, CheckpointSpec(interval_steps=2, keep_last=100, max_overhead=0.05)).fit(
            TRAIN, VAL, clock=clock)
    steps = [c.step for c in store.list()]
    # The first is written before any cost is known; then >= 30 ms / 5 % = 0.6 s = 12 steps apart.
    assert steps[0] == 2 and steps[-1] == TOTAL_STEPS
    assert all(s % 2 == 0 for s in steps)
    assert all(b - a >= 12 for a, b in itertools.pairwise(steps[:-1]))
    assert result.checkpoints_written == len(steps)
    assert result.checkpoints_skipped == TOTAL_STEPS // 2 - (len(steps) - 1)
    assert "checkpoint.max_overhead 0.05" in caplog.text
    assert_same_weights(result.model, reference[0].model)  # fewer checkpoints, the same training


def test_epoch_permutation_depends_only_on_seed_and_epoch():
    assert torch.equal(epoch_permutation(100, 3, 1), epoch_permutation(100, 3, 1))
    assert not torch.equal(epoch_permutation(100, 3, 1), epoch_permutation(100, 3, 2))
    assert not torch.equal(epoch_permutation(100, 3, 1), epoch_permutation(100, 4, 1))


@pytest.mark.parametrize(
    "stop_at",
    [1, 10, 23, STEPS_PER_EPOCH, TOTAL_STEPS],
    ids=["first-step", "on-interval", "mid-epoch", "last-step-of-epoch", "last-step"],
)
def test_preempted_run_resumes_bit_identical(tmp_path, reference, stop_at):
    ref, ref_epochs = reference
    store = ckpt_store(tmp_path)
    with pytest.raises(Preempted) as err:
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(stop_at))
    assert err.value.step == stop_at
    assert err.value.job == "churn"
    newest = store.list()[-1]
    assert newest.step == stop_at
    assert err.value.checkpoint == newest.key
    assert [c.step for c in store.list()].count(stop_at) == 1  # an interval save at that step is reused

    epochs = []
    resumed = trainer(store).fit(TRAIN, VAL, on_epoch=lambda e, m: epochs.append((e, m)))
    assert resumed.resumed_from_step == stop_at
    assert resumed.global_step == TOTAL_STEPS
    assert_same_weights(resumed.model, ref.model)
    assert resumed.history == ref.history
    # Epochs whose validation had not happened before the stop are reported after the resume.
    first_unreported = stop_at // STEPS_PER_EPOCH if stop_at % STEPS_PER_EPOCH else stop_at // STEPS_PER_EPOCH - 1
    assert epochs == ref_epochs[first_unreported:]


def test_twice_preempted_run_still_bit_identical(tmp_path, reference):
    store = ckpt_store(tmp_path)
    with pytest.raises(Preempted):
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(7))
    with pytest.raises(Preempted) as err:
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(30))
    assert err.value.step == 37
    resumed = trainer(store).fit(TRAIN, VAL)
    assert resumed.resumed_from_step == 37
    assert_same_weights(resumed.model, reference[0].model)


def test_fits_at_once_in_threads_each_train_exactly_as_alone(tmp_path, reference):
    # A sweep's inline trials train in threads of one process; torch's global RNG is shared by them.
    assert SPEC.dropout > 0  # dropout masks are drawn on every step
    results, errors = {}, []

    def fit(i: int) -> None:
        try:
            results[i] = trainer(ckpt_store(tmp_path / str(i))).fit(TRAIN, VAL)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=fit, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 3, errors
    for result in results.values():
        assert_same_weights(result.model, reference[0].model)
        assert result.history == reference[0].history
        assert result.model.generator is None  # what callers save or export holds no training state


def test_a_checkpoint_from_before_models_had_their_own_generator_resumes_bit_identical(tmp_path, reference,
                                                                                       monkeypatch):
    # Such a checkpoint holds no "dropout" state: its masks came from torch's global generator, saved as "torch".
    capture = trainer_module._capture_rng

    def old_format(device, dropout):
        state = capture(device, dropout)
        state["torch"] = state.pop("dropout")
        return state

    store = ckpt_store(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(trainer_module, "_capture_rng", old_format)
        with pytest.raises(Preempted):
            trainer(store).fit(TRAIN, VAL, should_stop=stop_after(23))
    resumed = trainer(store).fit(TRAIN, VAL)
    assert resumed.resumed_from_step == 23
    assert_same_weights(resumed.model, reference[0].model)


def test_resume_after_finished_run_returns_the_same_model_without_training(tmp_path, reference):
    store = ckpt_store(tmp_path)
    trainer(store).fit(TRAIN, VAL)
    before = len(store.list())
    again = trainer(store).fit(TRAIN, VAL)
    assert again.resumed_from_step == TOTAL_STEPS
    assert again.checkpoints_written == 0
    assert len(store.list()) == before
    assert_same_weights(again.model, reference[0].model)


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, reference, caplog):
    store = ckpt_store(tmp_path)
    with pytest.raises(Preempted):
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(23))
    assert [c.step for c in store.list()] == [10, 20, 23]
    newest = store.list()[-1]
    path = store.store.root / newest.key
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="hybridtrain.training.checkpoint"):
        resumed = trainer(store).fit(TRAIN, VAL)
    assert newest.key in caplog.text
    assert resumed.resumed_from_step == 20
    assert_same_weights(resumed.model, reference[0].model)


def test_resume_on_different_training_rows_warns(tmp_path, caplog):
    store = ckpt_store(tmp_path)
    with pytest.raises(Preempted):
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(5))
    with caplog.at_level(logging.WARNING, logger="hybridtrain.training.trainer"):
        result = trainer(store, spec=SPEC.model_copy(update={"epochs": 1})).fit(TRAIN.iloc[:-1], VAL)
    assert result.resumed_from_step == 5
    assert "different training rows" in caplog.text


def test_resume_with_a_different_model_spec_is_refused(tmp_path):
    store = ckpt_store(tmp_path)
    with pytest.raises(Preempted):
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(5))
    changed = SPEC.model_copy(update={"hidden_layers": [32]})
    with pytest.raises(SpecError) as err:
        trainer(store, spec=changed).fit(TRAIN, VAL)
    assert err.value.problems[0].path == "model.hidden_layers"
    assert "new checkpoint prefix" in str(err.value)


def test_more_epochs_extend_a_finished_run(tmp_path, reference):
    store = ckpt_store(tmp_path)
    trainer(store).fit(TRAIN, VAL)
    longer = trainer(store, spec=SPEC.model_copy(update={"epochs": 4})).fit(TRAIN, VAL)
    assert longer.resumed_from_step == TOTAL_STEPS
    assert longer.global_step == TOTAL_STEPS + STEPS_PER_EPOCH
    assert longer.history[:3] == reference[0].history


def test_empty_train_frame_is_a_data_error(tmp_path):
    with pytest.raises(DataError) as err:
        trainer(ckpt_store(tmp_path)).fit(TRAIN.iloc[:0], VAL)
    assert err.value.dataset == "train"
    assert "no rows" in str(err.value)


def test_missing_label_is_a_data_error_naming_the_column(tmp_path):
    with pytest.raises(DataError) as err:
        trainer(ckpt_store(tmp_path)).fit(TRAIN.drop(columns=LABEL), VAL)
    assert err.value.problems[0].path == LABEL
    assert "schema.label" in str(err.value)


def test_non_binary_label_is_a_data_error_naming_the_column(tmp_path):
    bad = TRAIN.assign(**{LABEL: TRAIN[LABEL] * 2})  # values 0 and 2
    with pytest.raises(DataError) as err:
        trainer(ckpt_store(tmp_path)).fit(bad, VAL)
    assert err.value.problems[0].path == LABEL
    assert "binary" in str(err.value)
    assert "2" in str(err.value)


def test_text_and_bool_labels_are_accepted(tmp_path):
    text = TRAIN.assign(**{LABEL: TRAIN[LABEL].map({0: "false", 1: "True"})})
    boolean = VAL.assign(**{LABEL: VAL[LABEL].astype(bool)})
    spec = SPEC.model_copy(update={"epochs": 1})
    result = trainer(ckpt_store(tmp_path), spec=spec).fit(text, boolean)
    assert result.history[0]["val_auc"] > 0.8


def test_single_class_validation_split_is_refused_before_training(tmp_path):
    store = ckpt_store(tmp_path)
    with pytest.raises(DataError) as err:
        trainer(store).fit(TRAIN, VAL[VAL[LABEL] == 1])
    assert err.value.dataset == "val"
    assert "single class" in str(err.value)
    assert store.list() == []


def test_missing_feature_column_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(DataError) as err:
        trainer(ckpt_store(tmp_path)).fit(TRAIN, VAL.drop(columns="contract"))
    assert err.value.dataset == "val"
    assert [p.path for p in err.value.problems] == ["contract"]


def test_checkpoint_state_is_weights_only_and_restores_numpy_and_python_rngs(tmp_path):
    import random

    store = ckpt_store(tmp_path)
    with pytest.raises(Preempted):
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(3))
    state, _ = store.latest_valid()  # loaded with torch.load(weights_only=True)
    assert set(state) >= {"model", "optimizer", "featurizer", "progress", "rng", "model_spec"}
    assert state["progress"] == {**state["progress"], "epoch": 0, "step_in_epoch": 3, "global_step": 3}

    # Training draws only from torch, so numpy and random still hold their seeded states.
    np.random.seed(SPEC.seed)
    random.seed(SPEC.seed)
    expected = (np.random.rand(3).tolist(), [random.random() for _ in range(3)])
    np.random.seed(0)
    random.seed(0)
    dropout = torch.Generator()
    trainer_module._restore_rng(state["rng"], torch.device("cpu"), dropout)
    assert (np.random.rand(3).tolist(), [random.random() for _ in range(3)]) == expected
    assert torch.equal(dropout.get_state(), state["rng"]["dropout"])


def test_training_modules_import_no_tracking_or_orchestration_client():
    import subprocess
    import sys

    code = (
        "import sys, hybridtrain.training.trainer, hybridtrain.training.evaluation, hybridtrain.training.checkpoint;"
        "bad = [m for m in ('mlflow', 'prefect') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_trained_model_scripts_for_edge_export_and_answers_the_same(reference):
    # Edge export (torch.jit.script) reads the model's methods, the training-only dropout path included.
    model = reference[0].model
    x = torch.randn(5, model.n_inputs)
    scripted = torch.jit.script(model)
    assert torch.equal(scripted(x), model(x))
    seeded = type(model)(model.n_inputs, model.hidden_layers, model.dropout, torch.Generator().manual_seed(1))
    assert torch.jit.script(seeded.eval())(x).shape == (5,)
