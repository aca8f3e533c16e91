"""SweepRegistry: Optuna samplers and pruners by the name used in a spec's ``sweep:`` section.

Each entry builds the Optuna object from the spec (Optuna is imported only when one is built), so
validating a spec needs no Optuna import. ``none`` turns pruning off: every trial runs all its epochs.
"""

from __future__ import annotations

from typing import Any

from hybridtrain.plugins import PluginRegistry
from hybridtrain.specs.sweep import PrunerSpec, SamplerSpec, SweepSpec

SAMPLERS: PluginRegistry[Any] = PluginRegistry("sweep sampler", default="tpe")
PRUNERS: PluginRegistry[Any] = PluginRegistry("sweep pruner", default="median")


@SAMPLERS.register("tpe")
def tpe(s: SamplerSpec, sweep: SweepSpec) -> Any:
    import optuna

    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.n_startup_trials)


@SAMPLERS.register("random")
def random(s: SamplerSpec, sweep: SweepSpec) -> Any:
    import optuna

    return optuna.samplers.RandomSampler(seed=s.seed)


@SAMPLERS.register("qmc")
def qmc(s: SamplerSpec, sweep: SweepSpec) -> Any:
    import optuna

    return optuna.samplers.QMCSampler(seed=s.seed, scramble=True)


@SAMPLERS.register("grid")
def grid(s: SamplerSpec, sweep: SweepSpec) -> Any:
    import optuna

    from hybridtrain.sweeps.space import SearchSpace

    space = SearchSpace(sweep.parameters)
    return optuna.samplers.GridSampler({n: space.encoded_choices(n) for n in sweep.parameters}, seed=s.seed)


@PRUNERS.register("median")
def median(p: PrunerSpec) -> Any:
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_epochs)


@PRUNERS.register("asha")
def asha(p: PrunerSpec) -> Any:
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_epochs, reduction_factor=p.reduction_factor)


@PRUNERS.register("none")
def nop(p: PrunerSpec) -> Any:
    import optuna

    return optuna.pruners.NopPruner()
