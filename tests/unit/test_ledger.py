"""CostLedger: per-version costs checkable by hand; totals equal the sum of the run records (also under hypothesis)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from rich.console import Console

from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.errors import SpecError
from hybridtrain.governance.ledger import (
    CATEGORIES,
    UNVERSIONED,
    AttemptRecord,
    CostLedger,
    RunRecord,
    StorageRecord,
    render_table,
    write_chart,
)
from hybridtrain.specs.sites import SitesCatalog

ROOT = Path(__file__).resolve().parents[2]
SITES = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
ONPREM = SITES.get("onprem-dc1").gpu_hour_price  # amortized: capex + opex over 4 years at 65 % use, plus power
T0 = datetime(2026, 5, 1, 12, tzinfo=UTC)


def transfer(cost: float, nbytes: int = 1_000_000_000) -> TransferRecord:
    return TransferRecord(source="onprem-dc1", destination="cloud-eu", what="data/approved/churn@x", bytes=nbytes,
                          files=3, seconds=2.0, egress_per_gb=0.0, cost_usd=cost, at=T0)


def run(version: str | None, at: datetime, attempts, transfers=(), storage=(), model="churn-classifier") -> RunRecord:
    return RunRecord(model=model, version=version, run_id=f"run-{version}-{at:%H%M%S%f}", finished_at=at,
                     attempts=[AttemptRecord(**a) for a in attempts], transfers=list(transfers), storage=list(storage))


def test_one_version_checked_by_hand():
    record = run("3", T0, [
        {"site": "cloud-eu", "capacity_class": "opportunistic", "gpus": 1, "seconds": 1800, "outcome": "preempted"},
        {"site": "cloud-eu", "capacity_class": "burst", "gpus": 2, "seconds": 900, "outcome": "succeeded"},
        {"site": "onprem-dc1", "capacity_class": "fixed", "gpus": 1, "seconds": 3600, "outcome": "failed"},
    ], transfers=[transfer(0.09)], storage=[StorageRecord(kind="checkpoint", site="cloud-eu", bytes=2_000_000_000),
                                            StorageRecord(kind="bundle", site="onprem-dc1", bytes=500_000_000,
                                                          months=6)])
    line = CostLedger(SITES, 0.02).for_model([record]).line("3")
    c = line.cost
    assert c.on_demand == pytest.approx(2 * 0.25 * 4.0966)           # 2 GPUs × 0.25 h × on-demand list price
    assert c.spot == 0 and c.onprem == 0
    assert c.wasted == pytest.approx(0.5 * 0.98 + 1 * ONPREM)         # the preempted spot half hour + failed on-prem hour
    assert c.transfer == pytest.approx(0.09)
    assert c.storage == pytest.approx(2 * 0.02 * 1 + 0.5 * 0.02 * 6)  # GB × $/GB-month × months
    assert c.gpu_hours == pytest.approx(0.5 + 0.5 + 1) and c.wasted_gpu_hours == pytest.approx(1.5)
    assert line.total_usd == pytest.approx(2.0483 + 0.49 + ONPREM + 0.09 + 0.1)
    assert line.tags()["hybridtrain.cost.total_usd"] == f"{line.total_usd:.6f}"
    assert ONPREM == pytest.approx((18000 + 1200 * 4) / (4 * 8760) / 0.65 + 0.6 * 0.22)  # ≈ $1.13 per GPU-hour


def test_a_price_recorded_by_the_attempt_wins_over_the_catalog():
    record = run("1", T0, [{"site": "cloud-eu", "capacity_class": "opportunistic", "gpus": 4, "seconds": 3600,
                            "outcome": "succeeded", "price_per_gpu_hour": 1.5}])
    assert CostLedger(SITES).for_model([record]).totals.spot == pytest.approx(6.0)


def test_versions_are_lines_in_time_order_and_unregistered_runs_are_unversioned():
    records = [
        run("2", T0 + timedelta(days=2), [{"site": "onprem-dc1", "capacity_class": "fixed", "gpus": 1,
                                          "seconds": 7200, "outcome": "succeeded"}]),
        run("1", T0, [{"site": "onprem-dc1", "capacity_class": "fixed", "gpus": 1, "seconds": 3600,
                       "outcome": "succeeded"}]),
        run(None, T0 + timedelta(days=1), [{"site": "cloud-eu", "capacity_class": "burst", "gpus": 1,
                                            "seconds": 3600, "outcome": "failed"}]),
        run("2", T0 + timedelta(days=3), [], transfers=[transfer(1.0)]),
        run("9", T0, [], model="other-model"),
    ]
    book = CostLedger(SITES).for_model(records, "churn-classifier")
    assert [(line.version, line.runs) for line in book.lines] == [("1", 1), (UNVERSIONED, 1), ("2", 2)]
    assert book.line("2").cost.onprem == pytest.approx(2 * ONPREM) and book.line("2").cost.transfer == 1.0
    assert book.line(UNVERSIONED).cost.wasted == pytest.approx(4.0966)
    assert book.runs == 4
    with pytest.raises(ValueError, match="several models"):
        CostLedger(SITES).for_model(records)


def test_unknown_sites_and_missing_spot_prices_say_what_to_do():
    gone = run("1", T0, [{"site": "mars-1", "capacity_class": "burst", "gpus": 1, "seconds": 1, "outcome": "failed"}])
    with pytest.raises(SpecError) as exc:
        CostLedger(SITES).for_model([gone])
    assert "ran at site 'mars-1', which the catalog no longer lists" in str(exc.value)
    assert "record price_per_gpu_hour" in str(exc.value)
    onprem_spot = run("1", T0, [{"site": "onprem-dc1", "capacity_class": "opportunistic", "gpus": 1, "seconds": 1,
                                 "outcome": "succeeded"}])
    with pytest.raises(SpecError, match="used spot capacity at onprem-dc1, which has no spot price"):
        CostLedger(SITES).for_model([onprem_spot])
    with pytest.raises(SpecError, match="no storage price per GB-month for this site"):
        CostLedger(SITES, {"onprem-dc1": 0.01}).for_model([run("1", T0, [], storage=[
            StorageRecord(kind="artifact", site="cloud-eu", bytes=1)])])


def test_run_records_round_trip_as_json_and_refuse_unknown_fields():
    record = run("5", T0, [{"site": "cloud-eu", "capacity_class": "burst", "gpus": 1, "seconds": 10.5,
                            "outcome": "succeeded"}], transfers=[transfer(0.5)],
                 storage=[StorageRecord(kind="checkpoint", site="cloud-eu", bytes=10)])
    assert RunRecord.model_validate_json(record.model_dump_json()) == record
    data = record.model_dump(mode="json")
    data["attempts"][0]["gpu"] = 1
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        RunRecord.model_validate(data)


def test_the_table_and_the_chart(tmp_path):
    records = [run(str(v), T0 + timedelta(days=v), [{"site": "cloud-eu", "capacity_class": "burst", "gpus": 1,
                                                      "seconds": 600 * v, "outcome": "succeeded"}],
                   transfers=[transfer(0.01 * v)]) for v in (1, 2, 3)]
    book = CostLedger(SITES).for_model(records)
    console = Console(width=200, record=True)
    console.print(render_table(book))
    text = console.export_text()
    assert "Cost ledger of churn-classifier (USD)" in text
    assert f"{book.totals.total:,.4f}" in text and f"{book.line('2').total_usd:,.4f}" in text
    png = write_chart(book, tmp_path / "out" / "ledger.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000


# -- totals = the sum of the run records, for any records -------------------------------------------

attempts = st.fixed_dictionaries({
    "site": st.sampled_from(["onprem-dc1", "cloud-eu"]),
    "capacity_class": st.sampled_from(["fixed", "burst", "opportunistic"]),
    "gpus": st.integers(0, 16),
    "seconds": st.floats(0, 7 * 24 * 3600, allow_nan=False),
    "outcome": st.sampled_from(["succeeded", "preempted", "failed"]),
    "price_per_gpu_hour": st.one_of(st.none(), st.floats(0, 50, allow_nan=False)),
}).filter(lambda a: not (a["site"] == "onprem-dc1" and a["capacity_class"] == "opportunistic"
                         and a["price_per_gpu_hour"] is None))
records = st.lists(st.builds(
    lambda version, day, atts, costs, sizes: run(version, T0 + timedelta(hours=day), atts,
                                                 transfers=[transfer(c) for c in costs],
                                                 storage=[StorageRecord(kind="checkpoint", site="cloud-eu", bytes=b,
                                                                        months=m) for b, m in sizes]),
    st.one_of(st.none(), st.sampled_from(["1", "2", "3", "4"])), st.integers(0, 1000), st.lists(attempts, max_size=4),
    st.lists(st.floats(0, 100, allow_nan=False), max_size=3),
    st.lists(st.tuples(st.integers(0, 10**13), st.floats(0, 24, allow_nan=False)), max_size=2),
), max_size=12)


def by_hand(r: RunRecord) -> dict[str, float]:
    """The module docstring's formulas, written out independently of the ledger's code."""
    prices = {("onprem-dc1", "fixed"): ONPREM, ("onprem-dc1", "burst"): ONPREM, ("cloud-eu", "fixed"): 4.0966,
              ("cloud-eu", "burst"): 4.0966, ("cloud-eu", "opportunistic"): 0.98}
    out = dict.fromkeys(CATEGORIES, 0.0)
    for a in r.attempts:
        price = a.price_per_gpu_hour if a.price_per_gpu_hour is not None else prices[(a.site, a.capacity_class.value)]
        usd = a.gpus * a.seconds / 3600 * price
        key = {"fixed": "onprem", "burst": "on_demand", "opportunistic": "spot"}[a.capacity_class.value]
        out[key if a.outcome.value == "succeeded" else "wasted"] += usd
    out["transfer"] = sum(t.cost_usd for t in r.transfers)
    out["storage"] = sum(s.bytes / 1e9 * 0.023 * s.months for s in r.storage)
    return out


@settings(max_examples=150, deadline=None)
@given(records)
def test_totals_equal_the_sum_of_the_run_records(recs):
    book = CostLedger(SITES).for_model(recs, "churn-classifier")
    expected = [by_hand(r) for r in recs]
    for cat in CATEGORIES:
        want = math.fsum(e[cat] for e in expected)
        assert getattr(book.totals, cat) == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert math.fsum(getattr(line.cost, cat) for line in book.lines) == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert book.totals.total == pytest.approx(math.fsum(sum(e.values()) for e in expected), rel=1e-9, abs=1e-9)
    assert sum(line.runs for line in book.lines) == book.runs == len(recs)
