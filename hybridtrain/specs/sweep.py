"""SweepSpec: the ``sweep:`` section of a job spec — the hyperparameters to search, the objective, and how many trials run, how, where.

A job spec with a ``sweep:`` section is run by ``hybridtrain sweep SPEC``: each trial trains the
job's model with some of its ``model`` fields replaced by values drawn from ``parameters``.

```yaml
sweep:
  objective: {metric: val_auc, direction: maximize}
  n_trials: 32
  parallelism: 4
  sampler: {name: tpe, seed: 0}
  pruner: {name: median, warmup_epochs: 1}
  parameters:
    learning_rate: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
    dropout: {type: float, low: 0.0, high: 0.5}
    batch_size: {type: categorical, choices: [64, 128, 256]}
    hidden_layers: {type: categorical, choices: [[32], [64, 32], [128, 64]]}
    hidden_layers.0: {type: int, low: 16, high: 256, log: true}   # one layer's width
```

Parameter names are fields of ``model`` the trainer uses (``TUNABLE``), or ``hidden_layers.N`` for
the width of layer N. The JSON Schema of job specs (``hybridtrain schema``) includes this section.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hybridtrain.errors import Problem

#: ModelSpec fields a sweep may vary, and the Python type each takes.
TUNABLE: dict[str, type] = {
    "learning_rate": float,
    "dropout": float,
    "weight_decay": float,
    "batch_size": int,
    "epochs": int,
    "hidden_layers": list,
    "seed": int,
}
LAYER_RE = re.compile(r"^hidden_layers\.([0-9]{1,2})$")
#: Metrics the trainer reports per epoch (``Trainer.fit``'s ``on_epoch``: ``train_loss`` and ``val_<m>`` for
#: each of ``job.METRICS``; this module cannot import job.py, which imports it — a unit test keeps them equal).
OBJECTIVE_METRICS = ("train_loss", "val_auc", "val_accuracy", "val_f1", "val_precision", "val_recall",
                     "val_log_loss")
LOWER_IS_BETTER = frozenset({"train_loss", "val_log_loss"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Parameter(Strict):
    """One dimension of the search space."""

    type: Literal["float", "int", "categorical"] = Field(description="float, int or categorical.")
    low: float | None = Field(None, description="float/int: smallest value (inclusive).")
    high: float | None = Field(None, description="float/int: largest value (inclusive).")
    log: bool = Field(False, description="float/int: sample on a log scale (low must be > 0).")
    step: float | None = Field(None, gt=0, description="float/int: spacing of the values (not with log).")
    choices: list[Any] | None = Field(
        None, min_length=1, description="categorical: the values to choose from (numbers, strings, booleans, or "
        "lists of layer widths for hidden_layers).")

    @model_validator(mode="after")
    def _consistent(self) -> Parameter:
        if self.type == "categorical":
            if self.choices is None:
                raise ValueError("a categorical parameter needs choices: [...]")
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError("low, high, log and step apply to float and int parameters, not categorical")
            return self
        if self.choices is not None:
            raise ValueError(f"choices apply to categorical parameters; a {self.type} parameter takes low and high")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} parameter needs low and high")
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) is above high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0 (got {self.low:g})")
        if self.log and self.step is not None:
            raise ValueError("step and log: true cannot be combined; drop one")
        if self.type == "int":
            for name in ("low", "high", "step"):
                v = getattr(self, name)
                if v is not None and float(v) != int(v):
                    raise ValueError(f"an int parameter needs a whole {name}, got {v:g}")
        return self


class Objective(Strict):
    """What the sweep optimizes: a per-epoch metric of the trainer, at the trial's last epoch."""

    metric: str = Field("val_auc", description=f"One of {', '.join(OBJECTIVE_METRICS)}.")
    direction: Literal["maximize", "minimize"] | None = Field(
        None, description="maximize or minimize; default from the metric (val_log_loss and train_loss: minimize).")

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in OBJECTIVE_METRICS:
            raise ValueError(f"unknown metric {v!r}; use one of {', '.join(OBJECTIVE_METRICS)}")
        return v

    @property
    def resolved_direction(self) -> str:
        if self.direction is not None:
            return self.direction
        return "minimize" if self.metric in LOWER_IS_BETTER else "maximize"


class SamplerSpec(Strict):
    """How the next trial's values are chosen (``hybridtrain.sweeps.study.SAMPLERS``)."""

    name: str = Field("tpe", description="tpe (default), random, qmc or grid (categorical parameters only).")
    seed: int | None = Field(0, ge=0, description="Seed of the sampler (same seed, same proposals); null: random.")
    n_startup_trials: int = Field(
        8, ge=0, description="tpe: trials sampled at random before the model-based proposals start.")


