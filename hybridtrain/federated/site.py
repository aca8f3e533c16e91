"""SiteSteps: what runs at one data site in federated training — prepare its part, train a round, evaluate the global model.

Raw data never leaves the site: ``prepare`` runs the same preprocessing, anonymization
(k-anonymity) and leak scan as a centralized lifecycle, on the site's own part, and trains
only on the approved result. What leaves is what ``ModelMover`` records: the featurizer
statistics once, each round's weights, and the global model coming in. Before anything is sent
the policy is asked whether this site's update may go to the aggregation site (the same check
as for its data); every crossing is written to the audit log.

With ``training.federated.secure_aggregation`` a site also keeps things to itself, in its own
store under ``federated-site/<job>/<run_key>/<site>/`` (``secure_aggregation.SitePrivate``): its X25519 private key
and each round's plain update; what it sends instead is its public key at prepare and, per
round, only its masked update (``hybridtrain.federated.secure_aggregation``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
from pydantic import BaseModel, Field

from hybridtrain import stages
from hybridtrain.datasets import partitioned
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.transfer import ModelMover, TransferRecord
from hybridtrain.errors import Problem, SpecError, TransientError
from hybridtrain.federated import secure_aggregation as secagg
from hybridtrain.federated.features import SiteFeatureStats
from hybridtrain.federated.local import evaluate_state, train_local
from hybridtrain.federated.rounds import RoundStore, load_state, state_bytes
from hybridtrain.specs.job import JobSpec
from hybridtrain.training.featurizer import Featurizer
from hybridtrain.training.local_gpus import hold_for_job, job_device
from hybridtrain.workspace import Workspace

#: Holds the GPUs a round trains on while the block runs: ``host_key`` → GPU indices, or None when it takes none
#: (the shell's ``orchestration.gpu_lease.hold_gpus`` for the site and job).
HoldGpus = Callable[[], AbstractContextManager[Mapping[str, Sequence[int]] | None]]

if TYPE_CHECKING:
    from hybridtrain.remote.ssh_site import SshCredentials


class SitePrepared(BaseModel):
    """A site's part, preprocessed and approved at the site, and the feature statistics it sent."""

    site: str
    prep: stages.PreprocessResult
    anon: stages.AnonymizeResult
    stats: SiteFeatureStats
    public_key: str | None = Field(None, description="Secure aggregation: the site's X25519 public key (hex).")
    transfers: list[TransferRecord] = Field(default_factory=list)
    seconds: float


class SiteUpdate(BaseModel):
    """One site's round: the update it sent and what it measured."""

    site: str
    round: int
    rows: int
    metrics: dict[str, float]
    epsilon: float | None = None
    update_sha256: str
    transfers: list[TransferRecord] = Field(default_factory=list)
    seconds: float
    host: str | None = Field(None, description="The SSH host (user@host:port) that trained the round; None: in "
                                               "the site's worker process.")
    job_id: str | None = Field(None, description="The job's id on that host (its log and bundle are under "
                                                 "<workdir>/jobs/<job_id>).")
    attempt: int = Field(1, description="Secure aggregation: the attempt of the round this update was masked for.")
    masked_for: list[str] = Field(default_factory=list, description="Secure aggregation: the participants whose "
                                                                    "masks it carries (empty: a plain update).")
    reused: bool = Field(False, description="Secure aggregation: masked again from the update the site kept at an "
                                            "earlier attempt, without training.")


class SiteEvaluation(BaseModel):
    """The final global model measured on a site's own test split."""

    site: str
    metrics: dict[str, float]
    champion_metrics: dict[str, float] | None = Field(None, description="The current champion on the same rows.")
    transfers: list[TransferRecord] = Field(default_factory=list)
    seconds: float


def _approved_splits(ws: Workspace, approved: DatasetVersion, site: str, splits: list[str]) -> pd.DataFrame:
    sites = ws.load_sites()
    return partitioned.read(stages.dataset_at(ws, sites, approved, site, site), splits)


