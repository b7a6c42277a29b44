"""Speedscope files checked against speedscope's own schema (file-format-schema.json of the
release `make browser` unpacks), by a small checker of the JSON Schema words that schema uses
($ref, anyOf, type, const, enum, properties, required, items): no dependency. Beyond the
schema, what speedscope needs to draw: frame indexes in range, one weight per sample."""

from __future__ import annotations

import json
from typing import Any, Dict, List

from tools import SPEEDSCOPE, need

SCHEMA = SPEEDSCOPE / "file-format-schema.json"
TYPES = {"object": dict, "array": list, "string": str}


def load_schema() -> Dict[str, Any]:
    need("speedscope")
    schema: Dict[str, Any] = json.loads(SCHEMA.read_text())
    return schema


def problems(value: Any, rule: Dict[str, Any], definitions: Dict[str, Any], where: str = "$") -> List[str]:
    """What in `value` breaks `rule` (empty: valid)."""
    if "$ref" in rule:
        name = rule["$ref"].rpartition("/")[2]
        return problems(value, definitions[name], definitions, where)
    found: List[str] = []
    if "anyOf" in rule:
        if all(problems(value, option, definitions, where) for option in rule["anyOf"]):
            found.append(f"{where}: matches none of {[option.get('$ref') for option in rule['anyOf']]}")
        return found
    kind = rule.get("type")
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [f"{where}: {value!r} is not a number"]
    elif kind in TYPES and not isinstance(value, TYPES[kind]):
        return [f"{where}: {type(value).__name__} is not {kind}"]
    if "const" in rule and value != rule["const"]:
        found.append(f"{where}: {value!r} is not {rule['const']!r}")
    if "enum" in rule and value not in rule["enum"]:
        found.append(f"{where}: {value!r} not in {rule['enum']}")
    if isinstance(value, dict):
        for name in rule.get("required", []):
            if name not in value:
                found.append(f"{where}: lacks {name!r}")
        for name, inner in rule.get("properties", {}).items():
            if name in value:
                found += problems(value[name], inner, definitions, f"{where}.{name}")
    if isinstance(value, list) and "items" in rule:
        for index, item in enumerate(value):
            found += problems(item, rule["items"], definitions, f"{where}[{index}]")
    return found


def check_speedscope(document: Any) -> None:
    schema = load_schema()
    definitions = schema["definitions"]
    found = problems(document, {"$ref": schema.get("$ref", "#/definitions/FileFormat.File")}, definitions)
    assert not found, found[:10]
    frames = len(document["shared"]["frames"])
    for profile in document["profiles"]:
        if profile["type"] == "sampled":
            assert len(profile["samples"]) == len(profile["weights"]), profile["name"]
            for stack in profile["samples"]:
                assert all(type(at) is int and 0 <= at < frames for at in stack), (profile["name"], stack)
        assert profile["startValue"] <= profile["endValue"], profile["name"]
