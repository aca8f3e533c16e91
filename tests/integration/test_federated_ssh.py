"""Federated training with one data site on an SSH host: its rounds run on the host (real loopback OpenSSH), the other site's in this process.

Two on-prem data sites (``onprem-dc1`` in-process, ``onprem-dc2`` listing the loopback sshd as
its host), the aggregator at a third site (``onprem-dc3``), so both sites' updates cross a site
boundary. The same job runs twice on the same data: all sites in this process, then with
``onprem-dc2``'s rounds on its host. The host's own job directories show it trained; its updates
are the ones the aggregator averaged; both runs end at (nearly) the same global model.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import SecretStr

from hybridtrain import stages
from hybridtrain.cli.federated import ensure_site_data
from hybridtrain.drill.loopback import free_port
from hybridtrain.errors import SiteUnavailable, SpecError
from hybridtrain.federated import site as steps
from hybridtrain.federated.coordinator import InlineSites, run_federation
from hybridtrain.federated.registration import version_tags
from hybridtrain.federated.remote_round import round_job_id
from hybridtrain.federated.rounds import RoundStore
from hybridtrain.specs.job import load_spec
from hybridtrain.specs.secrets import SiteSecret, SiteSecrets
from hybridtrain.workspace import Workspace
from tests.fixtures.federated_jobs import add_sites, federated_spec
from tests.fixtures.workspaces import ROOT, make_workspace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SITES = ["onprem-dc1", "onprem-dc2"]
SSH_SITE = "onprem-dc2"
AGG = "onprem-dc3"
ROWS = 4000
KEY = b"test-pseudonym-key-0123456789abcdef"


def host_python(base: Path) -> str:
    """This interpreter with this checkout's hybridtrain first on the path (the host's installed copy)."""
    script = base / "host-python"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def give_hosts(root: Path, site: str, host: dict) -> None:
    path = root / "deployments" / "sites.yaml"
    data = yaml.safe_load(path.read_text())
    next(s for s in data["sites"] if s["name"] == site)["hosts"] = [host]
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def run(ws: Workspace, spec, run_key: str):
    return run_federation(ws, spec, run_key, AGG, InlineSites(ws, spec, run_key, AGG, KEY))


@pytest.fixture(scope="module")
def runs(sshd, tmp_path_factory):
    base = tmp_path_factory.mktemp("fedssh")
    root = make_workspace(base / "ws")
    add_sites(root)
    parts = ensure_site_data(Workspace.resolve(root), SITES, ROWS, 20261121)
    spec_file = federated_spec(root, parts, name="fedssh", rounds=2, aggregation_site=AGG)
    plain = Workspace.resolve(root)
    inline = run(plain, load_spec(spec_file, plain.load_sites()), "inproc")
    host = sshd.host.model_copy(update={"python": host_python(base)})
    give_hosts(root, SSH_SITE, host.model_dump(mode="json"))
    ws = Workspace.resolve(root).with_secrets(SiteSecrets.of({SSH_SITE: SiteSecret(
        ssh_private_key=SecretStr(sshd.private_key), ssh_known_hosts=sshd.known_hosts)}))
    spec = load_spec(spec_file, ws.load_sites())
    over_ssh = run(ws, spec, "ssh")
    secure_spec = load_spec(federated_spec(root, parts, name="fedsecure", rounds=2, aggregation_site=AGG,
                                           secure_aggregation=True), ws.load_sites())
    secure = run(ws, secure_spec, "secure")
    return {"root": root, "ws": ws, "spec": spec, "inline": inline, "ssh": over_ssh, "host": host,
            "secure_spec": secure_spec, "secure": secure}


def test_the_ssh_site_trains_its_rounds_on_its_host(runs, sshd):
    outcome, ws, spec = runs["ssh"], runs["ws"], runs["spec"]
    label = f"{sshd.host.username}@[127.0.0.1]:{sshd.host.port}"
    assert [r.participants for r in outcome.state.rounds] == [SITES, SITES]
    assert [r.site_hosts for r in outcome.state.rounds] == [{SSH_SITE: label}] * 2
    # The registered version's lineage names the host beside each round's participants; in-process sites none.
    tags = version_tags(spec, outcome, AGG)
    assert json.loads(tags["hybridtrain.federated.site_hosts"]) == {"1": {SSH_SITE: label}, "2": {SSH_SITE: label}}
    assert json.loads(tags["hybridtrain.federated.participants"]) == {"1": SITES, "2": SITES}
    assert json.loads(version_tags(spec, runs["inline"], AGG)["hybridtrain.federated.site_hosts"]) == {}
    rs = RoundStore(stages.checkpoint_store(ws, ws.load_sites().get(AGG)), spec.name, "ssh")
    for rnd in (1, 2):
        job = Path(sshd.host.workdir) / "jobs" / round_job_id(spec.name, "ssh", rnd, SSH_SITE)
        log = (job / "log").read_text()
        assert f"federated round {rnd} of fedssh (run key ssh) for site {SSH_SITE}" in log
        assert (job / "exit_code").read_text().strip() == "0"
        report = json.loads((job / "bundle" / "round.json").read_text())
        assert report["pid"] != os.getpid() and report["round"] == rnd
        assert not (job / "bundle" / "secrets.json").exists()  # the store keys did not stay on the host
        # The update the aggregator averaged is the one the host wrote.
        update = rs.store.get_bytes(rs.update_key(rnd, SSH_SITE))
        assert hashlib.sha256(update).hexdigest() == report["update_sha256"]
        assert outcome.state.rounds[rnd - 1].site_metrics[SSH_SITE]["val_auc"] == report["metrics"]["val_auc"]
    # The in-process site never went to the host.
    assert not list((Path(sshd.host.workdir) / "jobs").glob(f"*-ssh-r*-{SITES[0]}"))


def test_both_sites_crossings_are_recorded_and_audited(runs):
    outcome, ws = runs["ssh"], runs["ws"]
    updates = {(t.source, t.destination) for t in outcome.transfers if t.what.startswith("model update")}
    assert updates == {(SITES[0], AGG), (SSH_SITE, AGG)}
    host_made = [t for r in outcome.state.rounds for t in r.transfers if SSH_SITE in (t.source, t.destination)]
    assert sorted(t.what.split(" (")[0] for t in host_made) == [
        "global model round 0", "global model round 1",
        f"model update round 1 of {SSH_SITE}", f"model update round 2 of {SSH_SITE}"]
    assert all(t.bytes > 0 for t in host_made)
    assert not any(t.what.startswith("data/") for t in outcome.transfers)  # only model bytes crossed
    audited = {r.subject for r in stages.audit(ws).records() if r.action == "sync"}
    assert {t.what for t in host_made} <= audited
    # Lineage: both sites prepared their parts, at home.
    assert sorted(outcome.state.prepared) == SITES


def test_the_global_model_matches_the_all_in_process_run(runs):
    inline, over_ssh, ws, spec = runs["inline"], runs["ssh"], runs["ws"], runs["spec"]
    assert ({s: p["anon"]["approved"]["md5"] for s, p in inline.state.prepared.items()}
            == {s: p["anon"]["approved"]["md5"] for s, p in over_ssh.state.prepared.items()})
    store = stages.checkpoint_store(ws, ws.load_sites().get(AGG))
    a = RoundStore(store, spec.name, "inproc").load_global(2)
    b = RoundStore(store, spec.name, "ssh").load_global(2)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4
    assert abs(inline.metrics["auc"] - over_ssh.metrics["auc"]) < 0.005
    assert 0.6 < over_ssh.metrics["auc"] <= 1.0
    assert not torch.equal(a[next(iter(a))], RoundStore(store, spec.name, "ssh").load_global(0)[next(iter(a))])


def test_with_secure_aggregation_the_host_keeps_its_update_at_the_site_and_only_the_masked_one_leaves(runs, sshd):
    ws, spec, outcome = runs["ws"], runs["secure_spec"], runs["secure"]
    label = f"{sshd.host.username}@[127.0.0.1]:{sshd.host.port}"
    assert [(r.participants, r.site_hosts, len(r.attempts)) for r in outcome.state.rounds] == [
        (SITES, {SSH_SITE: label}, 1)] * 2
    store = stages.checkpoint_store(ws, ws.load_sites().get(AGG))
    rs = RoundStore(store, spec.name, "secure")
    assert not [o.key for o in store.list(f"{rs.prefix}/updates/") if o.key.endswith(".pt")]
    for rnd in (1, 2):
        job = Path(sshd.host.workdir) / "jobs" / round_job_id(spec.name, "secure", rnd, SSH_SITE)
        assert f"kept at {SSH_SITE} (to be masked)" in (job / "log").read_text()
        report = json.loads((job / "bundle" / "round.json").read_text())
        assert [t["what"].split(" (")[0] for t in report["transfers"]] == [f"global model round {rnd - 1}"]
        kept = steps.site_private(ws, spec, "secure", SSH_SITE).store.get_bytes(
            f"federated-site/{spec.name}/secure/{SSH_SITE}/round-{rnd:04d}.pt")
        assert hashlib.sha256(kept).hexdigest() == report["update_sha256"]  # the host's update, kept at home
        assert store.get_bytes(rs.masked_key(rnd, 1, SSH_SITE)) != kept
    masked = [t for t in outcome.transfers if t.what.startswith(f"model update round 2 of {SSH_SITE}, masked")]
    assert len(masked) == 1 and masked[0].destination == AGG
    # The same training as the plain runs: the masked sum is their global model.
    plain = RoundStore(store, runs["spec"].name, "inproc").load_global(2)
    secure = rs.load_global(2)
    assert max(float((plain[k] - secure[k]).abs().max()) for k in plain) < 1e-4


def test_no_ssh_key_or_no_host_is_one_clear_error_and_nothing_runs(runs, sshd):
    ws, spec, outcome = runs["ws"], runs["spec"], runs["ssh"]
    approved = outcome.prepared()[SSH_SITE].anon.approved
    args = (spec, SSH_SITE, "ssh-bad", 1, approved, outcome.state.featurizer, AGG)
    with pytest.raises(SpecError) as err:
        steps.train_round(Workspace.resolve(runs["root"]), *args)  # the block holds no SSH key
    assert f"{SSH_SITE}.ssh_private_key" in str(err.value) and "hybridtrain credentials" in str(err.value)
    root = runs["root"]
    give_hosts(root, SSH_SITE, runs["host"].model_copy(update={"port": free_port(), "connect_timeout_s": 3.0})
               .model_dump(mode="json"))
    try:
        with pytest.raises(SiteUnavailable) as down:  # InlineSites / PoolSites drop the site from the round
            steps.train_round(ws, *args)
    finally:
        give_hosts(root, SSH_SITE, runs["host"].model_dump(mode="json"))
    assert SSH_SITE in str(down.value)
    assert not list((Path(sshd.host.workdir) / "jobs").glob("*-ssh-bad-*"))


def test_a_gpu_jobs_round_holds_its_hosts_gpu_and_cannot_start_while_another_job_holds_it(runs, sshd, prefect_server,
                                                                                         monkeypatch):
    """The federated round task on a real Prefect server, the host declaring one GPU: while another job holds it the
    round waits and then gives up naming the site, and nothing ran on the host; once it is free the round takes it,
    trains seeing only it, and gives it back."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from hybridtrain.errors import NoFeasiblePlacement
    from hybridtrain.placement.node_fit import host_key
    from orchestration import gpu_lease
    from tasks.federated import train_round

    monkeypatch.setattr(gpu_lease, "GPU_POLL_S", 0.2)
    root, outcome = runs["root"], runs["ssh"]
    host = runs["host"].model_copy(update={"gpus": 1})
    give_hosts(root, SSH_SITE, host.model_dump(mode="json"))
    spec = runs["spec"].model_copy(update={"resources": runs["spec"].resources.model_copy(update={"gpus": 1})})
    other = runs["spec"].model_copy(update={"metadata": runs["spec"].metadata.model_copy(update={"name": "other"}),
                                            "resources": spec.resources})
    approved = outcome.prepared()[SSH_SITE].anon.approved
    job = Path(sshd.host.workdir) / "jobs" / round_job_id(spec.name, "ssh", 3, SSH_SITE)
    gpu = gpu_lease.gpu_limit_name(SSH_SITE, host_key(host), 0)

    @flow
    def round_three(wait_s: float) -> str:
        monkeypatch.setenv("HYBRIDTRAIN_GPU_WAIT_S", str(wait_s))
        try:  # round 3 of run key "ssh": from its round-2 global model
            return train_round(runs["ws"], spec, SSH_SITE, "ssh", 3, approved, outcome.state.featurizer, AGG).host
        except NoFeasiblePlacement as exc:
            return f"refused: {exc}"

    @flow
    def while_another_job_holds_the_gpu() -> str:
        sites = runs["ws"].load_sites()
        with gpu_lease.hold_gpus(sites.get(SSH_SITE), other) as held:
            assert held == {host_key(host): (0,)}
            return round_three(1.0)

    try:
        refused = while_another_job_holds_the_gpu()
        assert refused.startswith("refused: ") and SSH_SITE in refused and "waited 1 s" in refused, refused
        assert not job.exists()  # it never reached the host
        trained = round_three(60.0)
    finally:
        give_hosts(root, SSH_SITE, runs["host"].model_dump(mode="json"))
    assert trained == f"{sshd.host.username}@[127.0.0.1]:{sshd.host.port}"
    assert (job / "exit_code").read_text().strip() == "0"
    assert "CUDA_VISIBLE_DEVICES=0 " in (job / "run.sh").read_text()  # it saw only the GPU it held
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(gpu)
    assert limit.limit == 1 and limit.active_slots == 0  # and gave it back
