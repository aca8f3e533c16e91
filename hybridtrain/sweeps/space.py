"""SearchSpace: a sweep's parameters as Optuna distributions, and a trial's values applied to the job's model spec.

Optuna's categorical choices must be scalars; a list choice (``hidden_layers: [[32], [64, 32]]``)
is stored in the study as its JSON text (``"[64, 32]"``) and decoded when applied. So a trial's
``params`` as Optuna keeps them are ``encoded``; ``decode`` gives the values the model receives::

    space = SearchSpace(spec.sweep.parameters)
    model = space.apply(spec.model, {"learning_rate": 0.01, "hidden_layers": "[64, 32]"})
    model.hidden_layers  # [64, 32]
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.job import JobSpec, ModelSpec
from hybridtrain.specs.sweep import LAYER_RE, TUNABLE, Parameter


class SearchSpace:
    """The parameters of one sweep."""

    def __init__(self, parameters: dict[str, Parameter]):
        self.parameters = dict(parameters)

    def encoded_choices(self, name: str) -> list[Any]:
        p = self.parameters[name]
        return [json.dumps(c) if isinstance(c, (list, dict)) else c for c in p.choices or []]

    def distributions(self) -> dict[str, Any]:
        """Name → Optuna distribution (``optuna.distributions``)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        out: dict[str, Any] = {}
        for name, p in self.parameters.items():
            if p.type == "categorical":
                out[name] = CategoricalDistribution(self.encoded_choices(name))
            elif p.type == "int":
                out[name] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
            else:
                out[name] = FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)
        return out

    def decode(self, params: dict[str, Any]) -> dict[str, Any]:
        """Values as the model receives them (list choices parsed back from their JSON text)."""
        out = {}
        for name, value in params.items():
            p = self.parameters.get(name)
            if p is not None and p.type == "categorical" and isinstance(value, str) and any(
                    isinstance(c, (list, dict)) for c in p.choices or []):
                value = json.loads(value)
            out[name] = value
        return out

    def apply(self, model: ModelSpec, params: dict[str, Any]) -> ModelSpec:
        """``model`` with the trial's values in place (validated like any model spec)."""
        values = self.decode(params)
        data = model.model_dump()
        layers = list(data["hidden_layers"])
        for name, value in values.items():
            layer = LAYER_RE.match(name)
            if layer:
                layers[int(layer.group(1))] = int(value)
            elif TUNABLE.get(name) is int:
                data[name] = int(value)
            elif TUNABLE.get(name) is float:
                data[name] = float(value)
            else:
                data[name] = value
        if "hidden_layers" not in values:
            data["hidden_layers"] = layers
        try:
            return ModelSpec.model_validate(data)
        except ValidationError as exc:
            raise SpecError("trial values", [
                Problem(f"model.{'.'.join(str(x) for x in e['loc'])}", f"{e['msg']} (the trial's values: {values}); "
                        "values outside the sweep's ranges come from trials enqueued by hand")
                for e in exc.errors()]) from None


def trial_spec(spec: JobSpec, params: dict[str, Any]) -> JobSpec:
    """The job spec one trial trains: the sweep's values in ``model``, and no ``sweep`` section."""
    if spec.sweep is None:
        raise ValueError(f"job {spec.name} has no sweep section")
    model = SearchSpace(spec.sweep.parameters).apply(spec.model, params)
    return spec.model_copy(update={"model": model, "sweep": None})