def check_route(ws: Workspace, spec: JobSpec, site: str, aggregation_site: str) -> None:
    """Refuse to send ``site``'s model bytes to an aggregation site the policy does not allow for its data."""
    from datetime import UTC, datetime

    from hybridtrain.federated.planning import update_route_rejection
    from hybridtrain.placement.policy import Policy

    sites = ws.load_sites()
    why = update_route_rejection(Policy.load(ws.policy_file, sites), spec, sites, site, aggregation_site,
                                 datetime.now(UTC))
    if why is not None:
        raise SpecError(f"job {spec.name}", [Problem(
            "training.federated.aggregation_site", f"the policy does not allow the model update of site {site} at "
            f"{aggregation_site} ({why}); nothing was sent")])


def _cross(ws: Workspace, record: TransferRecord | None, out: list[TransferRecord]) -> None:
    if record is None:
        return
    out.append(record)
    _audit_crossing(ws, record)


def _audit_crossing(ws: Workspace, record: TransferRecord) -> None:
    stages.audit(ws).append(actor=ws.actor, action="sync", subject=record.what, inputs=record.as_row(),
                            outcome=f"{record.bytes} bytes to {record.destination}")


def round_store(ws: Workspace, spec: JobSpec, run_key: str, aggregation_site: str) -> RoundStore:
    return RoundStore(stages.checkpoint_store(ws, ws.load_sites().get(aggregation_site)), spec.name, run_key)


def site_private(ws: Workspace, spec: JobSpec, run_key: str, site: str) -> secagg.SitePrivate:
    """What ``site`` keeps to itself under secure aggregation, in its own store."""
    return secagg.SitePrivate(stages.checkpoint_store(ws, ws.load_sites().get(site)), spec.name, run_key, site)


def prepare(ws: Workspace, spec: JobSpec, site: str, key: bytes, run_key: str, aggregation_site: str) -> SitePrepared:
    """Raw → curated → approved at ``site`` (its part only), then its feature statistics to the aggregator."""
    started = time.perf_counter()
    site_spec = spec.for_site(site)
    prep = stages.preprocess(ws, site_spec)
    anon = stages.anonymize(ws, site_spec, prep.curated, key)
    train = _approved_splits(ws, anon.approved, site, ["train"])
    stats = SiteFeatureStats(site=site, rows=len(train),
                             featurizer=Featurizer.fit(train, spec.model.features).to_dict())
    check_route(ws, spec, site, aggregation_site)
    sites = ws.load_sites()
    rs = round_store(ws, spec, run_key, aggregation_site)
    transfers: list[TransferRecord] = []
    _cross(ws, ModelMover.send(stats.model_dump_json().encode(), rs.store, rs.stats_key(site), sites.get(site),
                               sites.get(aggregation_site), f"feature statistics of {site} ({spec.name})"), transfers)
    public = None
    if spec.training.federated.secure_aggregation:
        public = secagg.public_key(site_private(ws, spec, run_key, site).private_key())
        _cross(ws, ModelMover.send(public.encode(), rs.store, rs.public_key_key(site), sites.get(site),
                                   sites.get(aggregation_site), f"secure-aggregation public key of {site} "
                                                                f"({spec.name})"), transfers)
    return SitePrepared(site=site, prep=prep, anon=anon, stats=stats, public_key=public, transfers=transfers,
                        seconds=time.perf_counter() - started)


def _fetch_global(ws: Workspace, rs: RoundStore, rnd: int, site: str, aggregation_site: str,
                  transfers: list[TransferRecord]) -> dict:
    sites = ws.load_sites()
    data, record = ModelMover.fetch(rs.store, rs.global_key(rnd), sites.get(aggregation_site), sites.get(site),
                                    rs.global_what(rnd))
    _cross(ws, record, transfers)
    return load_state(data)


