"""Secure aggregation end to end in this process (InlineSites): only masked updates reach the aggregator, their sum is
FedAvg, and a site that drops mid-round makes the others mask their kept update again, without retraining."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridtrain.federated import secure_aggregation as sa
from hybridtrain.federated.aggregation import fedavg
from hybridtrain.federated.coordinator import InlineSites, run_federation, secure_round
from hybridtrain.federated.registration import version_tags
from hybridtrain.federated.rounds import CLOSED
from hybridtrain.federated.site import SiteUpdate, round_store, site_private
from tests.fixtures.federated_jobs import DATA_SITES, federated_spec

# Whole federated runs (prepare, rounds, evaluate at three sites), about a minute: `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow
KEY = b"test-pseudonym-key-0123456789abcdef"
AGG = "onprem-dc1"


def setup(fed_workspace, name: str, **training):
    from hybridtrain.specs.job import load_spec
    from hybridtrain.workspace import Workspace

    root, parts = fed_workspace
    ws = Workspace.resolve(root)
    spec = load_spec(federated_spec(root, parts, name=name, secure_aggregation=True, **training), ws.load_sites())
    return ws, spec


class Recording(InlineSites):
    """InlineSites that keeps every site report and the SecureRound it was asked with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[tuple[int, sa.SecureRound, dict]] = []

    def train(self, rnd, approved, featurizer, secure=None):
        out = super().train(rnd, approved, featurizer, secure)
        self.asked.append((rnd, secure, out))
        return out


@pytest.fixture(scope="module")
def dropped_run(fed_workspace):
    """Three rounds with DP-SGD at the sites; in round 2 onprem-dc3 drops before its masked update arrives."""
    ws, spec = setup(fed_workspace, "secagg", dp={"noise_multiplier": 0.5, "max_grad_norm": 1.0, "delta": 1e-5})
    sites = Recording(ws, spec, "s1", AGG, KEY, down=lambda step, site, rnd: (step, site, rnd) == ("train",
                                                                                                   "onprem-dc3", 2))
    return ws, spec, sites, run_federation(ws, spec, "s1", AGG, sites)


def test_a_dropped_site_closes_the_attempt_and_the_survivors_mask_again_without_retraining(dropped_run):
    ws, spec, sites, outcome = dropped_run
    rounds = outcome.state.rounds
    assert all(r.secure_aggregation for r in rounds)
    assert [r.participants for r in rounds] == [DATA_SITES, DATA_SITES[:2], DATA_SITES]
    assert [len(r.attempts) for r in rounds] == [1, 2, 1]
    first, second = rounds[1].attempts
    assert first.participants == DATA_SITES and first.dropped == {"onprem-dc3": "site onprem-dc3 is down"}
    assert second.attempt == 2 and second.participants == DATA_SITES[:2] and second.dropped == {}
    assert rounds[1].dropped == {"onprem-dc3": "site onprem-dc3 is down"}
    assert rounds[1].rows == {s: rounds[0].rows[s] for s in DATA_SITES[:2]}
    rs = round_store(ws, spec, "s1", AGG)
    assert rs.attempt_closed(2, 1) and not rs.attempt_closed(2, 2) and rs.closed_attempts(2) == [first]
    # Round 2's second attempt: the survivors masked the update they kept from the first, no training.
    round2 = [(secure, out) for rnd, secure, out in sites.asked if rnd == 2]
    assert [secure.attempt for secure, _ in round2] == [1, 2]
    assert [u.reused for u in round2[0][1].values() if isinstance(u, SiteUpdate)] == [False, False]
    assert all(u.reused and u.attempt == 2 and u.masked_for == DATA_SITES[:2] for u in round2[1][1].values())
    # No global model went to a site twice: attempt 2 fetched nothing.
    fetched = [t for u in round2[1][1].values() for t in u.transfers if t.what.startswith("global model")]
    assert fetched == []
    assert 0.6 < outcome.metrics["auc"] <= 1.0
    # DP-SGD composes with the masking: each round records the epsilon each participant spent.
    assert [sorted(r.epsilon) for r in rounds] == [r.participants for r in rounds]
    assert all(0 < e < float("inf") for r in rounds for e in r.epsilon.values())


def test_each_rounds_global_model_is_fedavg_of_the_updates_the_sites_kept(dropped_run):
    ws, spec, _, outcome = dropped_run
    rs = round_store(ws, spec, "s1", AGG)
    for record in outcome.state.rounds:
        like = rs.load_global(record.round - 1)
        kept = {s: site_private(ws, spec, "s1", s).kept_update(record.round) for s in record.participants}
        plain = fedavg({s: (state, int(meta["rows"])) for s, (state, meta) in kept.items()}, like)
        secure = rs.load_global(record.round)
        for k in like:
            assert torch.allclose(secure[k], plain[k], atol=1e-6), (record.round, k)


