"""Policy as code: every candidate gets a verdict, every rejection names its rule; bad policy files say what to fix."""

from __future__ import annotations

import pytest
import yaml

from hybridtrain.errors import SpecError
from hybridtrain.placement.cost_model import CostModel
from hybridtrain.placement.policy import Policy, Verdict, capacity_options
from hybridtrain.placement.request import DataTier, ResourceRequest
from hybridtrain.specs.job import Sensitivity
from hybridtrain.specs.sites import CapacityClass, SitesCatalog
from tests.fixtures.placement_cases import CLOUD_EU, CLOUD_PRICEY, CLOUD_US, CLOUD_V100, NOW, ONPREM, SITES
from tests.fixtures.workspaces import ROOT


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.load(ROOT / "deployments" / "policy.yaml", SitesCatalog.load(ROOT / "deployments" / "sites.yaml"))


def request(**kw) -> ResourceRequest:
    base = dict(job="j", gpus=1, run_hours=2.0, max_run_hours=4.0, submitted_at=NOW, data_site="onprem-dc1",
                dataset_bytes=10 * 10**9, sensitivity=Sensitivity.internal, job_class="standard")
    base.update(kw)
    return ResourceRequest(**base)


def verdict(policy, req, s, klass=None, **kw) -> Verdict:
    return policy.evaluate(req, s, klass, **kw)


# Each case: (reason it exists, request, site, capacity class, rule expected to reject or None for allowed)
STATIC_CASES = [
    ("internal data may go anywhere", dict(), CLOUD_US, None, None),
    ("restricted data never leaves on-prem", dict(sensitivity=Sensitivity.restricted), CLOUD_EU, None,
     "rules[0] (restricted data never leaves on-prem)"),
    ("restricted data may stay on-prem", dict(sensitivity=Sensitivity.restricted), ONPREM, None, None),
    ("confidential only in the EU", dict(sensitivity=Sensitivity.confidential), CLOUD_US, None,
     "rules[1] (confidential data only in EU)"),
    ("confidential is fine in an EU cloud", dict(sensitivity=Sensitivity.confidential), CLOUD_EU, None, None),
    ("curated data stays at its site", dict(tier=DataTier.curated), CLOUD_EU, None,
     "rules[2] (only approved data leaves its site)"),
    ("the spec's residency wins over a permissive rule", dict(residency=("EU",)), CLOUD_US, None,
     "spec data_policy.residency"),
    ("GPU type mismatch", dict(gpu_type="A100"), CLOUD_V100, None, "spec resources.gpu_type"),
    ("production only on A100/H100", dict(job_class="production"), CLOUD_V100, None,
     "rules[3] (production jobs only on A100 or H100)"),
    ("more GPUs than the site has", dict(gpus=16), ONPREM, None, "spec resources.gpus"),
    ("spot is not for the standard class", dict(), CLOUD_EU, CapacityClass.opportunistic,
     "job_classes.standard.capacity_classes"),
    ("spot is fine for opportunistic jobs", dict(job_class="opportunistic"), CLOUD_EU, CapacityClass.opportunistic,
     None),
    ("price cap per GPU-hour", dict(), CLOUD_PRICEY, None, "rules[4] (cloud GPU price cap)"),
    ("a pinned job goes nowhere else", dict(pinned_site="cloud-eu"), ONPREM, None, "spec placement.site"),
]


@pytest.mark.parametrize("why,kw,target,klass,rule", STATIC_CASES, ids=[c[0] for c in STATIC_CASES])
def test_site_rules(policy, why, kw, target, klass, rule):
    v = verdict(policy, request(**kw), target, klass)
    if rule is None:
        assert v.allowed, f"{why}: {v}"
    else:
        assert not v.allowed and v.rule == rule, f"{why}: {v}"
        assert v.reason  # the numbers/names behind it


def estimate(req, s, klass=None):
    return CostModel().estimate(req, s, now=NOW, capacity_class=klass, data_site=ONPREM)


COST_CASES = [
    ("the spec's budget", dict(budget_usd=5.0, gpus=4), "spec budget_usd", None),
    ("the per-job cap of the policy", dict(gpus=8, run_hours=20.0, max_run_hours=20.0), "budgets.per_job_usd", None),
    ("the team's remaining budget", dict(team="growth", gpus=2), "budgets.teams.growth", {"growth": 1995.0}),
    ("the egress cap", dict(dataset_bytes=3000 * 10**9), "rules[5] (data movement cap per job)", None),
    ("a small job passes every cap", dict(), None, {"growth": 10.0}),
]


@pytest.mark.parametrize("why,kw,rule,spend", COST_CASES, ids=[c[0] for c in COST_CASES])
def test_cost_caps(policy, why, kw, rule, spend):
    req = request(**kw)
    v = verdict(policy, req, CLOUD_EU, estimate=estimate(req, CLOUD_EU), team_spend=spend)
    if rule is None:
        assert v.allowed, f"{why}: {v}"
    else:
        assert not v.allowed and v.rule == rule, f"{why}: {v}"
        assert "$" in v.reason or "GB" in v.reason