def train_round(ws: Workspace, spec: JobSpec, site: str, run_key: str, rnd: int, approved: DatasetVersion,
                featurizer: dict, aggregation_site: str, secure: secagg.SecureRound | None = None,
                hold_gpus: HoldGpus | None = None) -> SiteUpdate:
    """Round ``rnd`` at ``site``: fetch the global model of round ``rnd - 1``, train ``local_epochs``
    on the approved part, send the new weights to the aggregator.

    A site that lists SSH hosts trains the round on one of them (``remote_round``): the host
    reads the approved part from the site's store and the global model from the round store, and
    writes the update there; this process checks the route first and then gets back only the
    host's report, whose crossings go to the audit log here as in-process ones do. With
    ``hold_gpus`` the round first takes its GPUs, waiting while other jobs hold them: on hosts that
    declare theirs it trains on the host they are on, seeing only them (without it, or when it holds
    none, on the first host); at a site without hosts it holds its share of the site's GPUs.

    With secure aggregation (``secure``: the attempt, its participants, their rows and public keys)
    the site keeps its new weights to itself (``site_private``; an SSH host writes them there instead
    of to the round store) and sends only them masked for the attempt; asked again for a later
    attempt of the same round it masks the kept weights again, without training. It sends nothing
    to an attempt the aggregator has closed (``AttemptClosed``)."""
    started = time.perf_counter()
    fed = spec.training.federated
    if fed.secure_aggregation != (secure is not None):
        raise ValueError(f"round {rnd} of {site}: training.federated.secure_aggregation is "
                         f"{fed.secure_aggregation} but the step was {'' if secure else 'not '}given a SecureRound")
    check_route(ws, spec, site, aggregation_site)
    ssh = _ssh_credentials(ws, site)
    if secure is None:
        if ssh is not None:
            return _train_round_on_host(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site, ssh,
                                        started, hold_gpus=hold_gpus)
        with _held(hold_gpus):
            trained = _train_here(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site)
        return _send_round(ws, spec, site, run_key, rnd, aggregation_site, started, trained, None)
    rs = round_store(ws, spec, run_key, aggregation_site)
    if rs.attempt_closed(rnd, secure.attempt):
        raise secagg.AttemptClosed(site, rnd, secure.attempt)
    private = site_private(ws, spec, run_key, site)
    kept = private.kept_update(rnd)
    if kept is not None:  # trained at an earlier attempt of this round: masked again, no training
        state, meta = kept
        host, job_id = private.noted_host(rnd)  # the SSH host that trained it stays in the round's lineage
        trained = _Trained(state, int(meta["rows"]), meta["metrics"], meta["epsilon"], [], reused=True, host=host,
                           job_id=job_id)
    elif ssh is not None:  # the host keeps the update in the site's store; it is masked here
        hosted = _train_round_on_host(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site, ssh,
                                      started, keep_at_site=True, hold_gpus=hold_gpus)
        kept = private.kept_update(rnd)
        if kept is None:
            raise TransientError(f"site {site}: the host {hosted.host} reported round {rnd} done, but its update is "
                                 f"not in the site's store ({private.prefix}); the round is tried again")
        private.note_host(rnd, hosted.host, hosted.job_id)
        trained = _Trained(kept[0], hosted.rows, hosted.metrics, hosted.epsilon, hosted.transfers,
                           host=hosted.host, job_id=hosted.job_id)
    else:
        with _held(hold_gpus):
            trained = _train_here(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site)
        private.keep_update(rnd, trained.state, trained.rows, trained.metrics, trained.epsilon)
    return _send_round(ws, spec, site, run_key, rnd, aggregation_site, started, trained,
                       (secure, private.private_key()))


def _held(hold_gpus: HoldGpus | None) -> AbstractContextManager[Mapping[str, Sequence[int]] | None]:
    """The GPUs a round trains on, held while the block runs (None: it holds none, or none by host)."""
    return hold_gpus() if hold_gpus is not None else nullcontext(None)


