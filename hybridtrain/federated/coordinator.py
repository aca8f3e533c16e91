"""Federation: the aggregator's loop — prepare the sites, then per round dispatch, tolerate drop-outs, aggregate, checkpoint.

Where the site steps run is the dispatcher's business (``InlineSites`` here, in this process;
``flows/federated.py`` in each site's work pool): it returns, per site, the step's result or
the reason the site dropped out (failed, its pool had no live worker for ``site_lost_s``, did
not report within ``round_timeout_s``). A round goes on with the sites that reported when they are at least
``min_sites`` and ``min_fraction`` of the data sites; a dropped site is recorded on the round
and asked again next round (a site that was never prepared is prepared first). Fewer fails the
run with ``NotEnoughSites`` — the last committed round stays, and running again with the same
``run_key`` resumes after it, as it does after the aggregator itself crashed.

With ``training.federated.secure_aggregation`` the aggregator only ever reads masked updates and
their sum (``secure_round``): a round is complete when every site it asked has sent its masked
update; when one drops out first, that attempt is closed and the others are asked again for the
next one (they mask the update they kept; no retraining), recorded on the round as ``attempts``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import torch
from pydantic import BaseModel, Field

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.federated import aggregation, features
from hybridtrain.federated import secure_aggregation as secagg
from hybridtrain.federated.local import build_model
from hybridtrain.federated.planning import required_sites
from hybridtrain.federated.rounds import FederationState, RoundRecord, RoundStore, SecureAttempt
from hybridtrain.federated.secure_aggregation import SecureRound
from hybridtrain.federated.site import SiteEvaluation, SitePrepared, SiteUpdate, round_store
from hybridtrain.specs.job import JobSpec
from hybridtrain.training.featurizer import Featurizer
from hybridtrain.training.model import TabularMLP
from hybridtrain.workspace import Workspace


class NotEnoughSites(HybridtrainError):
    """Too few sites reported for a federated step to count."""

    exit_code = 8
    retryable = True

    def __init__(self, job: str, step: str, reported: list[str], dropped: Mapping[str, str], needed: int):
        why = "; ".join(f"{s}: {r}" for s, r in dropped.items())
        super().__init__(f"job {job!r}: {step} got {len(reported)} site(s) ({', '.join(reported) or 'none'}), needs "
                         f"{needed} (training.federated.min_sites / min_fraction); dropped: {why}. Bring the sites' "
                         "workers back and run again with the same run key: it resumes after the last finished round")


class SiteDispatcher(Protocol):
    """Runs one step at many sites; per site the result, or the reason it dropped out."""

    def prepare(self, sites: list[str], rnd: int = 0) -> dict[str, SitePrepared | str]: ...

    def train(self, rnd: int, approved: dict[str, DatasetVersion], featurizer: dict,
              secure: SecureRound | None = None) -> dict[str, SiteUpdate | str]:
        """Round ``rnd`` at the sites of ``approved``; with ``secure``, the attempt they mask their update for."""
        ...

    def evaluate(self, rnd: int, approved: dict[str, DatasetVersion],
                 featurizer: dict) -> dict[str, SiteEvaluation | str]: ...


class FederationOutcome(BaseModel):
    """A finished federated run: its state, the final global model's test metrics, every crossing."""

    state: FederationState
    evaluations: dict[str, SiteEvaluation]
    dropped_at_evaluation: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(description="Row-weighted mean of the sites' test metrics (n: total rows).")
    transfers: list[TransferRecord]
    resumed_after_round: int | None = None
    seconds: float

    def prepared(self) -> dict[str, SitePrepared]:
        return {s: SitePrepared.model_validate(p) for s, p in self.state.prepared.items()}


def weighted_metrics(per_site: Mapping[str, Mapping[str, float]], rows: Mapping[str, int]) -> dict[str, float]:
    """Row-weighted mean of each metric over the sites (``n``: the rows summed)."""
    total = sum(rows[s] for s in per_site)
    out: dict[str, float] = {}
    keys = set.intersection(*(set(m) for m in per_site.values())) if per_site else set()
    for k in sorted(keys - {"n"}):
        vals = [(per_site[s][k], rows[s]) for s in per_site]
        if all(math.isfinite(v) for v, _ in vals):
            out[k] = sum(v * n for v, n in vals) / total
    out["n"] = float(total)
    return out