def test_without_an_estimate_cost_caps_are_not_checked(policy):
    req = request(budget_usd=0.01)
    assert verdict(policy, req, CLOUD_EU).allowed
    assert not verdict(policy, req, CLOUD_EU, estimate=estimate(req, CLOUD_EU)).allowed


def test_evaluate_all_lists_every_candidate_with_its_rule(policy):
    req = request(sensitivity=Sensitivity.confidential)
    verdicts = policy.evaluate_all(req, SITES)
    assert [(v.site, v.capacity_class) for v in verdicts] == [(s.name, k) for s in SITES for k in capacity_options(s)]
    rejected = {(v.site, v.capacity_class.value): v.rule for v in verdicts if not v.allowed}
    assert rejected[("cloud-us", "burst")] == "rules[1] (confidential data only in EU)"
    assert rejected[("cloud-eu", "opportunistic")] == "job_classes.standard.capacity_classes"
    assert "rejected by rules[1]" in str(next(v for v in verdicts if v.site == "cloud-us"))


def test_strategy_and_job_class_come_from_the_policy(policy):
    assert policy.strategy_for(request()) == "onprem_first"
    assert policy.strategy_for(request(job_class="opportunistic")) == "deadline_spot"
    assert policy.strategy_for(request(strategy="fastest")) == "fastest"
    assert policy.strategy("deadline_spot").max_onprem_wait_hours == 1
    with pytest.raises(SpecError) as info:
        policy.job_class_of(request(job_class="gold"))
    assert "unknown job class 'gold'" in str(info.value) and "opportunistic" in str(info.value)


def test_json_schema_is_generated_with_descriptions():
    schema = Policy.model_json_schema()
    assert schema["properties"]["wait_slo_hours"]["description"]
    rule = schema["$defs"]["Rule"]
    assert rule["additionalProperties"] is False and rule["properties"]["stay_at_data_site"]["description"]


# --- invalid policy files -------------------------------------------------------------------------------


def write(tmp_path, data) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return str(path)


def base() -> dict:
    return yaml.safe_load((ROOT / "deployments" / "policy.yaml").read_text())


def load_error(path, sites=None) -> SpecError:
    with pytest.raises(SpecError) as info:
        Policy.load(path, sites)
    return info.value


def test_unknown_field_is_located_by_path_and_line(tmp_path):
    data = base()
    data["rules"][1]["jurisdiction"] = ["EU"]  # typo for jurisdictions
    err = load_error(write(tmp_path, data))
    (problem,) = err.problems
    assert problem.path == "rules[1].jurisdiction" and "unknown field" in problem.message
    assert problem.line is not None


def test_every_semantic_problem_is_reported_at_once(tmp_path):
    data = base()
    data["default_strategy"] = "cheapest_first"
    data["default_job_class"] = "gold"
    data["job_classes"]["opportunistic"]["capacity_classes"] = ["fixed", "opportunistic"]
    data["rules"].append({"name": "does nothing"})
    data["rules"].append({"name": "unknown site", "sites": ["cloud-mars"]})
    data["strategy_options"]["deadline_spot"]["max_wait"] = 2
    err = load_error(write(tmp_path, data), SitesCatalog.load(ROOT / "deployments" / "sites.yaml"))
    by_path = {p.path: p.message for p in err.problems}
    assert "choose one of: cheapest, deadline_spot, fastest, onprem_first (default)" in by_path["default_strategy"]
    assert "'gold' is not in job_classes" in by_path["default_job_class"]
    assert "needs burst" in by_path["job_classes.opportunistic.capacity_classes"]
    assert "constrains nothing" in by_path["rules[6]"]
    assert "unknown site 'cloud-mars'" in by_path["rules[7].sites[0]"]
    assert "deadline_spot takes: max_onprem_wait_hours, max_cost_ratio" in by_path["strategy_options.deadline_spot.max_wait"]


def test_wrong_types_and_versions_are_refused(tmp_path):
    data = base()
    data["apiVersion"] = "hybridtrain/v2"
    data["rules"][0]["site_kinds"] = ["datacenter"]
    data["budgets"]["per_job_usd"] = -5
    err = load_error(write(tmp_path, data))
    paths = {p.path for p in err.problems}
    assert {"apiVersion", "rules[0].site_kinds[0]", "budgets.per_job_usd"} <= paths


def test_unparsable_and_missing_files_say_so(tmp_path):
    assert "not valid YAML" in str(load_error(write(tmp_path, "rules: [\n")))
    assert "file not found" in str(load_error(str(tmp_path / "nope.yaml")))