@dataclass
class _Trained:
    """A site's new weights for a round and what training measured."""

    state: dict
    rows: int
    metrics: dict[str, float]
    epsilon: float | None
    transfers: list[TransferRecord]
    reused: bool = False
    host: str | None = None
    job_id: str | None = None


def _train_here(ws: Workspace, spec: JobSpec, site: str, run_key: str, rnd: int, approved: DatasetVersion,
                featurizer: dict, aggregation_site: str) -> _Trained:
    """Local epochs in this process from the global model of round ``rnd - 1``."""
    fed = spec.training.federated
    rs = round_store(ws, spec, run_key, aggregation_site)
    transfers: list[TransferRecord] = []
    global_state = _fetch_global(ws, rs, rnd - 1, site, aggregation_site, transfers)
    train = _approved_splits(ws, approved, site, ["train"])
    val = _approved_splits(ws, approved, site, ["val"])
    # One GPU of this machine no other job holds (a site without hosts trains here); a CPU job: the CPU.
    with hold_for_job(spec.resources.gpus, job=spec.name, site=site, count=1) as held:
        result = train_local(spec.model, Featurizer.from_dict(featurizer), global_state, train, val,
                             spec.data_schema.label, site=site, rnd=rnd, epochs=fed.local_epochs,
                             mu=fed.mu if fed.aggregator == "fedprox" else 0.0, dp=fed.dp,
                             threads=spec.model.threads or spec.resources.cpus,
                             device=job_device(spec.resources.gpus, held))
    return _Trained(result.state, result.rows, result.metrics, result.epsilon, transfers)


def _send_round(ws: Workspace, spec: JobSpec, site: str, run_key: str, rnd: int, aggregation_site: str,
                started: float, trained: _Trained, secure: tuple[secagg.SecureRound, bytes] | None) -> SiteUpdate:
    """Send the round's update to the round store: plain, or (``secure``: the attempt and the site's private key)
    only masked, written only where nothing is — when the aggregator closes an attempt it fills the missing sites'
    places first, so an upload that races the close either lands before it or not at all."""
    rs = round_store(ws, spec, run_key, aggregation_site)
    sites = ws.load_sites()
    transfers = list(trained.transfers)
    if secure is None:
        data = state_bytes(trained.state)
        key, what = rs.update_key(rnd, site), rs.update_what(rnd, site)
    else:
        attempt = secure[0].attempt
        data = _masked(spec, site, run_key, rnd, trained.state, secure[1], secure[0])
        key, what = rs.masked_key(rnd, attempt, site), rs.masked_what(rnd, attempt, site)
    try:
        _cross(ws, ModelMover.send(data, rs.store, key, sites.get(site), sites.get(aggregation_site), what,
                                   exclusive=secure is not None), transfers)
    except FileExistsError:
        raise secagg.AttemptClosed(site, rnd, secure[0].attempt) from None
    return SiteUpdate(site=site, round=rnd, rows=trained.rows, metrics=trained.metrics, epsilon=trained.epsilon,
                      update_sha256=hashlib.sha256(data).hexdigest(), transfers=transfers,
                      seconds=time.perf_counter() - started, host=trained.host, job_id=trained.job_id,
                      attempt=secure[0].attempt if secure else 1, masked_for=secure[0].participants if secure else [],
                      reused=trained.reused)


def _masked(spec: JobSpec, site: str, run_key: str, rnd: int, state: dict, private: bytes,
            secure: secagg.SecureRound) -> bytes:
    """``site``'s share of the weighted mean (``state`` * its rows / the participants' rows), masked for ``secure``."""
    if site not in secure.rows:
        raise ValueError(f"round {rnd}: site {site} is not among the participants {secure.participants}")
    if secure.public_keys[site] != secagg.public_key(private):
        raise SpecError(f"job {spec.name}", [Problem(f"{site}.public_key", (
            f"the aggregator's public key for site {site} is not the one this site made for run key {run_key} "
            "(its key in federated-site/ was replaced?): start the job again with a new run key"))])
    weight = secure.rows[site] / sum(secure.rows.values())
    encoded = secagg.encode(site, secagg.flatten(state, state) * weight, len(secure.rows))
    masked = secagg.mask(site, encoded, private, secure.public_keys, [spec.name, run_key, rnd, secure.attempt])
    return secagg.to_bytes(masked)


