"""Data tasks: preprocess, anonymize (with the key from a Prefect Secret) and sync, one core call each."""

from __future__ import annotations

from prefect import task
from prefect.blocks.system import Secret

from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.job import JobSpec
from hybridtrain.workspace import Workspace
from tasks.retry import BACKOFF_S, only_transient


@task(name="preprocess", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def preprocess(ws: Workspace, spec: JobSpec) -> stages.PreprocessResult:
    return stages.preprocess(ws, spec)


def pseudonym_key(block_name: str) -> bytes:
    """The keyed-pseudonym secret; it lives only in Prefect's encrypted block store."""
    try:
        value = Secret.load(block_name).get()
    except ValueError:
        raise SpecError(
            "Prefect blocks",
            [Problem(block_name, "Secret block not found: run `hybridtrain init` (or `make deploy`) to create it")],
        ) from None
    return str(value).encode()


@task(name="anonymize", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def anonymize(ws: Workspace, spec: JobSpec, curated: DatasetVersion) -> stages.AnonymizeResult:
    return stages.anonymize(ws, spec, curated, pseudonym_key(ws.pseudonym_key_block))


@task(name="sync", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def sync(ws: Workspace, approved: DatasetVersion, destination: str, spec: JobSpec) -> stages.SyncResult:
    return stages.sync(ws, approved, destination, spec)
