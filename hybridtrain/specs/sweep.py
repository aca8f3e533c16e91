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

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, field_validator, model_validator

from hybridtrain.errors import Problem
from hybridtrain.specs.schema_bounds import bound_numbers

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
LAYER_RE = re.compile(r"^hidden_layers\.(0|[1-9][0-9]?)$")  # one name per layer: no leading zeros
#: Metrics the trainer reports per epoch (``Trainer.fit``'s ``on_epoch``: ``train_loss`` and ``val_<m>`` for
#: each of ``job.METRICS``; this module cannot import job.py, which imports it — a unit test keeps them equal).
OBJECTIVE_METRICS = ("train_loss", "val_auc", "val_accuracy", "val_f1", "val_precision", "val_recall",
                     "val_log_loss")
LOWER_IS_BETTER = frozenset({"train_loss", "val_log_loss"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, json_schema_extra=bound_numbers)


def _not_a_bool(v: Any) -> Any:
    """A count or seed given as true/false is a mistake (pydantic would read true as 1)."""
    if isinstance(v, bool):
        raise ValueError(f"{str(v).lower()} is not a whole number")
    return v


def _by_name(v: Any) -> Any:
    """``sampler: tpe`` is short for ``sampler: {name: tpe}`` (and the same for the pruner)."""
    return {"name": v} if isinstance(v, str) else v


class Parameter(Strict):
    """One dimension of the search space."""

    type: Literal["float", "int", "categorical"] = Field(description="float, int or categorical.")
    low: FiniteFloat | None = Field(None, description="float/int: smallest value (inclusive).")
    high: FiniteFloat | None = Field(None, description="float/int: largest value (inclusive).")
    log: bool = Field(False, strict=True, description="float/int: sample on a log scale (low must be > 0).")
    step: FiniteFloat | None = Field(None, gt=0, description="float/int: spacing of the values from low to high "
                                                             "(not with log; high - low a whole number of steps).")
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
        if self.step is not None:
            steps = (self.high - self.low) / self.step
            if not math.isclose(steps, round(steps), rel_tol=0, abs_tol=1e-9 * max(1.0, steps)):
                top = self.low + math.floor(steps) * self.step
                raise ValueError(f"high ({self.high:g}) is not low ({self.low:g}) plus a whole number of steps "
                                 f"({self.step:g}): only values up to {top:g} would be tried; set high to {top:g} "
                                 f"or {top + self.step:g}, or change step")
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

    @model_validator(mode="after")
    def _direction_fits(self) -> Objective:
        better = "minimize" if self.metric in LOWER_IS_BETTER else "maximize"
        if self.direction is not None and self.direction != better:
            lower = "lower" if better == "minimize" else "higher"
            raise ValueError(f"{self.metric} is better {lower}: direction {self.direction} would pick the worst "
                             f"trial; use direction: {better}, or leave direction out")
        return self

    @property
    def resolved_direction(self) -> str:
        if self.direction is not None:
            return self.direction
        return "minimize" if self.metric in LOWER_IS_BETTER else "maximize"


class SamplerSpec(Strict):
    """How the next trial's values are chosen (``hybridtrain.sweeps.study.SAMPLERS``)."""

    name: str = Field("tpe", description="tpe (default), random, qmc or grid (categorical parameters only).")
    seed: int | None = Field(0, ge=0, description="Seed of the sampler (same seed, same proposals); null: random.")

    _seed_not_bool = field_validator("seed", "n_startup_trials", mode="before")(_not_a_bool)
    n_startup_trials: int = Field(
        8, ge=0, description="tpe: trials sampled at random before the model-based proposals start.")


class PrunerSpec(Strict):
    """When a running trial is stopped early (``hybridtrain.sweeps.study.PRUNERS``), at epoch ends."""

    name: str = Field("median", description="median (default), asha (successive halving) or none.")
    warmup_epochs: int = Field(1, ge=0, description="median: epochs a trial always runs before it may be pruned.")
    startup_trials: int = Field(4, ge=0, description="median: trials that finish before any is pruned.")
    min_epochs: int = Field(1, ge=1, description="asha: epochs of the first rung (min resource).")
    reduction_factor: int = Field(3, ge=2, description="asha: only the top 1/reduction_factor of a rung goes on.")

    _counts_not_bool = field_validator("warmup_epochs", "startup_trials", "min_epochs", "reduction_factor",
                                       mode="before")(_not_a_bool)


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

    _counts_not_bool = field_validator("n_trials", "parallelism", "max_failed_trials", mode="before")(_not_a_bool)
    _shorthand = field_validator("sampler", "pruner", mode="before")(_by_name)

    @field_validator("study_name", mode="before")
    @classmethod
    def _study_name(cls, v: Any) -> Any:
        if isinstance(v, str) and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v):
            raise ValueError(f"{v!r} is not a study name: 1-128 ASCII letters, digits, '.', '_' or '-', starting "
                             "with a letter or digit (e.g. churn-sweep-2)")
        return v


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
            if param.type == "float" or (param.type == "int" and (param.low or 0) < 1) or (
                    param.type == "categorical" and not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                                                            for c in param.choices or [])):
                p.append(Problem(path, "a layer width is a whole number of at least 1 (type: int with low >= 1, or "
                                       "categorical choices such as [32, 64, 128])"))
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
    pruner = sweep.pruner
    first = {"median": ("warmup_epochs", pruner.warmup_epochs), "asha": ("min_epochs", pruner.min_epochs)}
    if pruner.name in first and "epochs" not in sweep.parameters and first[pruner.name][1] >= model.epochs:
        field, n = first[pruner.name]
        p.append(Problem(f"sweep.pruner.{field}", f"{n} is not below model.epochs ({model.epochs}): a trial could be "
                                                  "stopped only at its last epoch, which saves nothing; lower it, or "
                                                  "use pruner: none"))
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
