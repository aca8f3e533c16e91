"""The spec's ``promotion`` section: gates, cost limit, approval and release targets, every mistake reported
(checked against the gate and target registries by ``hybridtrain.validation``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hybridtrain.errors import SpecError
from hybridtrain.specs.job import json_schema
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.validation import parse_job

ROOT = Path(__file__).resolve().parents[2]
SITES = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")


def with_promotion(promotion: dict) -> dict:
    data = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    data["promotion"] = promotion
    return data


def problems(promotion: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        parse_job(with_promotion(promotion), sites=SITES)
    return {p.path: p.message for p in exc.value.problems}


def test_defaults_evaluate_every_gate_and_release_nowhere():
    data = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    data.pop("promotion", None)  # the demo spec sets its own; these are the defaults
    spec = parse_job(data, sites=SITES)
    assert spec.promotion.gates is None and spec.promotion.max_cost_usd is None
    assert spec.promotion.require_approval is False and spec.promotion.release_targets == []


def test_a_full_promotion_section_is_valid():
    spec = parse_job(with_promotion({
        "gates": ["lineage", "signature", "thresholds", "not_worse", "cost", "rollback_target", "approval"],
        "max_cost_usd": 20, "require_approval": True,
        "release_targets": [{"name": "onprem-serving", "path": "/srv/models"},
                            {"name": "cloud-serving", "kind": "object_store", "site": "cloud-eu"},
                            {"name": "edge-1", "kind": "object_store", "site": "onprem-dc1", "prefix": "edge/1"}],
    }), sites=SITES)
    assert [t.kind for t in spec.promotion.release_targets] == ["directory", "object_store", "object_store"]
    assert spec.promotion.release_targets[1].prefix == "releases"
    assert parse_job(spec.to_dict()) == spec


def test_gate_mistakes_are_each_reported():
    found = problems({"gates": ["lineage", "vibes", "lineage"], "max_cost_usd": 5, "require_approval": True})
    assert found["promotion.gates[1]"].startswith("unknown promotion gate 'vibes'; choose one of: lineage, signature")
    assert found["promotion.gates[2]"] == "gate 'lineage' is listed twice"
    assert found["promotion.max_cost_usd"] == "is set, but the cost gate is not in promotion.gates: add it"
    assert found["promotion.require_approval"] == "is true, but the approval gate is not in promotion.gates: add it"
    assert "an empty list would promote without any check" in problems({"gates": []})["promotion.gates"]


def test_release_target_mistakes_are_each_reported():
    found = problems({"release_targets": [
        {"name": "a", "kind": "ftp"},
        {"name": "b"},
        {"name": "c", "kind": "object_store", "path": "x"},
        {"name": "d", "kind": "object_store", "site": "mars-1"},
        {"name": "d", "path": "x", "site": "cloud-eu"},
    ]})
    assert found == {
        "promotion.release_targets[0].kind": "unknown release target kind 'ftp'; choose one of: directory (default), "
                                             "edge, object_store",
        "promotion.release_targets[1].path": "a directory target needs path: the serving directory",
        "promotion.release_targets[2].site": "an object_store target needs site: the site whose store holds the "
                                             "releases",
        "promotion.release_targets[2].path": "applies to directory targets; an object_store target takes site and "
                                             "prefix",
        "promotion.release_targets[3].site": "unknown site 'mars-1'; known: onprem-dc1, cloud-eu",
        "promotion.release_targets[4].name": "target name 'd' is used twice; names must be unique",
        "promotion.release_targets[4].site": "applies to object_store targets; a directory target takes path",
    }


def test_field_level_mistakes_are_refused_by_the_model():
    found = problems({"max_cost_usd": -1, "approve": True, "release_targets": [{"name": "Bad Name", "path": "x"}]})
    assert "promotion.max_cost_usd" in found and "promotion.approve" in found
    assert "promotion.release_targets[0].name" in found


def test_the_schema_documents_the_promotion_section():
    schema = json_schema()
    promotion = schema["$defs"]["PromotionSpec"]["properties"]
    assert {"gates", "max_cost_usd", "require_approval", "approval_timeout_s", "release_targets"} == set(promotion)
    assert "ledger total" in promotion["max_cost_usd"]["description"]
    assert schema["$defs"]["PromotionSpec"]["additionalProperties"] is False
