"""Catalog, policy and plan-option values that used to pass as "ok" and then broke planning are refused.

Each refusal names the field (with its line) or the option, says the fix, exits 2 and prints no
traceback: an infinite price planned as an "allowed" candidate costing nan, a bandwidth of 1e-300
crashed plan with an OverflowError, a NaN team budget switched the cap off, ``--queue ...@nan``
ended in a datetime traceback, ``--spot SITE=0.5/nan`` priced spot like on-demand.
"""

from __future__ import annotations

import math

import pytest
import yaml
from typer.testing import CliRunner

from hybridtrain.cli.placement import parse_queue, parse_spot, register
from hybridtrain.errors import SpecError
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.spot_market import SpotOutlook
from hybridtrain.specs.sites import Site, SitesCatalog, SshHost
from tests.fixtures.workspaces import ROOT

SITES_FILE = ROOT / "deployments" / "sites.yaml"
POLICY_FILE = ROOT / "deployments" / "policy.yaml"
NOW = "2026-05-01T12:00:00Z"


def sites_data() -> dict:
    return yaml.safe_load(SITES_FILE.read_text())


def policy_data() -> dict:
    return yaml.safe_load(POLICY_FILE.read_text())


def write(tmp_path, name: str, data: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def catalog_problems(tmp_path, mutate) -> list:
    data = sites_data()
    mutate(data)
    with pytest.raises(SpecError) as info:
        SitesCatalog.load(write(tmp_path, "sites.yaml", data))
    return info.value.problems


def assert_problem(problems, path: str, words: str) -> None:
    assert any(p.path == path and words in p.message and p.line is not None for p in problems), problems


# --- sites.yaml -------------------------------------------------------------------------------------------


def set_host(site: int, **host):
    def mutate(d):
        d["sites"][site]["hosts"] = [{"hostname": "gpu1", "username": "train", "gpus": 8, **host}]
    return mutate


@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (lambda d: d["sites"][1].update(price_per_gpu_hour=math.inf), "sites[1].price_per_gpu_hour", "finite"),
        (lambda d: d["sites"][1].update(spot_price_per_gpu_hour=math.inf), "sites[1].spot_price_per_gpu_hour",
         "finite"),
        (lambda d: d["sites"][1].update(spot_price_per_gpu_hour=math.nan), "sites[1].spot_price_per_gpu_hour",
         "finite"),
        (lambda d: d["sites"][1].update(egress_per_gb=math.inf), "sites[1].egress_per_gb", "finite"),
        (lambda d: d["sites"][1].update(bandwidth_mbps=1e-300), "sites[1].bandwidth_mbps", "greater than or equal"),
        (lambda d: d["sites"][1].update(bandwidth_mbps=math.inf), "sites[1].bandwidth_mbps", "finite"),
        (lambda d: d["sites"][0]["onprem_cost"].update(lifetime_years=math.inf), "sites[0].onprem_cost.lifetime_years",
         "finite"),
        (lambda d: d["sites"][0]["onprem_cost"].update(lifetime_years=1e-300), "sites[0].onprem_cost",
         "check capex_per_gpu_usd"),
        (lambda d: d["sites"][1].update(gpu_count=0), "sites[1].gpu_count", "leave gpu_type out for a CPU-only site"),
        (lambda d: d["sites"][1].update(gpu_count=10**30), "sites[1].gpu_count", "less than or equal"),
        (lambda d: d["sites"][0]["store"].update(path=""), "sites[0].store.local.path", "workspace root itself"),
        (lambda d: d["sites"][0]["store"].update(path="./"), "sites[0].store.local.path", "workspace root itself"),
        (lambda d: d["sites"][0]["store"].update(path="/"), "sites[0].store.local.path", "file system root"),
        (lambda d: d["sites"][1].update(store={"kind": "s3", "bucket": "UPPER_case bucket!"}),
         "sites[1].store.s3.bucket", "not an S3 bucket name"),
        (lambda d: d["sites"][1].update(store={"kind": "s3", "bucket": "10.0.0.1"}), "sites[1].store.s3.bucket",
         "IP address"),
        (lambda d: d["sites"][1].update(store={"kind": "s3", "bucket": "ml..data"}), "sites[1].store.s3.bucket",
         "no '..'"),
        (lambda d: d["sites"][1].update(store={"kind": "s3", "bucket": "xn--ml-data"}), "sites[1].store.s3.bucket",
         "reserved"),
        (lambda d: d["sites"][1].update(jurisdiction=""), "sites[1].jurisdiction", "must not be empty"),
        (lambda d: d["sites"][1].update(region=" "), "sites[1].region", "must not be empty"),
        (lambda d: d["sites"][1].update(gpu_type=""), "sites[1].gpu_type", "must not be empty"),
        (lambda d: d["sites"][0].update(hosts=[{"hostname": "gpu1", "username": "a", "gpus": 4},
                                               {"hostname": "GPU1", "username": "b", "gpus": 4}]),
         "sites[0].hosts", "hosts[1] (GPU1:22) repeats hosts[0]"),
        (set_host(0, hostname=""), "sites[0].hosts[0].hostname", "must not be empty"),
        (set_host(0, username=""), "sites[0].hosts[0].username", "must not be empty"),
        (set_host(0, hostname="-oProxyCommand=x"), "sites[0].hosts[0].hostname", "no leading '-'"),
        (set_host(0, gpus=99), "sites[0].hosts", "has gpus: 99, more than the site's gpu_count 8"),
        (set_host(0, connect_timeout_s=math.inf), "sites[0].hosts[0].connect_timeout_s", "finite"),
        (lambda d: d["sites"][1].update(instances={
            "region": "eu-west-1", "image_id": "ami-0abc", "instance_type": "p4d.24xlarge", "username": "ubuntu admin",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHLlzJ1hWXMAHNd1YyA7qXJ0ybsN/c3nkDGKEeDXKCWk"}),
         "sites[1].instances.username", "is not a username"),
    ],
)
def test_a_catalog_value_that_would_break_planning_is_refused_at_its_line(tmp_path, mutate, path, words):
    assert_problem(catalog_problems(tmp_path, mutate), path, words)


def test_what_a_catalog_may_legitimately_say_still_loads(tmp_path):
    data = sites_data()
    data["sites"].append({"name": "cpu-farm", "kind": "onprem", "region": "eu-central", "jurisdiction": "EU",
                          "price_per_gpu_hour": 0.0, "work_pool": "cpu", "store": {"kind": "local", "path": "s/cpu"}})
    data["sites"][0]["hosts"] = [{"hostname": "gpu1", "username": "train", "gpus": 8},
                                 {"hostname": "gpu1", "port": 2222, "username": "train", "gpus": 8}]  # 16 > 8: shared
    data["sites"][1]["store"] = {"kind": "s3", "bucket": "ml-data.eu-1"}
    cat = SitesCatalog.load(write(tmp_path, "sites.yaml", data))
    assert cat.get("cpu-farm").gpu_count == 0 and cat.get("cpu-farm").gpu_type is None  # a CPU-only site
    assert len(cat.get("onprem-dc1").hosts) == 2


def test_sites_built_in_python_are_checked_the_same_way():
    common = {"name": "cloud-x", "kind": "cloud", "region": "r", "jurisdiction": "EU", "work_pool": "cloud",
              "store": {"kind": "local", "path": "/tmp/cloud-x"}}
    with pytest.raises(ValueError, match="finite"):
        Site(price_per_gpu_hour=math.nan, **common)
    with pytest.raises(ValueError, match="CPU-only"):
        Site(price_per_gpu_hour=1.0, gpu_type="A100", gpu_count=0, **common)
    with pytest.raises(ValueError, match="must not be empty"):
        SshHost(hostname="", username="train")
    assert Site(price_per_gpu_hour=1.0, gpu_type="A100", gpu_count=4, **common).gpu_count == 4


# --- policy.yaml ------------------------------------------------------------------------------------------


def policy_problems(tmp_path, mutate, with_sites: bool = True) -> list:
    data = policy_data()
    mutate(data)
    sites = SitesCatalog.load(SITES_FILE) if with_sites else None
    with pytest.raises(SpecError) as info:
        Policy.load(write(tmp_path, "policy.yaml", data), sites)
    return info.value.problems


@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (lambda d: d["budgets"]["teams"].update(growth=math.nan), "budgets.teams.growth", "finite"),
        (lambda d: d["budgets"]["teams"].update(growth=-5), "budgets.teams.growth", "-5 is not a budget"),
        (lambda d: d["budgets"].update(per_job_usd=math.inf), "budgets.per_job_usd", "finite"),
        (lambda d: d["rules"][4].update(max_price_per_gpu_hour=math.nan), "rules[4].max_price_per_gpu_hour", "finite"),
        (lambda d: d["rules"][5].update(max_egress_usd=math.inf), "rules[5].max_egress_usd", "finite"),
        (lambda d: d.update(wait_slo_hours=math.inf), "wait_slo_hours", "finite"),
        (lambda d: d["rules"][1].update(jurisdictions=[]), "rules[1].jurisdictions", "an empty list allows nothing"),
        (lambda d: d["rules"][0].update(site_kinds=[]), "rules[0].site_kinds", "an empty list allows nothing"),
        (lambda d: d["rules"][1].update(jurisdictions=["Narnia"]), "rules[1].jurisdictions",
         "no site has jurisdiction Narnia (the sites catalog has: EU)"),
        (lambda d: d["rules"][1].update(jurisdictions=["EU", "eu"]), "rules[1].jurisdictions[1]", "did you mean 'EU'"),
        (lambda d: d["rules"][3].update(gpu_types=["A1OO"]), "rules[3].gpu_types[0]", "did you mean 'A100'"),
        (lambda d: d["rules"][3].update(gpu_types=["A1OO", "H100"]), "rules[3].gpu_types[0]", "did you mean 'A100'"),
        (lambda d: d["rules"][3].update(gpu_types=["B200"]), "rules[3].gpu_types",
         "would refuse every candidate it applies to"),
        (lambda d: d["rules"][3]["when"].update(gpu_types=["a100"]), "rules[3].when.gpu_types[0]",
         "did you mean 'A100'"),
        (lambda d: d["job_classes"].update({"bad name!": {"capacity_classes": ["fixed"]}}), "job_classes.bad name!",
         "not a job class name"),
        (lambda d: d["budgets"]["teams"].update({"Growth Team": 10}), "budgets.teams.Growth Team", "not a team name"),
        (lambda d: d["rules"][0]["when"].update(teams=["Growth"]), "rules[0].when.teams[0]", "not a team name"),
    ],
)
def test_a_policy_value_that_would_silently_change_placement_is_refused(tmp_path, mutate, path, words):
    problems = policy_problems(tmp_path, mutate)
    assert_problem(problems, path, words)


