"""Every number a deployed flow takes has both bounds in its parameter schema (why: ``flows``' docstring).

The schema is the one ``prefect deploy`` computes for each entrypoint of deployments/prefect.yaml; the server refuses
a run outside it (tests/flows/test_parameter_bounds.py). A new numeric parameter without bounds fails here.
"""

from __future__ import annotations

import pytest
import yaml

from tests.fixtures.workspaces import ROOT

ENTRYPOINTS = sorted({d["entrypoint"] for d in yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
                      ["deployments"]})
#: Numbers that may stay unbounded, by entrypoint (none now).
UNBOUNDED: dict[str, set[str]] = {}
INT64_MAX = 2**63 - 1


def numbers(prop: dict) -> list[dict]:
    """The integer/number schemas of one top-level parameter (``X | None`` is an ``anyOf``)."""
    return [s for s in [prop, *prop.get("anyOf", [])] if s.get("type") in ("integer", "number")]


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_every_number_a_deployed_flow_takes_is_bounded(entrypoint):
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(load_flow_from_entrypoint(str(ROOT / entrypoint))).model_dump_for_openapi()
    unbounded = []
    for name, prop in schema["properties"].items():
        for s in numbers(prop):
            low = s.get("minimum", s.get("exclusiveMinimum"))
            high = s.get("maximum", s.get("exclusiveMaximum"))
            if low is None or high is None or not -INT64_MAX <= low <= high <= INT64_MAX:
                unbounded.append(name)
    assert sorted(unbounded) == sorted(UNBOUNDED.get(entrypoint, set()))
