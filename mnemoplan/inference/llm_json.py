"""JSON out of a model's replies, and schema failures put back into words for it.

Shared by every LLM caller: the write path's extractor and the planner's roles alike.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

JSON_ONLY = "Reply with one JSON object only: no prose, no code fences."

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def extract_json(text: str) -> dict[str, Any] | list[Any]:
    """Find and parse the first JSON object or array in a model's reply.

    Tolerates code fences (```json ... ```) and prose before or after the value, since
    models add both despite instructions.

    Args:
        text: The reply text.

    Returns:
        The parsed object or array.

    Raises:
        ValueError: If the text holds no parseable JSON object or array.
    """
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        stripped = candidate.strip()
        try:
            value = json.loads(stripped)
        except ValueError:
            pass
        else:
            if isinstance(value, dict | list):
                return value
        # Prose around the value: try each opening bracket until one decodes.
        for match in re.finditer(r"[{\[]", stripped):
            try:
                value, _ = decoder.raw_decode(stripped, match.start())
            except ValueError:
                continue
            if isinstance(value, dict | list):
                return value
    raise ValueError("no JSON object or array found in the reply")


def describe(err: ValidationError) -> str:
    """A validation error in a few words: the first four problems, each ``field.path: message``.

    Args:
        err: What pydantic said of a reply.

    Returns:
        One line, short enough for a log, a warning or a repair prompt.
    """
    problems = [f"{'.'.join(str(p) for p in e['loc']) or 'reply'}: {e['msg']}" for e in err.errors()[:4]]
    more = err.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


# JSON-schema keywords a structured-output mode may refuse (Anthropic's takes no numeric or
# length bounds) and that say nothing the prompt's schema does not: left out of what is sent.
_DROPPED = frozenset({"title", "default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                      "minLength", "maxLength", "minItems", "maxItems", "pattern", "format", "examples"})


def response_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema a server's structured-output mode is given for a reply model.

    References are inlined (local servers turn the schema into a grammar, and not every one
    follows ``$ref``), objects with listed properties are closed (``additionalProperties:
    false``), and keywords such modes refuse are dropped. An open map (``dict[str, X]``) stays
    open: an API that cannot take one is then asked without the schema (``llm_anthropic``).

    Args:
        model: The pydantic model a reply must validate against.

    Returns:
        A self-contained JSON schema.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return walk(defs[node["$ref"].rsplit("/", 1)[-1]])
        out = {k: walk(v) for k, v in node.items() if k not in _DROPPED and k != "properties"}
        if isinstance(node.get("properties"), dict):  # property names are kept whatever they are
            out["properties"] = {name: walk(v) for name, v in node["properties"].items()}
            out.setdefault("additionalProperties", False)
        return out

    return walk(schema)