def test_an_empty_allow_list_is_one_problem_not_also_a_rule_that_constrains_nothing(tmp_path):
    (problem,) = policy_problems(tmp_path, lambda d: d["rules"][1].update(jurisdictions=[]))
    assert problem.path == "rules[1].jurisdictions" and "leave jurisdictions out to allow all" in problem.message


def test_what_a_policy_may_legitimately_say_still_loads(tmp_path):
    data = policy_data()
    data["budgets"]["teams"]["frozen"] = 0  # a team that may spend nothing this period
    data["rules"][1]["jurisdictions"] = ["EU", "UK"]  # a jurisdiction no site is in yet
    data["rules"][3]["when"]["gpu_types"] = ["H200"]  # a GPU type no site has yet
    sites = SitesCatalog.load(SITES_FILE)
    policy = Policy.load(write(tmp_path, "policy.yaml", data), sites)
    assert policy.rules[3].gpu_types == ("A100", "H100")  # the shipped policy names H100, which no site has
    # without a catalog only what the file says on its own is checked
    data["rules"][1]["jurisdictions"] = ["Narnia"]
    assert Policy.load(write(tmp_path, "policy.yaml", data)).rules[1].jurisdictions == ("Narnia",)


# --- plan --queue / --spot ----------------------------------------------------------------------------------