def _split(results: Mapping[str, object], kind: type) -> tuple[dict, dict[str, str]]:
    ok = {s: r for s, r in results.items() if isinstance(r, kind)}
    return ok, {s: str(r) for s, r in results.items() if not isinstance(r, kind)}


def global_model(spec: JobSpec, featurizer: dict, state: dict[str, torch.Tensor]) -> tuple[TabularMLP, Featurizer]:
    f = Featurizer.from_dict(featurizer)
    return build_model(spec.model, f, state).eval(), f


def run_federation(ws: Workspace, spec: JobSpec, run_key: str, aggregation_site: str, sites: SiteDispatcher,
                   on_round: Callable[[RoundRecord], None] | None = None) -> FederationOutcome:
    """Prepare, ``rounds`` rounds, evaluate; resumes a run of the same ``run_key`` after its last committed round."""
    started = time.perf_counter()
    fed = spec.training.federated
    data_sites = [d.site for d in spec.site_datasets()]
    needed = required_sites(spec)
    rs = round_store(ws, spec, run_key, aggregation_site)
    state = rs.resume()
    resumed = state.completed if state is not None else None
    if state is not None and on_round is not None:
        for record in state.rounds:  # a resumed run's tracking shows the rounds it inherited
            on_round(record)

    def prepare_missing(prepared: dict[str, dict], rnd: int) -> dict[str, str]:
        """Prepare the sites not prepared yet (before round ``rnd``; 0: at the start)."""
        missing = [s for s in data_sites if s not in prepared]
        if not missing:
            return {}
        ok, dropped = _split(sites.prepare(missing, rnd), SitePrepared)
        prepared.update({s: p.model_dump(mode="json") for s, p in ok.items()})
        return dropped

    if state is None:
        prepared: dict[str, dict] = {}
        dropped = prepare_missing(prepared, 0)
        if len(prepared) < needed:
            raise NotEnoughSites(spec.name, "preparing the data", sorted(prepared), dropped, needed)
        stats = [SitePrepared.model_validate(prepared[s]).stats for s in data_sites if s in prepared]
        featurizer = features.merge(stats)
        model = build_model(spec.model, featurizer, seed=spec.model.seed)
        sha = rs.save_global(0, model.state_dict())
        state = FederationState(job=spec.name, run_key=run_key, featurizer=featurizer.to_dict(),
                                feature_rows={s.site: s.rows for s in stats}, prepared=prepared, initial_sha256=sha)
        rs.commit(state)

    for rnd in range(state.completed + 1, fed.rounds + 1):
        round_started = time.perf_counter()
        dropped = prepare_missing(state.prepared, rnd)
        approved = {s: SitePrepared.model_validate(p).anon.approved for s, p in state.prepared.items()}
        attempts: list[SecureAttempt] = []
        if fed.secure_aggregation:
            result = secure_round(spec, run_key, rs, sites, rnd, approved, state, needed, dropped)
            ok, participants, rows, new_state = result.updates, result.participants, result.rows, result.state
            attempts, transfers, seconds = result.attempts, result.transfers, result.seconds
        else:
            ok, failed = _split(sites.train(rnd, approved, state.featurizer), SiteUpdate)
            dropped.update(failed)
            if len(ok) < needed:
                raise NotEnoughSites(spec.name, f"round {rnd}", sorted(ok), dropped, needed)
            like = rs.load_global(rnd - 1)
            updates = {s: (rs.load_global_update(rnd, s), u.rows) for s, u in ok.items()}
            new_state = aggregation.fedavg(updates, like)
            transfers = [t for u in ok.values() for t in u.transfers]
            seconds = {s: u.seconds for s, u in ok.items()}
            participants, rows = sorted(ok), {s: u.rows for s, u in ok.items()}
        sha = rs.save_global(rnd, new_state)
        record = RoundRecord(
            round=rnd, participants=participants, dropped=dropped, rows=rows,
            site_metrics={s: u.metrics for s, u in ok.items()},
            global_metrics=weighted_metrics({s: {k.removeprefix("global_"): v for k, v in u.metrics.items()
                                                 if k.startswith("global_val_") and k != "global_val_n"}
                                             for s, u in ok.items()}, {s: rows[s] for s in ok}),
            epsilon={s: u.epsilon for s, u in ok.items() if u.epsilon is not None},
            site_seconds=seconds, site_hosts={s: u.host for s, u in ok.items() if u.host}, transfers=transfers,
            seconds=time.perf_counter() - round_started, global_sha256=sha,
            secure_aggregation=fed.secure_aggregation, attempts=attempts)
        state = state.model_copy(update={"rounds": [*state.rounds, record]})
        rs.commit(state)  # the round counts from here: a crash after this resumes at the next one
        if on_round is not None:
            on_round(record)

    approved = {s: SitePrepared.model_validate(p).anon.approved for s, p in state.prepared.items()}
    ok, dropped = _split(sites.evaluate(state.completed, approved, state.featurizer), SiteEvaluation)
    if len(ok) < needed:
        raise NotEnoughSites(spec.name, "the final evaluation", sorted(ok), dropped, needed)
    metrics = weighted_metrics({s: e.metrics for s, e in ok.items()},
                               {s: int(e.metrics.get("n", 0)) or 1 for s, e in ok.items()})
    transfers = [t for p in state.prepared.values() for t in SitePrepared.model_validate(p).transfers]
    transfers += [t for r in state.rounds for t in r.transfers] + [t for e in ok.values() for t in e.transfers]
    return FederationOutcome(state=state, evaluations=ok, dropped_at_evaluation=dropped, metrics=metrics,
                             transfers=transfers, resumed_after_round=resumed, seconds=time.perf_counter() - started)