def test_nothing_in_the_round_store_is_a_sites_plain_update(dropped_run):
    ws, spec, _, outcome = dropped_run
    rs = round_store(ws, spec, "s1", AGG)
    updates = [o.key for o in rs.store.list(f"{rs.prefix}/updates/")]
    assert updates and all(k.endswith((".masked", "/closed.json", "/asked.json")) for k in updates), updates
    masked = [k for k in updates if k.endswith(".masked") and rs.store.get_bytes(k) != CLOSED]
    assert len(masked) == 3 + 2 + 2 + 3  # round 2: two from the closed attempt, two from the next
    assert rs.store.get_bytes(rs.masked_key(2, 1, "onprem-dc3")) == CLOSED  # sealed when the attempt closed
    like = rs.load_global(0)
    for key in masked:
        rnd = int(key.split("/round-")[1][:4])
        values = sa.decode(sa.from_bytes(rs.store.get_bytes(key)))
        for site in DATA_SITES:
            kept = site_private(ws, spec, "s1", site).kept_update(rnd)
            if kept is None:
                continue
            plain = sa.flatten(kept[0], like)
            assert abs(np.corrcoef(values, plain)[0, 1]) < 0.2, (key, site)
            assert not np.allclose(values[:50], plain[:50], atol=1e-3)
    # What the aggregator holds for each site: statistics, a public key, masked vectors; the private key stays home.
    assert rs.store.exists(rs.public_key_key("onprem-dc2"))
    assert not any("x25519.key" in o.key or "federated-site/" in o.key for o in rs.store.list(rs.prefix))
    kinds = {t.what.split(" round")[0].split(" of ")[0] for t in outcome.transfers}
    assert kinds == {"feature statistics", "secure-aggregation public key", "model update", "global model"}


def test_the_registered_version_says_it_was_securely_aggregated(dropped_run):
    _, spec, _, outcome = dropped_run
    tags = version_tags(spec, outcome, AGG)
    assert tags["hybridtrain.federated.secure_aggregation"] == "pairwise-masking-x25519-chacha20"
    assert '"2": [{"attempt": 1' in tags["hybridtrain.federated.secure_attempts"]


def test_a_site_does_not_upload_to_a_closed_attempt(dropped_run):
    from hybridtrain.federated import site as steps
    from hybridtrain.federated.site import SitePrepared

    ws, spec, _, outcome = dropped_run
    rs = round_store(ws, spec, "s1", AGG)
    prepared = {s: SitePrepared.model_validate(p) for s, p in outcome.state.prepared.items()}
    secure = sa.SecureRound(attempt=1, rows={s: p.stats.rows for s, p in prepared.items()},
                            public_keys={s: p.public_key for s, p in prepared.items()})
    with pytest.raises(sa.AttemptClosed, match="onprem-dc3: attempt 1 of round 2 was closed"):
        steps.train_round(ws, spec, "onprem-dc3", "s1", 2, prepared["onprem-dc3"].anon.approved,
                          outcome.state.featurizer, AGG, secure)
    assert rs.store.get_bytes(rs.masked_key(2, 1, "onprem-dc3")) == CLOSED
    assert site_private(ws, spec, "s1", "onprem-dc3").kept_update(2) is None  # it did not even train


def copy_run(ws, old: str, new: str) -> None:
    """The run as it stood, under another run key (its own prefixes; the same site keys and kept updates)."""
    from hybridtrain import stages

    for site in DATA_SITES:
        store = stages.checkpoint_store(ws, ws.load_sites().get(site))
        for obj in store.list(""):
            if f"/secagg/{old}/" in obj.key:
                store.put_bytes(obj.key.replace(f"/secagg/{old}/", f"/secagg/{new}/"), store.get_bytes(obj.key))


def test_an_aggregator_that_resumes_mid_round_asks_the_survivors_of_the_last_closed_attempt(dropped_run):
    """Its predecessor closed attempt 1 of round 3 (onprem-dc2 dropped) and died: the next one asks attempt 2 of the
    same survivors, who mask what they kept, and the aggregate is their FedAvg."""
    ws, spec, _, outcome = dropped_run
    copy_run(ws, "s1", "s3")
    rs = round_store(ws, spec, "s3", AGG)
    rs.close_attempt(3, 1, DATA_SITES, {"onprem-dc2": "its pool lost its worker"})
    sites = Recording(ws, spec, "s3", AGG, KEY)
    approved = {s: outcome.prepared()[s].anon.approved for s in DATA_SITES}
    dropped: dict[str, str] = {}
    result = secure_round(spec, "s3", rs, sites, 3, approved, outcome.state, 2, dropped)
    survivors = ["onprem-dc1", "onprem-dc3"]
    assert [(secure.attempt, secure.participants) for _, secure, _ in sites.asked] == [(2, survivors)]
    assert result.participants == sorted(result.updates) == survivors
    assert all(u.reused for u in result.updates.values())
    assert [(a.attempt, a.participants) for a in result.attempts] == [(1, DATA_SITES), (2, survivors)]
    assert dropped == {"onprem-dc2": "its pool lost its worker"}
    kept = {s: site_private(ws, spec, "s3", s).kept_update(3) for s in survivors}
    plain = fedavg({s: (state, int(meta["rows"])) for s, (state, meta) in kept.items()}, rs.load_global(2))
    assert all(torch.allclose(result.state[k], plain[k], atol=1e-6) for k in plain)


