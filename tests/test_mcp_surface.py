"""What a host pays for: the size of tools/list and of each tool's text content, through the
SDK's own client (in memory), on real stores with the small test embedder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from mnemoplan.config import Settings
from mnemoplan.server.app import create_app

TOOLS_LIST_MAX = 12_000  # compact JSON of the five tools, output schemas included


def compact(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def tool_sizes(tools: list[Any]) -> dict[str, dict[str, int]]:
    """Compact-JSON size of each tool's entry, and of its input and output schemas."""
    return {
        t.name: {
            "entry": compact(t.model_dump(by_alias=True, exclude_none=True, mode="json")),
            "input": compact(t.input_schema),
            "output": compact(t.output_schema or {}),
        }
        for t in tools
    }


def run(tmp_path: Path, scenario: Any) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data", embedding_model="hash", anthropic_api_key=None))

    async def main() -> None:
        async with Client(app) as client:
            await scenario(client)

    anyio.run(main)


def text_of(result: Any) -> str:
    assert not result.is_error, result.content
    return "".join(c.text for c in result.content)


def test_tools_list_fits_in_twelve_kilobytes_with_output_schemas(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        tools = (await client.list_tools()).tools
        sizes = tool_sizes(tools)
        assert sum(s["entry"] for s in sizes.values()) <= TOOLS_LIST_MAX, sizes
        for tool in tools:
            assert tool.output_schema and tool.output_schema["type"] == "object"
            assert tool.description and len(tool.description) <= 400
        recall = next(t for t in tools if t.name == "recall")
        item = recall.output_schema["properties"]["items"]["items"]["properties"]
        assert {"id", "occurred_at", "confidence", "text"} <= set(item)
        assert "no_match" in recall.output_schema["properties"]

    run(tmp_path, scenario)


def test_search_text_is_the_context_and_a_short_item_list(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        lines = [f"On day {i} Mira walked her greyhound Pixel along the river and fed the ducks near bridge {i}"
                 for i in range(30)]  # fmt: skip
        stored = await client.call_tool("remember", {"messages": [{"content": t, "speaker": "Mira"} for t in lines],
                                                     "user_id": "m", "session_id": "s1"})  # fmt: skip
        assert len(text_of(stored)) < 2000  # counts and at most 20 ids, not 30
        for tool in ("recall", "deep_memory_search"):
            args = {"query": "Where did Mira walk Pixel the greyhound?", "user_id": "m"}
            result = await client.call_tool(tool, args | ({"limit": 20} if tool == "recall" else {"max_results": 20}))
            text, data = text_of(result), result.structured_content
            assert data["context"] and not data["no_match"]
            assert text.startswith(data["context"])
            assert len(text) <= 2 * len(data["context"])
            assert data["items"] and all(0.0 <= i["confidence"] <= 1.0 for i in data["items"])
            assert data["items"][0]["id"] in text  # the best item is listed with its id
            assert "scores" in data["items"][0]  # the structured content keeps everything

    run(tmp_path, scenario)


def test_explain_plan_is_small_unless_the_full_schema_is_asked_for(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        await client.call_tool("remember", {"content": "Caroline went to the support group on 7 May 2023",
                                            "user_id": "c"})  # fmt: skip
        brief = await client.call_tool("explain_plan", {"query": "When did Caroline go to the group?", "user_id": "c"})
        assert len(text_of(brief).encode()) <= 6_000
        assert brief.structured_content["index_summaries"]["bm25"]
        assert brief.structured_content["deep_plan"]["steps"]
        full = await client.call_tool("explain_plan", {"query": "When did Caroline go to the group?",
                                                       "user_id": "c", "full": True})  # fmt: skip
        assert full.structured_content["plan_schema"]["properties"]["steps"]
        assert {d["name"] for d in full.structured_content["indexes"]} >= {"bm25", "semantic"}

    run(tmp_path, scenario)


def test_forget_receipt_gives_counts_and_a_few_ids(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        messages = [{"content": f"note number {i} about the garden"} for i in range(45)]
        await client.call_tool("remember", {"messages": messages, "user_id": "g", "session_id": "s"})
        result = await client.call_tool("forget", {"scope": "session", "session_id": "s", "user_id": "g"})
        text, data = text_of(result), result.structured_content
        assert data["removed"] >= 45 and len(data["ids"]) == 20
        assert f"and {data['removed'] - 20} more" in text
        assert len(text) < 1_500

    run(tmp_path, scenario)


def test_nothing_relevant_says_no_match_instead_of_listing_noise(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        await client.call_tool("remember", {"content": "I repaired the bicycle chain on Sunday", "user_id": "n"})
        result = await client.call_tool("recall", {"query": "What is my favourite opera by Verdi?", "user_id": "n"})
        data = result.structured_content
        assert data["no_match"] is True
        assert "nothing relevant" in data["context"]
        assert "bicycle" not in data["context"]

    run(tmp_path, scenario)
