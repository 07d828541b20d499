"""Tool arguments over MCP, through the SDK's own client over stdio: each one read as sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import run_with_client
from tests.test_mcp_stdio import TOOLS, call, error_text, texts


def test_an_id_or_a_text_is_the_string_sent_even_when_it_looks_like_json(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        await call(client, "remember", content="the default user's spare key is under the mat")
        assert texts(await call(client, "recall", query="spare key", user_id="null")) == []
        for user in ("null", "[]", "{}", "true", "1", '"x"'):
            stored = await call(client, "remember", content=f"note of {user}", user_id=user, session_id="[]",
                                project_id="{}", speaker="null")  # fmt: skip
            assert stored["user_id"] == user and stored["session_id"] == "[]"
            assert texts(await call(client, "recall", query="note", user_id=user)) == [f"note of {user}"]
        for text in ("null", "[1, 2]", '{"a": 1}', "3"):  # a text is stored verbatim, and searched as sent
            assert (await call(client, "remember", content=text, user_id="texts"))["stored"] == 1
            found = await call(client, "recall", query=text, user_id="texts")
            assert found["query"] == text
        receipt = await call(client, "forget", scope="user", user_id="null")
        assert receipt["user_id"] == "null" and receipt["removed"] == 1
        mine = await call(client, "recall", query="spare key")
        assert texts(mine) == ["the default user's spare key is under the mat"]
        # Lists and objects sent as JSON text, as some hosts do, are still read as JSON.
        stored = await call(client, "remember", user_id="j", session_id="s",
                            messages=json.dumps([{"content": "tulips came up red", "speaker": "Gail"}]),
                            metadata='{"source": "chat"}')  # fmt: skip
        assert stored["stored"] == 1
        found = await call(client, "recall", query="tulips", user_id="j", options='{"token_budget": 100}',
                           time_range='{"after": "2000-01-01T00:00:00Z"}')  # fmt: skip
        assert found["items"][0]["metadata"] == {"source": "chat"}
        plan = (await call(client, "explain_plan", query="tulips", user_id="j"))["deep_plan"]
        deep = await call(client, "deep_memory_search", query="tulips", user_id="j", plan=json.dumps(plan))
        assert [i["text"] for i in deep["items"]][:1] == ["tulips came up red"]

    run_with_client(tmp_path / "data", scenario)


def test_every_tool_refuses_an_argument_it_does_not_know(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        for tool in (await client.list_tools()).tools:
            assert tool.input_schema["additionalProperties"] is False, tool.name
        calls = [
            ("remember", {"content": "alice's secret", "userId": "alice"}, "userId", "user_id"),
            ("recall", {"query": "secret", "limt": 3}, "limt", "limit"),
            ("deep_memory_search", {"query": "secret", "max_result": 3}, "max_result", "max_results"),
            ("forget", {"scope": "user", "user": "alice"}, "user", "user_id"),
            ("explain_plan", {"query": "secret", "query_text": "x"}, "query_text", "query"),
        ]
        assert {tool for tool, *_ in calls} == TOOLS
        for tool, args, unknown, closest in calls:
            text = await error_text(client, tool, **args)
            assert text.startswith(f"Error executing tool {tool}: [invalid_input]"), text
            assert f"{unknown}: no such argument; did you mean {closest}?" in text, text
        # Nothing was stored or deleted by the refused calls.
        assert texts(await call(client, "recall", query="secret")) == []
        assert texts(await call(client, "recall", query="secret", user_id="alice")) == []

    run_with_client(tmp_path / "data", scenario)


def test_nan_and_infinities_are_refused_wherever_a_number_is_taken(tmp_path: Path) -> None:
    """Python's JSON (and the SDK's parser) read NaN and Infinity; a host's JSON text can carry them."""

    def with_number(value: Any, where: list[Any], literal: str) -> str:
        """``value`` as JSON text with ``literal`` (not JSON) at the path ``where``."""
        value = json.loads(json.dumps(value))
        inner = value
        for key in where[:-1]:
            inner = inner[key]
        inner[where[-1]] = "@@"
        return json.dumps(value).replace('"@@"', literal)

    async def scenario(client: Any) -> None:
        await call(client, "remember", content="tulips came up red in April", user_id="n")
        plan = (await call(client, "explain_plan", query="tulips", user_id="n", full=True))["deep_plan"]
        for bad in ("NaN", "Infinity", "-Infinity"):
            for where in (["analysis", "duration_ms"], ["steps", 0, "weight"]):
                edited = with_number(plan, where, bad)
                error = await error_text(client, "deep_memory_search", query="q", user_id="n", plan=edited)
                assert "[invalid_input]" in error and "finite number" in error, error
            for args in ({"content": "x", "metadata": with_number({"a": 1}, ["a"], bad)},
                         {"messages": with_number([{"content": "x", "metadata": {"a": [1, 2]}}],
                                                  [0, "metadata", "a", 1], bad)}):  # fmt: skip
                error = await error_text(client, "remember", user_id="n", **args)
                assert "[invalid_input]" in error and "finite number" in error, error
            options = with_number({"weights": {"bm25": 1}}, ["weights", "bm25"], bad)
            error = await error_text(client, "recall", query="tulips", user_id="n", options=options)
            assert "finite number" in error, error
        assert texts(await call(client, "recall", query="x", user_id="n")) == []  # nothing stored

    run_with_client(tmp_path / "data", scenario)


