"""Compact JSON schemas for ``tools/list``: what a host pays for in every conversation.

Pydantic's schemas carry a title on every property, a ``$defs`` section with every nested
model, and the output models' field descriptions: about 42 KB for five tools. A host's model
needs the arguments (with their descriptions) and the shape of the result, not each nested
model's documentation. So:

- titles go (they repeat the property name), and ``anyOf [X, null]`` becomes ``type: [X, null]``,
  or in input schemas just X for an argument that may be left out;
- in input schemas, models are inlined; a model nested deeper than ``depth`` (a hand-edited plan's
  steps, say) is advertised as ``object`` — the server still validates it against the full model
  and says precisely what is wrong;
- in output schemas, descriptions and defaults go; the result's own fields and those of the
  memories it lists are shown, any other nested model (an analysis, a plan, a trace) is ``object``.

What a tool accepts and returns does not change: arguments are validated by the pydantic model
(not by the advertised schema), and the result still validates against the compact schema, which
only says less. ``explain_plan`` returns a plan's full schema for a caller who writes plans.
"""

from __future__ import annotations

from typing import Any

_DROP_INPUT = {"title"}
_DROP_OUTPUT = {"title", "description", "default", "examples"}


def compact_input_schema(
    schema: dict[str, Any], *, depth: int = 2, brief: tuple[str, ...] = ("QueryPlan",)
) -> dict[str, Any]:
    """A tool's input schema, inlined and without titles (a nested model's docstring goes too: the
    argument has its own description); models below ``depth``, and those named in ``brief``
    (a plan, whose schema explain_plan gives on request), are ``object``."""
    defs = {name: {k: v for k, v in d.items() if k != "description"} for name, d in schema.get("$defs", {}).items()}
    defs.update({name: {"type": "object"} for name in brief if name in defs})
    return _omit_null(_compact(schema, defs, depth, _DROP_INPUT))


def _omit_null(node: dict[str, Any]) -> dict[str, Any]:
    """An input schema whose optional arguments do not also advertise ``null``: leaving one out
    says the same (the server still accepts an explicit null)."""
    props = node.get("properties")
    if not isinstance(props, dict):
        return {**node, "items": _omit_null(node["items"])} if isinstance(node.get("items"), dict) else node
    required = set(node.get("required", []))
    out = {}
    for name, sub in props.items():
        if name not in required:
            kind = sub.get("type")
            if isinstance(kind, list) and "null" in kind and len(kind) == 2:
                sub = {**sub, "type": next(k for k in kind if k != "null")}
            options = sub.get("anyOf")
            if options and len(options) == 2 and {"type": "null"} in options:
                [other] = [o for o in options if o != {"type": "null"}]
                sub = {**{k: v for k, v in sub.items() if k != "anyOf"}, **other}
        out[name] = _omit_null(sub)
    return {**node, "properties": out}


def compact_output_schema(schema: dict[str, Any], *, shown: tuple[str, ...] = ("MemoryItem",)) -> dict[str, Any]:
    """A tool's output schema: the result's fields with their types, and those of the nested
    models named in ``shown``; any other nested model is advertised as ``object``."""
    defs = schema.get("$defs", {})
    brief = {name: {"type": "object"} for name in defs if name not in shown}
    return _compact(schema, {**defs, **brief}, 3, _DROP_OUTPUT)


def _compact(node: dict[str, Any], defs: dict[str, Any], depth: int, drop: set[str]) -> dict[str, Any]:
    """One schema node, compacted; ``depth`` counts the object levels still shown in full."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _compact({**target, **extra}, defs, depth, drop)
    if node.get("type") == "object" and "properties" in node and depth <= 0:
        return _keep({"type": "object", "description": node.get("description")}, drop)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in drop or key == "$defs" or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: _compact(sub, defs, depth - 1, drop) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _compact(value, defs, depth if key == "items" else depth - 1, drop)
        elif key in ("anyOf", "oneOf", "allOf"):
            out[key] = [_compact(sub, defs, depth, drop) for sub in value]
        else:
            out[key] = value
    return _nullable(out)


def _keep(node: dict[str, Any], drop: set[str]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if v is not None and k not in drop}


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [{type: X}, {type: null}]`` as ``type: [X, null]`` when X is a bare type."""
    options = node.get("anyOf")
    if not options or len(options) != 2 or {"type": "null"} not in options:
        return node
    [other] = [o for o in options if o != {"type": "null"}]
    if set(other) - {"type", "format"} or not isinstance(other.get("type"), str):
        return node
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    return {**rest, **other, "type": [other["type"], "null"]}
