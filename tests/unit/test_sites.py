"""Sites catalog: validation, amortized on-prem price, lookups with helpful errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hybridtrain.errors import SpecError
from hybridtrain.specs.sites import OnPremCost, SitesCatalog

ROOT = Path(__file__).resolve().parents[2]


def catalog_data() -> dict:
    return yaml.safe_load((ROOT / "deployments" / "sites.yaml").read_text())


def test_amortized_price_by_hand():
    cost = OnPremCost(capex_per_gpu_usd=17520, lifetime_years=2, power_kw_per_gpu=0.5,
                      power_price_per_kwh=0.2, utilization=0.5, opex_per_gpu_year_usd=0)
    # 17520 USD over 17520 hours = 1 USD/h at full use, 2 USD/h at 50 %, plus 0.5 kW * 0.2 USD/kWh.
    assert cost.price_per_gpu_hour() == pytest.approx(2.1)


def test_project_catalog_loads_with_prices(tmp_path):
    cat = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
    assert cat.names == ["onprem-dc1", "cloud-eu"]
    assert cat.get("cloud-eu").gpu_hour_price == pytest.approx(4.0966)
    assert 0.5 < cat.get("onprem-dc1").gpu_hour_price < cat.get("cloud-eu").gpu_hour_price
    assert cat.pools == ["cloud", "onprem"]
    assert cat.get("onprem-dc1").store_url(tmp_path) == str(tmp_path / ".hybridtrain/stores/onprem-dc1")


def test_unknown_site_lists_known_ones():
    cat = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
    with pytest.raises(SpecError) as exc:
        cat.get("cloud-us")
    assert "known sites: onprem-dc1, cloud-eu" in str(exc.value)


def assert_refused(tmp_path, mutate, path: str, words: str) -> None:
    """The catalog after ``mutate`` is refused with a problem at ``path`` whose message holds ``words``."""
    data = catalog_data()
    mutate(data)
    f = tmp_path / "sites.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as exc:
        SitesCatalog.load(f)
    assert any(p.path == path and words in p.message for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (lambda d: d["sites"].append(dict(d["sites"][0])), "sites", "appears twice"),
        (lambda d: d["sites"][1].pop("price_per_gpu_hour"), "sites[1]", "give price_per_gpu_hour or onprem_cost"),
        (lambda d: d["sites"][0].update(kind="datacenter"), "sites[0].kind", "'onprem' or 'cloud'"),
        (lambda d: d["sites"][1]["store"].update(kind="ftp"), "sites[1].store", "kind"),
        (lambda d: d["sites"][0].update(name="On Prem"), "sites[0].name", "pattern"),
    ],
)
def test_invalid_catalogs_name_the_field(tmp_path, mutate, path, words):
    assert_refused(tmp_path, mutate, path, words)


HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHLlzJ1hWXMAHNd1YyA7qXJ0ybsN/c3nkDGKEeDXKCWk"
INSTANCES = {"region": "eu-west-1", "image_id": "ami-0abc", "instance_type": "p4d.24xlarge", "gpus_per_instance": 8,
             "username": "ubuntu", "host_key": HOST_KEY}


def test_a_cloud_site_declares_how_it_starts_instances(tmp_path):
    data = catalog_data()
    data["sites"][1]["instances"] = dict(INSTANCES, workdir="/scratch/{instance_id}")
    f = tmp_path / "sites.yaml"
    f.write_text(yaml.safe_dump(data))
    block = SitesCatalog.load(f).get("cloud-eu").instances
    assert (block.provider, block.port, block.max_instances, block.host_key) == ("ec2", 22, 8, HOST_KEY)


@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (lambda d: d["sites"][0].update(instances=INSTANCES), "sites[0]",
         "sites.onprem-dc1.instances applies to kind: cloud sites only"),
        (lambda d: d["sites"][1].update(instances=dict(INSTANCES, host_key="AAAAC3Nza")), "sites[1].instances.host_key",
         "not an SSH public key: give the image's host public key as one line 'ssh-ed25519 AAAA...'"),
        (lambda d: d["sites"][1].update(instances=dict(INSTANCES, host_key="ssh-rsa " + HOST_KEY.split()[1])),
         "sites[1].instances.host_key", "type does not match"),
        (lambda d: d["sites"][1].update(instances=dict(INSTANCES, max_instances=0)), "sites[1].instances.max_instances",
         "greater than or equal to 1"),
        (lambda d: d["sites"][1].update(instances=dict(INSTANCES, provider="gce")), "sites[1].instances.provider",
         "'ec2'"),
        (lambda d: d["sites"][1].update(instances=dict(INSTANCES, workdir="/w/{job}")), "sites[1].instances.workdir",
         "{instance_id}"),
        (lambda d: d["sites"][1].update(instances=INSTANCES, hosts=[{"hostname": "h", "username": "u"}]), "sites[1]",
         "gives both hosts and instances"),
    ],
)
def test_a_bad_instances_block_names_the_field_and_the_fix(tmp_path, mutate, path, words):
    assert_refused(tmp_path, mutate, path, words)