class SecureResult(NamedTuple):
    """A securely aggregated round: who is in the sum, the sum, how it went."""

    updates: dict[str, SiteUpdate]  # the reports of the final attempt (a site whose update arrived late has none)
    participants: list[str]
    rows: dict[str, int]
    state: dict[str, torch.Tensor]
    attempts: list[SecureAttempt]
    transfers: list[TransferRecord]
    seconds: dict[str, float]


def secure_round(spec: JobSpec, run_key: str, rs: RoundStore, sites: SiteDispatcher, rnd: int,
                 approved: dict[str, DatasetVersion], state: FederationState, needed: int,
                 dropped: dict[str, str]) -> SecureResult:
    """Round ``rnd`` with secure aggregation: attempts until every participant's masked update arrived.

    Attempt 1 asks every prepared site (its participant set is written first, ``begin_attempt``:
    an aggregator that resumes asks the same). When some drop out, their places are sealed
    (``seal``: a late upload cannot land after it; one that landed first counts, and if all did the
    attempt is complete after all), the attempt is closed, and the survivors are asked for the
    next attempt, where they mask the update they kept again, weighted and masked for the smaller
    set. Records drop-outs in ``dropped``."""
    needed = max(needed, 2)  # one site's "sum" would be its update
    prepared = {s: SitePrepared.model_validate(state.prepared[s]) for s in approved}
    keyless = sorted(s for s, p in prepared.items() if not p.public_key)
    if keyless:
        raise SpecError(f"job {spec.name}", [Problem("training.federated.secure_aggregation", (
            f"run key {run_key} was prepared without it ({', '.join(keyless)} sent no public key): run the job with "
            "a new run key"))])
    like = rs.load_global(rnd - 1)
    size = len(secagg.flatten(like, like))
    # An aggregator that resumes mid-round goes on after the last closed attempt, with its survivors.
    attempts = rs.closed_attempts(rnd)
    participants = sorted(approved)
    for closed in attempts:
        dropped.update(closed.dropped)
        participants = [s for s in closed.participants if s not in closed.dropped]
    attempt = len(attempts) + 1
    transfers: list[TransferRecord] = []
    seconds: dict[str, float] = {}
    while True:
        # The attempt's participants are fixed once written: a resumed aggregator asks the ones its predecessor
        # asked, so the steps in flight are adopted (PoolSites) and their masks fit.
        participants = [s for s in rs.begin_attempt(rnd, attempt, participants) if s in approved]
        if len(participants) < needed:
            raise NotEnoughSites(spec.name, f"round {rnd} (secure aggregation, attempt {attempt})", participants,
                                 dropped, needed)
        secure = SecureRound(attempt=attempt, rows={s: prepared[s].stats.rows for s in participants},
                             public_keys={s: prepared[s].public_key for s in participants})
        results = sites.train(rnd, {s: approved[s] for s in participants}, state.featurizer, secure)
        ok, failed = _split(results, SiteUpdate)
        unusable: dict[str, str] = {}
        for s, u in list(ok.items()):
            transfers += u.transfers
            seconds[s] = seconds.get(s, 0.0) + u.seconds
            if u.attempt != attempt or u.masked_for != participants:
                unusable[s] = (f"its update was masked for attempt {u.attempt} of {', '.join(u.masked_for)}, not "
                               f"attempt {attempt} of {', '.join(participants)}")
                del ok[s]
        failed.update({s: "no report" for s in participants if s not in ok and s not in failed and s not in unusable})
        if failed:
            sealed = rs.seal(rnd, attempt, sorted(failed))
            failed = {s: why for s, why in failed.items() if s in sealed}  # the others' updates arrived after all
        failed.update(unusable)
        if not failed:
            vectors = {s: secagg.from_bytes(rs.store.get_bytes(rs.masked_key(rnd, attempt, s))) for s in participants}
            failed = {s: f"its masked update holds {len(v)} values, the model {size}" for s, v in vectors.items()
                      if len(v) != size}
        attempts.append(SecureAttempt(attempt=attempt, participants=participants, dropped=failed))
        dropped.update(failed)
        if not failed:
            return SecureResult(ok, participants, dict(secure.rows), secagg.aggregate(vectors.values(), like),
                                attempts, transfers, seconds)
        rs.close_attempt(rnd, attempt, participants, failed)
        participants, attempt = sorted(ok), attempt + 1


