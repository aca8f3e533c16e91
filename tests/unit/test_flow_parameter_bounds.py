"""Every number a deployed flow takes, its forms' nested numbers included, has both bounds in its parameter schema
(why: ``flows``' docstring; nested ones: ``hybridtrain.specs.schema_bounds``).

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


def numbers(node, path: str = "") -> list[tuple[str, dict]]:
    """Every integer/number schema in ``node`` with its path: top-level parameters (``X | None`` is an ``anyOf``),
    and the fields of the models they take (the spec form's ``definitions``), dict values and list items too."""
    found = []
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            found.append((path, node))
        for key, value in node.items():
            found.extend(numbers(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(numbers(value, f"{path}[{i}]"))
    return found


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_every_number_a_deployed_flow_takes_is_bounded(entrypoint):
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(load_flow_from_entrypoint(str(ROOT / entrypoint))).model_dump_for_openapi()
    unbounded = []
    for path, s in numbers(schema):
        low = s.get("minimum", s.get("exclusiveMinimum"))
        high = s.get("maximum", s.get("exclusiveMaximum"))
        if low is None or high is None or not -INT64_MAX <= low <= high <= INT64_MAX:
            unbounded.append(path.removeprefix("/properties/").removeprefix("/"))
    assert sorted(unbounded) == sorted(UNBOUNDED.get(entrypoint, set()))
    if entrypoint.endswith(":lifecycle"):  # the spec form's numbers are checked too, not only top-level ones
        assert any(path.endswith("/max_hours") for path, _ in numbers(schema))
