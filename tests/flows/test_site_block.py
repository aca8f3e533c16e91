"""The site block is generated from the Site model: every field of every catalogued site survives the round trip."""

from __future__ import annotations

from pathlib import Path

from blocks.site import SiteBlock
from hybridtrain.specs.sites import Site, SitesCatalog

ROOT = Path(__file__).resolve().parents[2]


def test_every_site_field_round_trips_through_the_block():
    catalog = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
    for site in catalog.sites:
        assert SiteBlock.from_site(site).to_site() == site
    # Every field of the model is carried, whatever fields the model grows: none is listed by hand here.
    block = SiteBlock.from_site(catalog.sites[0])
    assert set(block.config) == set(Site.model_fields)


def test_s3_keys_travel_as_secrets_not_in_the_config():
    site = Site.model_validate({
        "name": "cloud-x", "kind": "cloud", "region": "eu-west-1", "jurisdiction": "EU", "gpu_count": 4,
        "capacity_class": "burst", "price_per_gpu_hour": 2.0, "work_pool": "cloud",
        "store": {"kind": "s3", "bucket": "models", "access_key_id": "AKIA", "secret_access_key": "s3cr3t"},
    })
    block = SiteBlock.from_site(site)
    assert "secret_access_key" not in block.config["store"] and "access_key_id" not in block.config["store"]
    assert block.aws_secret_access_key.get_secret_value() == "s3cr3t"
    assert block.to_site() == site