class InlineSites:
    """Every site step in this process, one site after another (tests, benchmarks, ``dispatch: inline``).

    A site whose step raises a ``HybridtrainError`` drops out of that step with the error as its
    reason; anything else is a bug and propagates.
    """

    def __init__(self, ws: Workspace, spec: JobSpec, run_key: str, aggregation_site: str, key: bytes,
                 down: Callable[[str, str, int], bool] | None = None):
        self.ws, self.spec, self.run_key, self.agg, self.key = ws, spec, run_key, aggregation_site, key
        self.down = down or (lambda step, site, rnd: False)

    def _each(self, step: str, rnd: int, sites: list[str], call: Callable[[str], object]) -> dict[str, object]:
        out: dict[str, object] = {}
        for site in sites:
            if self.down(step, site, rnd):
                out[site] = f"site {site} is down"
                continue
            try:
                out[site] = call(site)
            except HybridtrainError as exc:
                out[site] = f"{type(exc).__name__}: {exc}"
        return out

    def prepare(self, sites: list[str], rnd: int = 0) -> dict[str, SitePrepared | str]:
        from hybridtrain.federated import site as steps

        return self._each("prepare", 0, sites, lambda s: steps.prepare(self.ws, self.spec, s, self.key, self.run_key,
                                                                       self.agg))

    def train(self, rnd: int, approved: dict[str, DatasetVersion], featurizer: dict,
              secure: SecureRound | None = None) -> dict[str, SiteUpdate | str]:
        from hybridtrain.federated import site as steps

        return self._each("train", rnd, sorted(approved), lambda s: steps.train_round(
            self.ws, self.spec, s, self.run_key, rnd, approved[s], featurizer, self.agg, secure))

    def evaluate(self, rnd: int, approved: dict[str, DatasetVersion],
                 featurizer: dict) -> dict[str, SiteEvaluation | str]:
        from hybridtrain.federated import site as steps

        return self._each("evaluate", rnd, sorted(approved), lambda s: steps.evaluate_global(
            self.ws, self.spec, s, self.run_key, rnd, approved[s], featurizer, self.agg))