def test_a_time_without_an_offset_is_utc_for_every_tool(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        await call(client, "remember", content="I repotted the fern on the balcony", user_id="t",
                   occurred_at="2024-04-30T15:00:00")  # fmt: skip
        await call(client, "remember", content="I bought a fern at the market", user_id="t",
                   occurred_at="2024-03-01T09:00:00Z")  # fmt: skip
        query = "What did I do with the fern yesterday?"
        instants = ("2024-05-01T10:00:00", "2024-05-01T10:00:00Z", "2024-05-01T12:00:00+02:00")  # the same
        for tool in ("recall", "deep_memory_search"):
            found = [await call(client, tool, query=query, user_id="t", reference_time=t) for t in instants]
            first = found[0]["items"]
            assert first[0]["text"] == "I repotted the fern on the balcony", tool
            assert first[0]["occurred_at"] == "2024-04-30T15:00:00Z"
            assert [[i["id"] for i in f["items"]] for f in found[1:]] == [[i["id"] for i in first]] * 2
        recalled = await call(client, "recall", query=query, user_id="t", reference_time=instants[0])
        assert recalled["analysis"]["reference_time"] == "2024-05-01T10:00:00Z"
        window = recalled["analysis"]["time_window"]
        assert window["start"] == "2024-04-30T00:00:00Z" and window["end"] == "2024-05-01T00:00:00Z"
        # A caller's plan with times without offsets runs the same.
        plan = (await call(client, "explain_plan", query=query, user_id="t", full=True))["deep_plan"]
        plan["analysis"].update(reference_time="2024-05-01T10:00:00",
                                time_window={"start": "2024-04-30T00:00:00", "end": "2024-05-01T00:00:00"})
        deep = await call(client, "deep_memory_search", query=query, user_id="t", plan=plan,
                          reference_time="2024-05-01T10:00:00",
                          time_range={"after": "2024-04-01T00:00:00"})  # fmt: skip
        assert [i["text"] for i in deep["items"]] == ["I repotted the fern on the balcony"]

    run_with_client(tmp_path / "data", scenario)


def test_a_time_without_an_offset_is_utc_for_the_service_too(service: Any) -> None:
    from datetime import UTC, datetime

    service.remember(content="I repotted the fern on the balcony", user_id="t",
                     occurred_at=datetime(2024, 4, 30, 15, tzinfo=UTC))  # fmt: skip
    query = "What did I do with the fern yesterday?"
    naive, aware = datetime(2024, 5, 1, 10), datetime(2024, 5, 1, 10, tzinfo=UTC)
    recalled = service.recall(query, user_id="t", reference_time=naive)
    again = service.recall(query, user_id="t", reference_time=aware)
    assert [i.id for i in recalled.items] == [i.id for i in again.items]
    deep = service.deep_search(query, user_id="t", reference_time=naive)
    assert [i.text for i in deep.items] == ["I repotted the fern on the balcony"]
