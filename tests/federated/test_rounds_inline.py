"""Federated rounds in this process (InlineSites): a site that drops out is recorded and rejoins; too few sites stop the run, which then resumes."""

from __future__ import annotations

import pytest

from hybridtrain.federated.coordinator import InlineSites, NotEnoughSites, run_federation
from hybridtrain.federated.rounds import RoundStore
from tests.fixtures.federated_jobs import federated_spec

# Whole federated runs (prepare, rounds, evaluate at three sites), about a minute: `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

KEY = b"test-pseudonym-key-0123456789abcdef"


def setup(fed_workspace, name: str, **training):
    from hybridtrain.specs.job import load_spec
    from hybridtrain.workspace import Workspace

    root, parts = fed_workspace
    ws = Workspace.resolve(root)
    spec = load_spec(federated_spec(root, parts, name=name, **training), ws.load_sites())
    return ws, spec


def test_a_dropped_site_is_recorded_and_rejoins_the_next_round(fed_workspace):
    ws, spec = setup(fed_workspace, "dropin")
    down = {("train", "onprem-dc3", 2)}
    sites = InlineSites(ws, spec, "k1", "onprem-dc1", KEY, down=lambda step, site, rnd: (step, site, rnd) in down)
    outcome = run_federation(ws, spec, "k1", "onprem-dc1", sites)
    rounds = outcome.state.rounds
    assert [r.participants for r in rounds] == [["onprem-dc1", "onprem-dc2", "onprem-dc3"],
                                                ["onprem-dc1", "onprem-dc2"],
                                                ["onprem-dc1", "onprem-dc2", "onprem-dc3"]]
    assert rounds[1].dropped == {"onprem-dc3": "site onprem-dc3 is down"}
    assert 0.6 < outcome.metrics["auc"] <= 1.0
    assert outcome.metrics["n"] == sum(e.metrics["n"] for e in outcome.evaluations.values())
    # Only model bytes crossed: statistics and updates to the aggregator, global weights to the sites.
    kinds = {t.what.split(" ")[0] for t in outcome.transfers}
    assert kinds == {"feature", "model", "global"}
    assert all("onprem-dc1" in (t.source, t.destination) for t in outcome.transfers)
    assert not any(t.what.startswith("data/") for t in outcome.transfers)
    # Each round's global model is checkpointed at the aggregator.
    rs = RoundStore(__import__("hybridtrain").stages.checkpoint_store(ws, ws.load_sites().get("onprem-dc1")),
                    spec.name, "k1")
    assert all(rs.store.exists(rs.global_key(r)) for r in range(4))


def test_too_few_sites_stop_the_run_and_the_same_run_key_resumes_after_the_last_round(fed_workspace):
    ws, spec = setup(fed_workspace, "resumed", min_sites=3, min_fraction=1.0)
    outage = {"on": True}

    def down(step: str, site: str, rnd: int) -> bool:
        return outage["on"] and step == "train" and rnd == 2 and site == "onprem-dc2"

    with pytest.raises(NotEnoughSites) as err:
        run_federation(ws, spec, "k2", "onprem-dc1", InlineSites(ws, spec, "k2", "onprem-dc1", KEY, down=down))
    assert "round 2 got 2 site(s)" in str(err.value) and "onprem-dc2: site onprem-dc2 is down" in str(err.value)
    outage["on"] = False
    calls = []

    class Counting(InlineSites):
        def prepare(self, sites, rnd=0):
            calls.append(("prepare", tuple(sites)))
            return super().prepare(sites, rnd)

        def train(self, rnd, approved, featurizer):
            calls.append(("train", rnd))
            return super().train(rnd, approved, featurizer)

    outcome = run_federation(ws, spec, "k2", "onprem-dc1", Counting(ws, spec, "k2", "onprem-dc1", KEY))
    assert outcome.resumed_after_round == 1
    assert calls == [("train", 2), ("train", 3)]  # no site prepared again, round 1 not repeated
    assert [r.round for r in outcome.state.rounds] == [1, 2, 3]
