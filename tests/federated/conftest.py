"""Federated fixtures: a workspace with three on-prem data sites (each its own pool and store) and the sample data split over them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.fixtures.workspaces import make_workspace

DATA_SITES = ["onprem-dc1", "onprem-dc2", "onprem-dc3"]
ROWS = 6000
STAY_RULE = {"name": "restricted data stays at its site", "when": {"sensitivity": ["restricted"]},
             "stay_at_data_site": True}


def add_sites(root: Path) -> None:
    """Two more on-prem sites beside onprem-dc1, each with its own pool and store; restricted data stays home."""
    path = root / "deployments" / "sites.yaml"
    data = yaml.safe_load(path.read_text())
    base = data["sites"][0]
    for name in DATA_SITES[1:]:
        data["sites"].append({**base, "name": name, "work_pool": name,
                              "store": {"kind": "local", "path": f".hybridtrain/stores/{name}"}})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    policy = root / "deployments" / "policy.yaml"
    p = yaml.safe_load(policy.read_text())
    p["rules"].append(STAY_RULE)
    policy.write_text(yaml.safe_dump(p, sort_keys=False))


def federated_spec(root: Path, parts: list[dict], name: str = "fedchurn", **training) -> Path:
    """jobs/churn.yaml made federated: the parts, restricted data, small rounds, no pinned site."""
    data = yaml.safe_load((root / "jobs" / "churn.yaml").read_text())
    data["metadata"]["name"] = name
    data["registry"]["model_name"] = f"{name}-model"
    data["dataset"] = {**parts[0], "sites": parts[1:]}
    data.pop("placement", None)
    data["data_policy"] = {"sensitivity": "restricted", "residency": ["EU"]}
    data["model"].update({"batch_size": 128})
    data["sync"] = {"sample_fraction": 1.0}
    data["sensitive"]["columns"]["date_of_birth"]["level"] = "decade"
    data["sensitive"]["columns"]["postcode"]["level"] = "area"
    # k=5 over these levels suppresses more than the demo's 5 % of a 1,100-row site sample (the data gate's
    # default is for real datasets), as in the flow tests.
    data["sensitive"]["max_suppressed_fraction"] = 0.25
    data["promotion"]["release_targets"] = [data["promotion"]["release_targets"][0]]
    data["training"] = {"mode": "auto", "federated": {"rounds": 3, "local_epochs": 1, "min_sites": 2,
                                                      "min_fraction": 0.5, **training}}
    path = root / "jobs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def build_federated_workspace(dest: Path, rows: int = ROWS) -> tuple[Path, list[dict]]:
    from hybridtrain.cli.federated import ensure_site_data
    from hybridtrain.workspace import Workspace

    root = make_workspace(dest)
    add_sites(root)
    parts = ensure_site_data(Workspace.resolve(root), DATA_SITES, rows, 20261121)
    return root, parts


@pytest.fixture(scope="module")
def fed_workspace(tmp_path_factory) -> tuple[Path, list[dict]]:
    return build_federated_workspace(tmp_path_factory.mktemp("fed") / "ws")
