"""A control plane's train stage in its own process: ``python -m tests.integration.cloud_train_child CONFIG.json``.

The cloud multi-node tests SIGKILL it mid-run — the way a worker host dies — so the instances it
started are left running, tagged with the job, for the next attempt to find.

CONFIG: ``{"root": workspace root, "spec": job spec dict, "approved": DatasetVersion dict, "site": name,
"run_id": MLflow run, "run_key": str, "private_key": SSH key text}``.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from pydantic import SecretStr

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.remote.ssh_site import SshCredentials
from hybridtrain.specs.job import parse_spec
from hybridtrain.stages.training import train
from hybridtrain.workspace import Workspace


def main(path: str) -> None:
    config = json.loads(Path(path).read_text())
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    ws = Workspace.resolve(config["root"])
    train(ws, parse_spec(config["spec"]), DatasetVersion.model_validate(config["approved"]), config["site"],
          config["run_id"], config["run_key"],
          ssh=SshCredentials(private_key=SecretStr(config["private_key"]), known_hosts=""),
          on_line=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main(sys.argv[1])
