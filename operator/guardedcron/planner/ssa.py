"""Does the live object already hold what server-side apply would make of it? (pure)

The operator applies only when the answer is no, so a restart or resync over
up-to-date objects sends nothing. Two questions decide it, in the terms of
server-side apply itself:

1. Does every field the desired object sets have that value in the live object?
   The API server adds defaults and other managers add fields of their own, so
   the live object may hold more; lists of objects keyed by name (containers, env,
   volumes, ...) are compared item by item, as apply merges them.
2. Does the desired object still set every field the live object says our field
   manager owns (`metadata.managedFields`)? A field we applied before and no longer
   set (a `timeZone` removed from the spec, a resource limit turned off) is removed
   by the next apply, so its presence alone makes an apply due.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

# The key apply uses for list items, where it is not `name` (from the Kubernetes
# OpenAPI `x-kubernetes-list-map-keys`).
LIST_MAP_KEYS: Mapping[str, str] = {
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ownerReferences": "uid",
    "ports": "containerPort",
}
_QUANTITY_PARENTS = ("requests", "limits")
_SUFFIXES: Mapping[str, Decimal] = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}


def apply_needed(desired: Mapping[str, Any], live: Mapping[str, Any] | None,
                 field_manager: str) -> str | None:
    """Why `desired` must be applied over `live`, or None when applying would change
    nothing. The reason names the first field found, for the log."""
    if live is None:
        return "the object does not exist"
    path = first_difference(desired, live)
    if path is not None:
        return f"{path} differs"
    for entry in live.get("metadata", {}).get("managedFields") or ():
        if entry.get("manager") == field_manager and entry.get("operation") == "Apply":
            path = first_owned_not_desired(entry.get("fieldsV1") or {}, desired)
            if path is not None:
                return f"{path} is no longer set"
    return None


def first_difference(desired: Any, live: Any, path: str = "") -> str | None:
    """The path of the first field `desired` sets that `live` lacks or holds otherwise."""
    if isinstance(desired, Mapping):
        if not desired:  # an empty object sets nothing
            return None
        if not isinstance(live, Mapping):
            return path or "."
        for key, value in desired.items():
            found = first_difference(value, live.get(key), _join(path, key))
            if found is not None:
                return found
        return None
    if isinstance(desired, list):
        return _list_difference(desired, live, path)
    if desired is None:  # not set: nothing to compare
        return None
    if _scalars_equal(desired, live, path):
        return None
    return path


def first_owned_not_desired(fields: Mapping[str, Any], desired: Any, path: str = "") -> str | None:
    """The path of the first field in a managedFields set (`fieldsV1`) that `desired`
    no longer sets. Keys: `f:<field>`, `k:<json key of a list item>`, `v:<json value
    of a set item>`, `.` (the item itself)."""
    for key, children in fields.items():
        if key == ".":
            continue
        kind, _, rest = key.partition(":")
        if kind == "f":
            value = desired.get(rest) if isinstance(desired, Mapping) else None
            where = _join(path, rest)
            if value is None:
                return where
        elif kind == "k":
            item_key = json.loads(rest)
            value = _find_item(desired, item_key)
            where = f"{path}[{_describe_key(item_key)}]"
            if value is None:
                return where
        elif kind == "v":
            value = json.loads(rest)
            where = f"{path}[{rest}]"
            if not isinstance(desired, list) or value not in desired:
                return where
            continue
        else:  # "i:" (by index) is not written for applied objects; nothing to check
            continue
        if isinstance(children, Mapping) and children:
            found = first_owned_not_desired(children, value, where)
            if found is not None:
                return found
    return None


def _list_difference(desired: list[Any], live: Any, path: str) -> str | None:
    if not isinstance(live, list):
        return path if desired or live not in (None, []) else None
    key = _list_map_key(desired, path)
    if key is None:  # an atomic list: apply replaces it whole
        if len(desired) != len(live):
            return path
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            found = first_difference(want, have, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    by_key = {item.get(key): item for item in live if isinstance(item, Mapping)}
    for want in desired:
        item_path = f"{path}[{key}={want[key]}]"
        if want[key] not in by_key:
            return item_path
        found = first_difference(want, by_key[want[key]], item_path)
        if found is not None:
            return found
    return None


def _list_map_key(items: Sequence[Any], path: str) -> str | None:
    """The key apply merges this list by, or None for a list it replaces whole."""
    field = path.rsplit(".", 1)[-1].split("[", 1)[0]
    key = LIST_MAP_KEYS.get(field, "name")
    if not items or not all(isinstance(item, Mapping) and key in item for item in items):
        return None
    values = [item[key] for item in items]
    return key if len(set(map(repr, values))) == len(values) else None


def _find_item(items: Any, item_key: Mapping[str, Any]) -> Any:
    if not isinstance(items, list):
        return None
    for item in items:
        # A key field the API server defaulted (a port's protocol) may be unset here.
        if isinstance(item, Mapping) and all(
                item.get(k) in (v, None) for k, v in item_key.items()):
            return item
    return None


def _scalars_equal(desired: Any, live: Any, path: str) -> bool:
    if desired == live and type(desired) is type(live):
        return True
    if isinstance(desired, bool) or isinstance(live, bool):
        return False
    # The API server writes int-or-string and quantity fields back as strings,
    # and quantities in canonical form ("0.5" comes back as "500m").
    if isinstance(desired, int | float) and isinstance(live, str) and str(desired) == live:
        return True
    if _is_quantity_field(path):
        want, have = _quantity(desired), _quantity(live)
        return want is not None and want == have
    return False


def _is_quantity_field(path: str) -> bool:
    parts = path.split(".")
    return parts[-1] == "sizeLimit" or (len(parts) >= 2 and parts[-2] in _QUANTITY_PARENTS)


def _quantity(value: Any) -> Decimal | None:
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, factor = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, factor = text, Decimal(1)
    try:
        return Decimal(number) * factor
    except InvalidOperation:
        return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe_key(item_key: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in item_key.items())
