"""Bounds for every number in a model's JSON schema, so that Prefect refuses a form with a number it cannot list again.

Why. A flow run stored with a number beyond 64 bits makes every later flow-run listing of the Prefect
server answer 500, the UI's run list included, until the run is deleted (PrefectHQ/prefect#15031;
``flows``' docstring has the details). A deployment's parameter schema is enforced when a run is
created, and the schema of a model-typed parameter (the lifecycle's ``spec`` form, a stage's
``approved`` dataset version) comes from the model's own JSON schema: ``bound_numbers`` as the
models' ``json_schema_extra`` gives each of their numbers that has no bound of its own the 64-bit
range, so the server refuses ``1e308`` typed into, say, ``resources.max_hours`` with a 409 naming it,
and no run is stored. Python validation does not change: the bounds are in the schema only (a field's
own ``ge``/``le`` are kept, and are what a spec file is checked against).
"""

from __future__ import annotations

from typing import Any

#: The widest bound a stored number may have: a larger one is an integer the server cannot serialise.
INT64_MAX = 2**63 - 1
_NESTED = ("anyOf", "oneOf", "allOf", "items", "prefixItems", "additionalProperties")


def bound_numbers(schema: dict[str, Any], cls: type | None = None) -> None:
    """pydantic's ``json_schema_extra`` hook: every number in the model's properties gets the 64-bit range where
    it has no bound (nested models are ``$ref``-s, bounded by their own hook)."""
    for prop in schema.get("properties", {}).values():
        _bound(prop)


def _bound(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _bound(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") in ("integer", "number"):
        if "minimum" not in node and "exclusiveMinimum" not in node:
            node["minimum"] = -INT64_MAX
        if "maximum" not in node and "exclusiveMaximum" not in node:
            node["maximum"] = INT64_MAX
    for key in _NESTED:
        if key in node:
            _bound(node[key])
    for inner in node.get("properties", {}).values():
        _bound(inner)