def test_an_upload_racing_the_close_either_lands_first_and_counts_or_not_at_all(dropped_run):
    """The aggregator seals the missing places before it closes an attempt; a site's upload and the seal race for the
    same key (write-if-absent), so no masked update of a closed attempt lands after it was closed."""
    from hybridtrain.federated import site as steps

    ws, spec, _, outcome = dropped_run
    copy_run(ws, "s1", "s4")
    rs = round_store(ws, spec, "s4", AGG)
    approved = {s: outcome.prepared()[s].anon.approved for s in DATA_SITES}
    secure = sa.SecureRound(attempt=5, rows={s: p.stats.rows for s, p in outcome.prepared().items()},
                            public_keys={s: p.public_key for s, p in outcome.prepared().items()})
    # Sealed first: the site's upload finds the place taken and sends nothing.
    assert rs.seal(3, 5, ["onprem-dc2"]) == ["onprem-dc2"]
    with pytest.raises(sa.AttemptClosed, match="onprem-dc2: attempt 5 of round 3 was closed"):
        steps.train_round(ws, spec, "onprem-dc2", "s4", 3, approved["onprem-dc2"], outcome.state.featurizer, AGG,
                          secure)
    assert rs.store.get_bytes(rs.masked_key(3, 5, "onprem-dc2")) == CLOSED
    # Landed first (its report lost, e.g. the flow run was cancelled right after): the seal leaves it, and the
    # attempt completes with it; the aggregate is the FedAvg of all three.
    update = steps.train_round(ws, spec, "onprem-dc3", "s4", 3, approved["onprem-dc3"], outcome.state.featurizer,
                               AGG, secure.model_copy(update={"attempt": 6}))
    assert update.reused and rs.seal(3, 6, ["onprem-dc3"]) == []
    for attempt in range(1, 6):
        rs.close_attempt(3, attempt, DATA_SITES, {})  # the aggregator resumes at attempt 6 and asks all three
    sites = Recording(ws, spec, "s4", AGG, KEY, down=lambda step, site, rnd: site == "onprem-dc3")
    dropped: dict[str, str] = {}
    result = secure_round(spec, "s4", rs, sites, 3, approved, outcome.state, 2, dropped)
    assert result.participants == DATA_SITES and sorted(result.updates) == ["onprem-dc1", "onprem-dc2"]
    assert result.attempts[-1].attempt == 6 and result.attempts[-1].dropped == {}
    kept = {s: site_private(ws, spec, "s4", s).kept_update(3) for s in DATA_SITES}
    plain = fedavg({s: (state, int(meta["rows"])) for s, (state, meta) in kept.items()}, rs.load_global(2))
    assert all(torch.allclose(result.state[k], plain[k], atol=1e-6) for k in plain)


def test_a_later_attempt_keeps_the_ssh_host_that_trained_the_update_in_its_report(dropped_run):
    """An SSH host trains a round once; a later attempt masks what it kept without the host, and still
    reports that host (the round's ``site_hosts`` lineage), read from the note the site's step left."""
    from hybridtrain.federated import site as steps

    ws, spec, _, outcome = dropped_run
    copy_run(ws, "s1", "s5")
    private = site_private(ws, spec, "s5", "onprem-dc2")
    assert private.noted_host(3) == (None, None)  # trained in process: no host
    private.note_host(3, "trainer@[127.0.0.1]:2222", "fed-job-7")  # as the step notes after the host's round
    secure = sa.SecureRound(attempt=2, rows={s: p.stats.rows for s, p in outcome.prepared().items()},
                            public_keys={s: p.public_key for s, p in outcome.prepared().items()})
    update = steps.train_round(ws, spec, "onprem-dc2", "s5", 3, outcome.prepared()["onprem-dc2"].anon.approved,
                               outcome.state.featurizer, AGG, secure)
    assert update.reused and (update.host, update.job_id) == ("trainer@[127.0.0.1]:2222", "fed-job-7")