runner = CliRunner()


def plan(tmp_path, *args, sites: str = str(SITES_FILE)):
    import typer

    app = typer.Typer()
    register(app)
    spec = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    spec["placement"] = {"job_class": "opportunistic"}
    return runner.invoke(app, ["plan", write(tmp_path, "job.yaml", spec), "--sites", sites, "--policy",
                               str(POLICY_FILE), "--now", NOW, *args])


def one_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--queue", "onprem-dc1=8/3@nan"], "HOURS (nan) is each run's hours: give a finite number > 0"),
        (["--queue", "onprem-dc1=8/3@inf"], "HOURS (inf)"),
        (["--queue", "onprem-dc1=8/3@1e9"], "at most 8760 (a year)"),
        (["--queue", "onprem-dc1=8/3@0"], "HOURS (0)"),
        (["--queue", "onprem-dc1=99999999999999/3"], "give whole numbers from 0 to 1,000,000"),
        (["--queue", "onprem-dc1=1000000/1000000@8000"], "more than ten years"),
        (["--queue", "onprem-dc1=-1/3"], "give whole numbers from 0"),
        (["--queue", "onprem-dc1=lots"], "expected SITE=RUNNING/QUEUED[@HOURS]"),
        (["--queue", "nope=1/1"], "no site named 'nope' in the sites catalog; known sites: onprem-dc1, cloud-eu"),
        (["--spot", "cloud-eu=0.5/nan"], "PREEMPTIONS_PER_HOUR (nan)"),
        (["--spot", "cloud-eu=0.5/inf"], "PREEMPTIONS_PER_HOUR (inf)"),
        (["--spot", "cloud-eu=0.5/-1"], "give a finite number from 0 to 60"),
        (["--spot", "cloud-eu=nan"], "availability in (0, 1]"),
        (["--spot", "cloud-eu=0.5/1/2"], "3 fields given, two at most"),
        (["--spot", "onprem-dc1=0.5"], "site onprem-dc1 offers no spot capacity"),
        (["--spot", "nope=0.5"], "no site named 'nope' in the sites catalog"),
    ],
)
def test_a_queue_or_spot_value_no_plan_can_use_is_one_line_naming_the_option(tmp_path, args, words):
    line = " ".join(one_line(plan(tmp_path, *args)).split())
    assert line.startswith(f"error: {args[0]}: {args[1]!r}: "), line
    assert words in line, line


