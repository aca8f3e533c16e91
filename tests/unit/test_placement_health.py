"""Placement with site health: unhealthy sites are rejected by rule "site health", shown with the reason."""

from __future__ import annotations

import pytest

from hybridtrain.errors import NoFeasiblePlacement
from hybridtrain.placement.engine import HEALTH_RULE
from hybridtrain.remote.site_health import HealthCheck, assess, unavailable
from hybridtrain.specs.job import Sensitivity
from tests.fixtures.placement_cases import NOW, busy, request

SSH_DOWN = "ssh gpu@10.0.0.5:22: SiteUnavailable: cannot connect (Connection refused)"


def test_an_unhealthy_site_is_skipped_and_listed_with_the_reason(engine):
    baseline = engine.decide(request(), now=NOW, queues=busy(5.0))
    assert baseline.site == "cloud-v100"
    d = engine.decide(request(), now=NOW, queues=busy(5.0), unavailable={"cloud-v100": SSH_DOWN})
    assert d.site not in ("cloud-v100",) and d.meets_deadline
    rows = {r["capacity"]: r for r in d.to_table() if r["site"] == "cloud-v100"}
    burst = rows["burst"]
    assert (burst["verdict"], burst["rule"], burst["reason"], burst["cost_usd"]) == ("rejected", HEALTH_RULE,
                                                                                      SSH_DOWN, "")
    # Its spot option was never allowed for this job class: the policy's rule stays the reason.
    assert rows["opportunistic"]["rule"] == "job_classes.standard.capacity_classes"
    assert d.rejected["cloud-v100 (burst)"] == f"site health: {SSH_DOWN}"
    assert "cloud-v100 (burst): site health" in d.to_tags()["placement.rejected"]
    # The engine's cached plan is untouched: the site is back as soon as it is healthy again.
    assert engine.decide(request(), now=NOW, queues=busy(5.0)).site == "cloud-v100"


def test_unhealthy_on_prem_sends_the_job_to_the_cloud_even_with_an_empty_queue(engine):
    assert engine.decide(request(), now=NOW).site == "onprem-dc1"
    d = engine.decide(request(), now=NOW, unavailable={"onprem-dc1": "workers of pool onprem: none online"})
    assert not d.is_onprem
    assert d.rejected["onprem-dc1 (fixed)"] == "site health: workers of pool onprem: none online"


def test_all_allowed_sites_unhealthy_says_so(engine):
    # Restricted data may only stay on-prem: with on-prem down there is nowhere to go.
    with pytest.raises(NoFeasiblePlacement) as info:
        engine.decide(request(sensitivity=Sensitivity.restricted), now=NOW, unavailable={"onprem-dc1": SSH_DOWN})
    err = info.value
    assert "every site the policy allows is unavailable now (site health)" in str(err)
    assert err.rejected["onprem-dc1 (fixed)"] == f"site health: {SSH_DOWN}"
    # Sites the policy rejects keep the policy's rule, whatever their health.
    assert err.rejected["cloud-eu (burst)"].startswith("rules[0] (restricted data never leaves on-prem)")


def test_a_site_the_policy_rejects_keeps_its_policy_reason_and_unknown_names_are_ignored(engine):
    d = engine.decide(request(sensitivity=Sensitivity.restricted), now=NOW,
                      unavailable={"cloud-eu": "store s3://x: no answer", "no-such-site": "?"})
    assert d.site == "onprem-dc1"
    assert d.rejected["cloud-eu (burst)"].startswith("rules[0]")


def test_health_results_feed_placement(engine):
    down = assess("cloud-v100", [HealthCheck("ssh a@b:22", False, "Connection refused", 0.01),
                                 HealthCheck("store s3://x", True, "bucket answered", 0.02), None])
    up = assess("cloud-eu", [HealthCheck("store s3://y", True, "bucket answered", 0.02)])
    assert not down.healthy and up.healthy and len(down.checks) == 2
    assert down.reason == "ssh a@b:22: Connection refused" and up.reason == ""
    excluded = unavailable([down, up])
    assert excluded == {"cloud-v100": "ssh a@b:22: Connection refused"}
    d = engine.decide(request(), now=NOW, queues=busy(5.0), unavailable=excluded)
    assert d.site != "cloud-v100"
