"""DataGates: each reason approved data must not leave its site, named by column or limit (no servers)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hybridtrain.datasets import data_gates
from hybridtrain.datasets.anonymizer import Anonymizer
from hybridtrain.errors import DataError
from tests.fixtures.anonymizer_specs import make_spec

KEY = b"k" * 32


def frame(n: int = 300, **columns) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    base = {"id": [f"c{i}" for i in range(n)], "zip": [f"{10000 + i % 40:05d}" for i in range(n)],
            "feature": rng.normal(size=n), "label": rng.integers(0, 2, n),
            "split": np.array(["train", "val", "test"])[np.arange(n) % 3]}
    base.update(columns)
    return pd.DataFrame(base)


def spec(level: str = "prefix:3", **extra):
    return make_spec({"id": "string", "zip": "string"},
                     {"id": {"treatment": "pseudonym"}, "zip": {"treatment": "generalize", "level": level}}, **extra)


def found(s, df: pd.DataFrame) -> dict[str, str]:
    result = Anonymizer(s, KEY).apply(df)
    return {p.path: p.message for p in data_gates.problems(s, result.frame, result.report)}


def test_clean_data_passes():
    assert found(spec(), frame()) == {}


@pytest.mark.parametrize(("values", "says"), [
    (np.nan, "no values"), (1.5, "constant"),
])
def test_empty_and_constant_features_are_named(values, says):
    assert says in found(spec(), frame(feature=values))["column feature"]


def test_a_single_class_label_is_named():
    assert "only 0" in found(spec(), frame(label=0))["column label"]


def test_too_few_rows_in_a_split():
    df = frame()
    df.loc[df["split"] == "val", "split"] = "train"
    df.loc[df.index[:5], "split"] = "val"
    assert "5 row(s) left in the val split" in found(spec(), df)["split.val"]


def test_suppression_above_the_limit_names_coarser_levels_that_exist():
    s = spec("prefix:4", quasi_identifiers=["zip"], k=30)  # 30 prefixes of 10 rows: every row suppressed
    problems = found(s, frame(zip=[f"{10000 + i:05d}" for i in range(300)]))
    message = problems["sensitive.max_suppressed_fraction"]
    assert "300 of 300 rows" in message and "the limit is 5.0%" in message
    assert "sensitive.columns.zip.level: prefix:3" in message


def test_a_uk_only_level_on_us_zip_codes_is_refused_with_the_fix():
    message = found(spec("area"), frame())["sensitive.columns.zip.level"]
    assert "withheld 300 of 300" in message and "prefix:N" in message


def test_prefix_works_on_any_postal_format():
    df = frame(zip=[["90210-1234", "SW1A 1AA", "75008", "1010 AB"][i % 4] for i in range(300)])
    result = Anonymizer(spec("prefix:2"), KEY).apply(df)
    assert set(result.frame["zip"]) == {"90", "SW", "75", "10"}
    assert result.report.columns["zip"].withheld == 0


def test_check_raises_a_data_error_saying_nothing_was_synced():
    s = spec()
    result = Anonymizer(s, KEY).apply(frame(label=1))
    with pytest.raises(DataError) as exc:
        data_gates.check(s, result.frame, result.report)
    assert "nothing was synced" in str(exc.value)


def test_emails_are_normalised_by_declared_type_not_by_column_name(tmp_path):
    from hybridtrain.datasets.preprocess import CleanReport, Preprocessor
    from hybridtrain.specs.job import parse_spec

    s = parse_spec({
        "apiVersion": "hybridtrain/v1", "metadata": {"name": "unit"},
        "dataset": {"path": "data/raw/unit.csv", "md5": "0" * 32, "site": "onprem-dc1"},
        "schema": {"columns": {"id": "string", "contact": "email", "email_note": "string", "feature": "float",
                               "label": "int"}, "label": "label", "entity_key": "id"},
        "model": {"features": {"numeric": ["feature"]}}, "registry": {"model_name": "unit"},
    })
    df = pd.DataFrame({"id": ["a", "b"], "contact": [" Ann@X.COM ", "bob@y.org"],
                       "email_note": ["KEEP Case", "x"], "feature": [1.0, 2.0], "label": [0, 1]})
    cleaned = Preprocessor(s).clean(df.copy(), CleanReport())
    assert list(cleaned["contact"]) == ["ann@x.com", "bob@y.org"]
    assert list(cleaned["email_note"]) == ["KEEP Case", "x"]  # its name says email; its type does not