def test_good_queue_and_spot_values_still_plan(tmp_path):
    result = plan(tmp_path, "--queue", "onprem-dc1=8/12@2", "--spot", "cloud-eu=0.6/0.3")
    assert result.exit_code == 0, result.output
    catalog = SitesCatalog.load(SITES_FILE)
    q = parse_queue("onprem-dc1=8/3@2.5", catalog)
    assert (q.site, q.gpu_slots, q.running, q.scheduled, q.default_run_hours) == ("onprem-dc1", 8, 8, 3, 2.5)
    assert parse_spot("cloud-eu=0.7", catalog) == ("cloud-eu", SpotOutlook(availability=0.7))


def test_a_parse_error_is_still_a_spec_error_for_callers():
    catalog = SitesCatalog.load(SITES_FILE)
    with pytest.raises(SpecError) as info:
        parse_queue("onprem-dc1=8/3@nan", catalog)
    assert info.value.exit_code == 2 and info.value.problems[0].path == "onprem-dc1=8/3@nan"


def test_a_catalog_value_that_crashed_plan_is_refused_by_plan_naming_the_field(tmp_path):
    data = sites_data()
    data["sites"][1]["bandwidth_mbps"] = 1e-300  # plan used to end in an OverflowError traceback
    data["sites"][1]["price_per_gpu_hour"] = math.inf  # plan used to show an allowed candidate costing nan
    result = plan(tmp_path, "--dataset-bytes", "20000000000", sites=write(tmp_path, "sites.yaml", data))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    out = " ".join(result.output.split())
    assert "sites[1].bandwidth_mbps (line" in out and "sites[1].price_per_gpu_hour (line" in out
    assert "nan" not in out


@pytest.mark.parametrize("field", ["preemptions_per_hour", "expected_wait_s"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_a_spot_outlook_refuses_a_rate_or_wait_that_is_not_a_finite_number(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number >= 0"):
        SpotOutlook(**{field: value})
