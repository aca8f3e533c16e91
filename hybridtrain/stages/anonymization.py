"""Anonymization stage: curated → approved — treatments, k-anonymity, then a leak scan of what was written."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hybridtrain.datasets import data_gates, partitioned
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.reporting import progress
from hybridtrain.specs.job import JobSpec
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    pass

from hybridtrain.datasets.anonymizer import Anonymizer
from hybridtrain.datasets.leak_scan import LeakScan
from hybridtrain.stages.results import AnonymizeResult
from hybridtrain.stages.site_access import audit, dataset_at, workspace_repo


def anonymize(ws: Workspace, spec: JobSpec, curated: DatasetVersion, key: bytes) -> AnonymizeResult:
    """Curated → approved: treatments, k-anonymity, sampling, then a leak scan of what was written."""

    started = time.perf_counter()
    sites = ws.load_sites()
    site = spec.dataset.site
    progress.report("anonymize", "start", f"anonymize started at {site}: curated {curated.md5[:8]}", site=site)
    repo = workspace_repo(ws, sites, site)
    source_dir = dataset_at(ws, sites, curated, site, site)
    source = partitioned.read(source_dir)
    scan = LeakScan.from_source(source, spec)
    result = Anonymizer(spec, key).apply(source)
    frame = result.frame
    keys = source.loc[frame.index, spec.data_schema.entity_key]
    keep = partitioned.unit_interval(keys, "sync-sample") < spec.sync.sample_fraction
    approved_frame = frame[keep]
    approved_path = ws.tier_path("approved", spec.name)
    # Unusable data fails here, at its own site: nothing written, versioned, synced or registered.
    data_gates.check(spec, approved_frame, result.report)
    written = partitioned.write(approved_frame, ws.path(approved_path), sort_by=None)
    # Scan exactly the bytes that may leave: the files as written, read back.
    import pyarrow.parquet as pq  # lazy: heavy (pyarrow)

    leak = None
    for f in written:
        part = scan.scan(pq.read_table(f).to_pandas(), where=str(f.relative_to(ws.root)))
        leak = part if leak is None else leak.merge(part)
    assert leak is not None
    promotion_inputs = {"path": approved_path, "tier_from": "curated", "tier_to": "approved",
                        "from_md5": curated.md5, "spec_hash": spec.spec_hash(), "site": site,
                        "k_achieved": result.report.k_achieved, "rows_suppressed": result.report.rows_suppressed,
                        "leak_scan_hits": leak.hits, "reason": "anonymized, k-anonymous, leak scan of the "
                                                              "written files"}
    if not leak.clean:
        audit(ws).append(actor=ws.actor, action="tier_promotion", subject=f"dataset {approved_path}",
                         inputs=promotion_inputs, outcome="refused: raw sensitive values found by the leak scan")
    leak.raise_if_leaky(approved_path)
    approved = repo.add(approved_path, "approved", site)
    repo.push(approved, remote=sites.get(site).dvc_remote)
    audit(ws).append(actor=ws.actor, action="tier_promotion", subject=f"dataset {approved_path}",
                     inputs={**promotion_inputs, "to_md5": approved.md5}, outcome=f"approved {approved.md5}")
    seconds = time.perf_counter() - started
    progress.report("anonymize", "end", f"anonymize finished at {site} in {seconds:.1f} s: {len(approved_frame)} rows "
                    f"approved, k={result.report.k_achieved}, {result.report.rows_suppressed} suppressed, leak scan "
                    f"clean (approved md5 {approved.md5[:8]})", site=site, seconds=seconds)
    return AnonymizeResult(
        approved=approved,
        report=result.report.model_dump(mode="json"),
        leak_scan=leak.model_dump(mode="json") if hasattr(leak, "model_dump") else dict(leak.__dict__),
        rows_sampled_out=int((~keep).sum()),
        site=site,
        seconds=seconds,
    )
