"""What small models really answer when asked for JSON, and the ways a provider fails.

Replayed by the loopback servers of both APIs (``tests/llm_server.py``) through the real
client libraries. The replies are written for the extractor's schema (``{"facts": [...]}``);
those that are unusable are unusable for every role.
"""

from __future__ import annotations

import json

from tests.llm_server import Reply

FACT = {"kind": "fact", "content": "Ivo plays the cello in a quartet", "subject": "Ivo", "predicate": "plays",
        "object": "the cello", "entities": ["Ivo"], "confidence": 0.9, "sources": [1]}  # fmt: skip
GOOD = json.dumps({"facts": [FACT]})

# Usable as they are: the client finds the JSON and the schema takes it (no repair request).
USABLE: dict[str, str] = {
    "fenced": f"```json\n{GOOD}\n```",
    "fenced_no_language": f"Here you go:\n```\n{GOOD}\n```",
    "prose_then_json": f"Sure! Here are the facts I found in the conversation:\n{GOOD}\nAnything else?",
    "extra_keys": json.dumps({"facts": [{**FACT, "certainty": "high", "speaker_id": 3}], "notes": "done"}),
    "bare_list": json.dumps([FACT]),
    "lax_types": json.dumps({"facts": [{**FACT, "confidence": "0.9", "sources": ["1"]}]}),
}

# Unusable: each gets the one repair request; unusable twice, the call takes the offline path.
UNUSABLE: dict[str, Reply] = {
    "truncated": Reply(text=GOOD[: len(GOOD) // 2], stop_reason="max_tokens"),
    "truncated_unreported": Reply(text=GOOD[:40]),
    "missing_keys": Reply(text=json.dumps({"facts": [{"subject": "Ivo", "predicate": "plays"}]})),
    "wrong_types": Reply(text=json.dumps({"facts": [{"content": "x", "confidence": "high", "sources": "first"}]})),
    "wrong_shape": Reply(text=json.dumps({"result": "Ivo plays the cello"})),
    "fact_fragment": Reply(text=json.dumps(FACT)),  # one fact without its envelope: not "no facts"
    "empty": Reply(text=""),
    "whitespace": Reply(text="  \n "),
    "refusal_text": Reply(text="I'm sorry, but I can't help with extracting personal information."),
    "prose_only": Reply(text="The user mentions rehearsals and that they play the cello in a quartet."),
    "json_scalar": Reply(text='"facts"'),
    "null": Reply(text="null"),
    "broken_json": Reply(text='{"facts": [{"content": "Ivo plays", }]}'),
}

# How each failure is named in the error (and so in warnings); replies repeat for retries.
ERRORS: dict[str, tuple[Reply, str]] = {
    "rate_limited": (Reply(status=429, error_type="rate_limit_error", message="slow down",
                           headers={"retry-after": "0"}), "HTTP 429"),  # fmt: skip
    "server_error": (Reply(status=500, error_type="api_error", message="boom"), "HTTP 500"),
    "bad_gateway": (Reply(status=502, body=b"<html><body>502 Bad Gateway</body></html>",
                          content_type="text/html"), "HTTP 502"),  # fmt: skip
    "overloaded": (Reply(status=529, error_type="overloaded_error", message="Overloaded"), "HTTP 529"),
    "unknown_model": (Reply(status=404, error_type="not_found_error",
                            message='model "llama9:70b" not found, try pulling it first'), "HTTP 404"),  # fmt: skip
    "bad_key": (Reply(status=401, error_type="authentication_error", message="invalid x-api-key"), "HTTP 401"),
    "html_page": (Reply(body=b"<html><body>Service temporarily unavailable</body></html>",
                        content_type="text/html"), "not a"),  # fmt: skip
    "cut_body": (Reply(body=b'{"id": "x", "choices": [{"message": {"content": "{\\"fa'), "not JSON"),
}
