"""Schema defaults from the CRD file, applied the way the API server applies them.

The API server fills defaults into every GuardedCronJob it stores, so the operator
never sees a spec without them. `guardedcron render` reads manifests that were never
admitted; it applies the same defaults from the same CRD file, so that the defaults
live in one place (the CRD schema) and not in code.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from guardedcron import contract


def apply_schema_defaults(obj: Mapping[str, Any], crd: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `obj` with the CRD's structural-schema defaults filled in.

    Follows the API server: a null in a field that is not nullable is dropped first, then
    a missing field with a default gets a copy of it, and defaulting goes on inside the
    values set (so a defaulted `lease: {}` gets its own fields' defaults). An object whose
    apiVersion the CRD does not serve comes back unchanged; the parser reports it.
    """
    result = copy.deepcopy(dict(obj))
    schema = schema_for(crd, str(obj.get("apiVersion", "")))
    if schema is None:
        return result
    defaulted = _fill(result, schema)
    assert isinstance(defaulted, dict)  # the root schema is an object schema
    return defaulted


def schema_for(crd: Mapping[str, Any], api_version: str) -> Mapping[str, Any] | None:
    """The CRD's schema for `api_version`, None if it serves no such version.

    Raises ValueError when `crd` is not the guardedcron CRD or a version has no schema.
    """
    group, _, version = api_version.partition("/")
    spec = crd.get("spec")
    if not isinstance(spec, Mapping) or spec.get("group") != contract.API_GROUP:
        raise ValueError(f"not the {contract.API_GROUP} CustomResourceDefinition")
    if group != contract.API_GROUP:
        return None
    for served in spec.get("versions") or ():
        if isinstance(served, Mapping) and served.get("name") == version:
            schema = (served.get("schema") or {}).get("openAPIV3Schema")
            if not isinstance(schema, Mapping):
                raise ValueError(f"the CRD has no openAPIV3Schema for version {version}")
            return schema
    return None


def _fill(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        for key, sub_schema in properties.items():
            if key in value and value[key] is None and not sub_schema.get("nullable", False):
                del value[key]
            if key not in value and "default" in sub_schema:
                value[key] = copy.deepcopy(sub_schema["default"])
            if key in value:
                value[key] = _fill(value[key], sub_schema)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for key in value:
                if key not in properties:
                    value[key] = _fill(value[key], additional)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                value[index] = _fill(item, items)
    return value
