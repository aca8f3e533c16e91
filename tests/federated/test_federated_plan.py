"""Federated specs and planning: validate and plan through the CLI, the mode decision, FedAvg, the feature merge, the site split."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from hybridtrain.errors import SpecError
from tests.fixtures.federated_jobs import DATA_SITES, federated_spec


def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args], cwd=root, capture_output=True,
                          text=True, timeout=180, env={**__import__("os").environ, "HYBRIDTRAIN_HOME": str(root)})


def load(root: Path, path: Path):
    from hybridtrain.specs.job import load_spec
    from hybridtrain.specs.sites import SitesCatalog

    return load_spec(path, SitesCatalog.load(root / "deployments" / "sites.yaml"))


def decide(root: Path, spec):
    from datetime import UTC, datetime

    from hybridtrain.federated.planning import decide_mode
    from hybridtrain.placement.policy import Policy
    from hybridtrain.specs.sites import SitesCatalog

    sites = SitesCatalog.load(root / "deployments" / "sites.yaml")
    return decide_mode(spec, sites, Policy.load(root / "deployments" / "policy.yaml", sites), datetime.now(UTC))


def test_the_split_sample_data_is_tracked_at_each_site_and_non_iid(fed_workspace):
    root, parts = fed_workspace
    assert [p["site"] for p in parts] == DATA_SITES
    frames = [pd.read_csv(root / p["path"]) for p in parts]
    for site, p in zip(DATA_SITES, parts, strict=True):
        store = root / ".hybridtrain" / "stores" / site / "dvc"
        assert any(store.rglob(p["md5"][2:])), f"{site}'s part is not in its own store"
    regions = [set(f["region"]) for f in frames]
    assert not (regions[0] & regions[1]) and not (regions[1] & regions[2])
    rates = [f["churned"].mean() for f in frames]
    assert rates[0] > rates[1] > rates[2]  # each further site keeps fewer churners
    assert len({len(f) for f in frames}) == 3


def test_validate_names_each_federation_mistake(fed_workspace):
    root, parts = fed_workspace
    path = federated_spec(root, parts, name="badfed")
    data = yaml.safe_load(path.read_text())
    data["dataset"]["sites"][1]["site"] = "onprem-dc2"  # listed twice
    data["dataset"]["sites"][0]["path"] = parts[0]["path"]  # same path as the first part
    data["training"]["mode"] = "centralized"
    data["placement"] = {"site": "onprem-dc1"}
    data.setdefault("resources", {})["nodes"] = 2  # a site's round trains on one host
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = cli(root, "validate", str(path))
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join((out.stdout + out.stderr).split())
    for field in ("dataset.sites[1].site", "dataset.sites[0].path", "training.mode", "placement.site",
                  "resources.nodes"):
        assert field in text, (field, text)
    assert "Traceback" not in text
    data = yaml.safe_load(federated_spec(root, parts, name="badfed", min_sites=4).read_text())
    with pytest.raises(SpecError, match="training.federated.min_sites.*only 3 site"):
        from hybridtrain.specs.job import parse_spec

        parse_spec(data)


def test_plan_picks_federated_and_names_the_rule_that_refuses_centralized(fed_workspace):
    root, parts = fed_workspace
    path = federated_spec(root, parts)
    out = cli(root, "plan", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "federated across onprem-dc1, onprem-dc2, onprem-dc3" in text
    assert "aggregation at onprem-dc1" in text
    assert "centralized training is not allowed" in text
    # Every on-prem site is refused by the stay rule, the cloud site by the restricted-data rule.
    assert "rules[6] (restricted data stays at its site)" in text
    assert "cloud-eu: rules[0] (restricted data never leaves on-prem)" in text


def test_auto_without_a_refusing_rule_still_federates_split_data_and_says_where_centralized_could_go(fed_workspace):
    root, parts = fed_workspace
    spec = load(root, federated_spec(root, parts, name="openfed"))
    spec = spec.model_copy(update={"data_policy": spec.data_policy.model_copy(update={"sensitivity": "internal"})})
    mode = decide(root, spec)
    assert mode.mode == "federated" and mode.aggregation_site == "onprem-dc1"
    assert any("split across 3 sites" in r for r in mode.reasons)
    assert any("would be allowed at onprem-dc1" in r for r in mode.reasons)
    assert not mode.centralized_rejections


def test_a_single_site_job_stays_centralized(fed_workspace):
    root, _ = fed_workspace
    spec = load(root, root / "jobs" / "churn.yaml")
    assert decide(root, spec).mode == "centralized"


def test_federated_refused_when_updates_may_not_reach_the_aggregator(fed_workspace):
    root, parts = fed_workspace
    spec = load(root, federated_spec(root, parts, name="cloudagg", aggregation_site="cloud-eu"))
    with pytest.raises(SpecError) as err:
        decide(root, spec)
    text = str(err.value)
    assert "may not go to the aggregation site cloud-eu" in text and "rules[0]" in text


def test_fedavg_is_the_row_weighted_mean_and_refuses_a_foreign_update():
    from hybridtrain.federated.aggregation import fedavg

    like = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
    a = {"w": torch.ones(2, 2), "b": torch.tensor([1.0, 2.0])}
    b = {"w": torch.full((2, 2), 4.0), "b": torch.tensor([4.0, 8.0])}
    out = fedavg({"x": (a, 100), "y": (b, 300)}, like)
    assert torch.allclose(out["w"], torch.full((2, 2), 3.25))
    assert torch.allclose(out["b"], torch.tensor([3.25, 6.5]))
    with pytest.raises(SpecError, match="z"):
        fedavg({"x": (a, 1), "z": ({"w": torch.ones(3, 3), "b": torch.ones(2)}, 1)}, like)


def test_merged_featurizer_scales_like_one_fitted_on_the_union():
    from hybridtrain.federated.features import SiteFeatureStats, merge
    from hybridtrain.specs.job import FeatureSpec
    from hybridtrain.training.featurizer import Featurizer

    rng = np.random.default_rng(0)
    parts = [pd.DataFrame({"x": rng.normal(loc, 2.0, n), "c": rng.choice(cats, n)})
             for loc, n, cats in ((0.0, 500, ["a", "b"]), (5.0, 1500, ["b", "c"]))]
    feats = FeatureSpec(numeric=["x"], categorical=["c"])
    stats = [SiteFeatureStats(site=str(i), rows=len(p), featurizer=Featurizer.fit(p, feats).to_dict())
             for i, p in enumerate(parts)]
    merged, union = merge(stats), Featurizer.fit(pd.concat(parts), feats)
    assert merged.numeric[0].mean == pytest.approx(union.numeric[0].mean)
    assert merged.numeric[0].std == pytest.approx(union.numeric[0].std)
    assert merged.categorical[0].vocabulary == ("a", "b", "c")


def test_secure_aggregation_is_planned_and_refused_where_it_cannot_hold(fed_workspace):
    from hybridtrain.specs.federation_checks import federation_problems
    from hybridtrain.specs.sites import SitesCatalog

    root, parts = fed_workspace
    spec = load(root, federated_spec(root, parts, name="securefed", secure_aggregation=True))
    assert any(r.startswith("secure aggregation (training.federated.secure_aggregation)")
               for r in decide(root, spec).reasons)
    sites = SitesCatalog.load(root / "deployments" / "sites.yaml")
    assert federation_problems(spec, sites) == []
    # With one data site the "sum" would be that site's update.
    single = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"sites": []}),
                                     "training": spec.training.model_copy(update={"mode": "federated"})})
    problems = federation_problems(single, sites)
    assert [p.path for p in problems] == ["training.federated.min_sites", "training.federated.secure_aggregation"]
    assert "needs at least 2 data sites" in problems[1].message