class PrunerSpec(Strict):
    """When a running trial is stopped early (``hybridtrain.sweeps.study.PRUNERS``), at epoch ends."""

    name: str = Field("median", description="median (default), asha (successive halving) or none.")
    warmup_epochs: int = Field(1, ge=0, description="median: epochs a trial always runs before it may be pruned.")
    startup_trials: int = Field(4, ge=0, description="median: trials that finish before any is pruned.")
    min_epochs: int = Field(1, ge=1, description="asha: epochs of the first rung (min resource).")
    reduction_factor: int = Field(3, ge=2, description="asha: only the top 1/reduction_factor of a rung goes on.")


class SweepSpec(Strict):
    """A hyperparameter sweep over the job's model (run by ``hybridtrain sweep``)."""

    parameters: dict[str, Parameter] = Field(
        min_length=1, description="Search space: model field (learning_rate, dropout, weight_decay, batch_size, "
        "epochs, hidden_layers, seed) or hidden_layers.N -> its distribution.")
    objective: Objective = Field(default_factory=Objective)
    n_trials: int = Field(16, ge=1, le=10000, description="Trials to run in all (a resumed sweep counts its earlier ones).")
    parallelism: int = Field(2, ge=1, le=256, description="Trials running at the same time.")
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    job_class: str = Field(
        "opportunistic", description="Placement job class of each trial (policy job_classes); opportunistic lets "
        "trials use spot capacity, checkpointing and resuming after a preemption.")
    study_name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="Optuna study name; default <job>-sweep. The same name continues the same study.")
    max_failed_trials: int | None = Field(
        None, ge=0, description="Stop starting new trials after this many failed ones (default: never; a failed "
        "trial never stops the others).")


def sweep_problems(sweep: SweepSpec, model: Any) -> list[Problem]:
    """Cross-field rules: parameter names the trainer uses, values the model spec accepts."""
    p: list[Problem] = []
    widths = len(model.hidden_layers)
    for name, param in sweep.parameters.items():
        path = f"sweep.parameters.{name}"
        layer = LAYER_RE.match(name)
        if layer:
            if "hidden_layers" in sweep.parameters:
                p.append(Problem(path, "hidden_layers is swept as a whole too; sweep either the list or its widths"))
            elif int(layer.group(1)) >= widths:
                p.append(Problem(path, f"model.hidden_layers has {widths} layer(s) (0-{widths - 1}); add layers "
                                       "there or sweep hidden_layers as a categorical list"))
            if param.type == "float" or (param.type == "int" and (param.low or 0) < 1):
                p.append(Problem(path, "a layer width is an int of at least 1 (type: int, low >= 1)"))
            continue
        if name not in TUNABLE:
            p.append(Problem(path, f"unknown parameter {name!r}; sweep one of {', '.join(TUNABLE)} or "
                                   "hidden_layers.N (width of layer N)"))
            continue
        kind = TUNABLE[name]
        if kind is list:
            if param.type != "categorical" or not all(
                    isinstance(c, list) and c and all(isinstance(w, int) and not isinstance(w, bool) and w >= 1
                                                      for w in c) for c in param.choices or []):
                p.append(Problem(path, "hidden_layers takes type: categorical with choices that are lists of layer "
                                       "widths, e.g. [[32], [64, 32]]; or sweep hidden_layers.N"))
            continue
        if kind is int and param.type == "float":
            p.append(Problem(path, f"{name} is a whole number: use type: int or categorical"))
        values = param.choices if param.type == "categorical" else [param.low, param.high]
        for v in values or []:
            bad = _invalid_value(model, name, kind, v)
            if bad:
                p.append(Problem(path, f"value {v!r} is not valid for model.{name}: {bad}"))
                break
    if sweep.sampler.name == "grid" and any(x.type != "categorical" for x in sweep.parameters.values()):
        p.append(Problem("sweep.sampler.name", "grid searches categorical parameters only: give every parameter "
                                               "choices, or use tpe or random"))
    if "epochs" in sweep.parameters and sweep.pruner.name == "asha":
        p.append(Problem("sweep.pruner.name", "asha compares trials at the same epoch: do not sweep epochs with it "
                                              "(use median, or fix epochs)"))
    return p


def _invalid_value(model: Any, name: str, kind: type, value: Any) -> str | None:
    """Why ``value`` cannot be ``model.<name>``, or None when the model spec accepts it."""
    from pydantic import ValidationError

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a {kind.__name__}"
    if kind is int and float(value) != int(value):
        return "expected a whole number"
    try:
        type(model).model_validate({**model.model_dump(), name: kind(value)})
    except ValidationError as exc:
        return str(exc.errors()[0].get("msg", exc))
    return None