def _ssh_credentials(ws: Workspace, site: str) -> SshCredentials | None:
    """The site block's SSH key and pinned host keys when ``site`` lists SSH hosts (None: it lists none)."""
    if not ws.load_sites().get(site).hosts:
        return None
    secret = ws.secrets.get(site) if ws.secrets is not None else None
    if secret is None or not secret.has_ssh:
        raise SpecError("site credentials", [Problem(
            f"{site}.ssh_private_key", f"site {site} trains its federated rounds on SSH hosts but its block holds no "
            f"SSH key: run `hybridtrain credentials {site} --ssh-key FILE --known-hosts FILE`")])
    from hybridtrain.remote.ssh_site import SshCredentials  # lazy: heavy (paramiko)

    return SshCredentials(private_key=secret.ssh_private_key, known_hosts=secret.ssh_known_hosts or "")


def _train_round_on_host(ws: Workspace, spec: JobSpec, site: str, run_key: str, rnd: int, approved: DatasetVersion,
                         featurizer: dict, aggregation_site: str, ssh: SshCredentials, started: float,
                         keep_at_site: bool = False, hold_gpus: HoldGpus | None = None) -> SiteUpdate:
    from hybridtrain.federated.remote_round import ssh_train_round  # lazy: heavy (paramiko)
    from hybridtrain.placement.node_fit import held_hosts

    sites = ws.load_sites()
    s = sites.get(site)
    with _held(hold_gpus) as gpus:
        host = held_hosts(s, gpus)[0] if gpus else s.hosts[0]
        report, label = ssh_train_round(ws, spec, s, sites.get(aggregation_site), host, ssh.private_key,
                                        ssh.known_hosts, run_key, rnd, approved, featurizer,
                                        keep_at_site=keep_at_site, devices=gpus)
    for record in report.transfers:
        _audit_crossing(ws, record)
    return SiteUpdate(site=site, round=rnd, rows=report.rows, metrics=report.metrics, epsilon=report.epsilon,
                      update_sha256=report.update_sha256, transfers=report.transfers,
                      seconds=time.perf_counter() - started, host=label, job_id=report.job_id)


def evaluate_global(ws: Workspace, spec: JobSpec, site: str, run_key: str, rnd: int, approved: DatasetVersion,
                    featurizer: dict, aggregation_site: str) -> SiteEvaluation:
    """The global model of round ``rnd`` on ``site``'s test split (metrics only leave the site)."""
    started = time.perf_counter()
    rs = round_store(ws, spec, run_key, aggregation_site)
    transfers: list[TransferRecord] = []
    state = _fetch_global(ws, rs, rnd, site, aggregation_site, transfers)
    test = _approved_splits(ws, approved, site, ["test"])
    label = spec.data_schema.label
    metrics = evaluate_state(spec.model, Featurizer.from_dict(featurizer), state, test, label, "test")
    return SiteEvaluation(site=site, metrics=metrics, champion_metrics=_champion_metrics(ws, spec, test),
                          transfers=transfers, seconds=time.perf_counter() - started)


def _champion_metrics(ws: Workspace, spec: JobSpec, test: pd.DataFrame) -> dict[str, float] | None:
    """The registered champion's test metrics on this site's rows (None: no champion yet)."""
    from hybridtrain.tracking.model_registry import CHAMPION, Registry
    from hybridtrain.training import evaluation

    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    champ = registry.by_alias(spec.registry.model_name, CHAMPION)
    if champ is None:
        return None
    model, feat = registry.load(champ.name, champ.version)
    return evaluation.evaluate(model, Featurizer.from_dict(feat), test, spec.data_schema.label)
