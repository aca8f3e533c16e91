"""Serving deployments: one per release target of the churn spec, each in the work pool of the site that serves it."""

from __future__ import annotations

from pathlib import Path

import yaml

from hybridtrain.serving.service import serving_site
from hybridtrain.specs.job import load_spec
from hybridtrain.workspace import Workspace
from tests.fixtures.workspaces import make_workspace

ROOT = Path(__file__).resolve().parents[2]


def test_each_target_has_a_serving_deployment_in_its_sites_pool(tmp_path):
    ws = Workspace.resolve(make_workspace(tmp_path / "ws"))
    spec = load_spec(ws.root / "jobs" / "churn.yaml")
    sites = ws.load_sites()
    deployments = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    serving = {d["parameters"]["target"]: d for d in deployments if d["entrypoint"] == "flows/serving.py:serve_model"}
    assert set(serving) == {t.name for t in spec.promotion.release_targets if t.kind != "edge"}
    for target in spec.promotion.release_targets:
        site = sites.get(serving_site(ws, target))
        assert serving[target.name]["work_pool"]["name"] == site.work_pool, target.name
    assert serving_site(ws, next(t for t in spec.promotion.release_targets if t.kind == "object_store")) == "cloud-eu"
    assert serving_site(ws, next(t for t in spec.promotion.release_targets if t.kind == "directory")) == "onprem-dc1"
