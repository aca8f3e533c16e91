"""Job spec validation: every problem reported with its field path and line; valid specs load."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from hybridtrain.errors import SpecError
from hybridtrain.specs.job import json_schema, load_spec, parse_spec
from hybridtrain.specs.sites import SitesCatalog

ROOT = Path(__file__).resolve().parents[2]
CHURN = ROOT / "jobs" / "churn.yaml"
SITES = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")


def churn() -> dict:
    return yaml.safe_load(CHURN.read_text())


def write(tmp_path: Path, data: dict | str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return p


def problems(exc: pytest.ExceptionInfo[SpecError]) -> dict[str, str]:
    return {p.path: p.message for p in exc.value.problems}


def test_example_spec_is_valid_against_the_sites_catalog():
    spec = load_spec(CHURN, SITES)
    assert spec.name == "churn"
    assert spec.deadline == timedelta(hours=6)
    assert spec.approved_type("date_of_birth").value == "int"
    assert spec.placement.site == "cloud-eu"


def test_unknown_field_is_named_with_its_line(tmp_path):
    text = CHURN.read_text().replace("  epochs: 4\n", "  epochs: 4\n  epoch: 5\n")
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, text), SITES)
    [p] = exc.value.problems
    assert p.path == "model.epoch"
    assert "unknown field" in p.message
    assert p.line == text.splitlines().index("  epoch: 5") + 1


def test_every_problem_is_reported_at_once(tmp_path):
    data = churn()
    data["schema"]["label"] = "left"
    data["split"] = {"train": 0.7, "val": 0.1, "test": 0.1, "seed": 1}
    data["model"]["features"]["numeric"].append("phone")
    data["evaluation"]["thresholds"]["speed"] = 3
    data["placement"]["site"] = "moon-base"
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, data), SITES)
    found = problems(exc)
    assert "not in schema.columns" in found["schema.label"]
    assert "must be 1.0" in found["split"]
    assert "dropped" in found["model.features.numeric[10]"]
    assert "unknown metric" in found["evaluation.thresholds.speed"]
    assert "known: onprem-dc1, cloud-eu" in found["placement.site"]
    assert len(found) == 5
    assert str(tmp_path / "job.yaml") in str(exc.value)


def test_missing_and_mistyped_fields(tmp_path):
    data = churn()
    del data["registry"]
    data["model"]["epochs"] = "many"
    data["sync"]["sample_fraction"] = 1.5
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, data))
    found = problems(exc)
    assert found["registry"] == "required field is missing"
    assert "integer" in found["model.epochs"]
    assert "less than or equal to 1" in found["sync.sample_fraction"]


def test_hash_read_as_a_number_says_to_quote_it(tmp_path):
    import re

    text = re.sub(r'(?m)^  md5: .*$', "  md5: 12345678901234567890123456789012", CHURN.read_text(), count=1)
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, text))
    assert "put it in quotes" in problems(exc)["dataset.md5"]


def test_treatment_rules(tmp_path):
    data = churn()
    data["sensitive"]["columns"]["postcode"] = {"treatment": "generalize", "level": "year"}
    data["sensitive"]["columns"]["phone"] = {"treatment": "keep"}
    data["sensitive"]["columns"]["full_name"] = {"treatment": "drop", "level": "outward"}
    data["sensitive"]["columns"]["shoe_size"] = {"treatment": "drop"}
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, data))
    found = problems(exc)
    assert "prefix:N" in found["sensitive.columns.postcode.level"]
    assert "say why in reason" in found["sensitive.columns.phone.reason"]
    assert "generalize only" in found["sensitive.columns.full_name.level"]
    assert "not in schema.columns" in found["sensitive.columns.shoe_size"]


def test_numeric_feature_must_stay_numeric_after_treatment(tmp_path):
    data = churn()
    data["sensitive"]["columns"]["date_of_birth"] = {"treatment": "generalize", "level": "year_month"}
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, data))
    assert "list it under categorical" in problems(exc)["model.features.numeric[9]"]


def test_deadline_forms():
    data = churn()
    data["deadline"] = "90m"
    assert parse_spec(data).deadline == timedelta(minutes=90)
    data["deadline"] = "2026-12-01T18:00:00Z"
    assert parse_spec(data).deadline.isoformat() == "2026-12-01T18:00:00+00:00"
    data["deadline"] = "2026-12-01T18:00:00"
    with pytest.raises(SpecError) as exc:
        parse_spec(data)
    assert "timezone" in problems(exc)["deadline"]


def test_spec_hash_is_stable_and_sensitive_to_content():
    a, b = parse_spec(churn()), parse_spec(churn())
    assert a.spec_hash() == b.spec_hash()
    data = churn()
    data["model"]["epochs"] = 5
    assert parse_spec(data).spec_hash() != a.spec_hash()
    assert parse_spec(a.to_dict()) == a  # round-trips through its dict form


def test_not_yaml_and_empty_and_missing_files(tmp_path):
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, "model: [unclosed\n"))
    assert "not valid YAML" in str(exc.value)
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, ""))
    assert "empty" in str(exc.value)
    with pytest.raises(SpecError) as exc:
        load_spec(tmp_path / "nope.yaml")
    assert "file not found" in str(exc.value)


def test_json_schema_is_generated_from_the_models():
    schema = json_schema()
    assert set(schema["required"]) >= {"apiVersion", "metadata", "dataset", "schema", "model", "registry"}
    assert schema["properties"]["schema"]["$ref"].endswith("DataSchema")
    assert schema["additionalProperties"] is False
