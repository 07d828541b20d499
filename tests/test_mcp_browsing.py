"""Browsing memory through MCP, as a host does: the resources (paged JSON), the prompt, and the
web view served beside the MCP endpoint of ``serve --http``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from mcp import Client
from starlette.testclient import TestClient

from mnemoplan.config import Settings
from mnemoplan.model import MessageIn
from mnemoplan.server.app import create_app
from mnemoplan.transfer.importer import import_file
from tests.conftest import make_service

FIXTURES = Path(__file__).parent / "fixtures" / "transfer"


def app_over(tmp_path: Path):
    data = tmp_path / "data"
    service = make_service(data)
    try:
        import_file(service, FIXTURES / "messages.jsonl", user_id="u1")
        import_file(service, FIXTURES / "mcp_memory.jsonl", user_id="u1")
        start = datetime(2024, 1, 1, tzinfo=UTC)
        for i, text in enumerate(["I live in Lisbon.", "I moved to Braga last week.", "I live in Porto now."]):
            said = MessageIn(content=text, speaker="alice", occurred_at=start + timedelta(days=30 * i))
            service.remember(messages=[said], user_id="u1", session_id="moves")  # a fact replaced twice
    finally:
        service.close()
    return create_app(Settings(data_dir=data, embedding_model="hash"))


def test_resources_and_prompt_through_the_sdk_client(tmp_path: Path) -> None:
    app = app_over(tmp_path)

    async def scenario() -> None:
        async with Client(app) as client:
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert {"memory://{user_id}/sessions{?offset,limit}", "memory://{user_id}/facts{?offset,limit}",
                    "memory://{user_id}/messages{?session_id,offset,limit}"} <= templates  # fmt: skip

            async def read(uri: str) -> dict:
                result = await client.read_resource(uri)
                return json.loads(result.contents[0].text)

            assert (await read("memory://users"))["users"] == ["u1"]
            first = await read("memory://u1/sessions?limit=2")
            assert first["total"] == 5 and len(first["items"]) == 2 and first["next"].endswith("offset=2")
            rest = await read(first["next"])
            assert [s["session_id"] for s in rest["items"]] != [s["session_id"] for s in first["items"]]
            msgs = await read("memory://u1/messages?session_id=c1%3A1")
            assert [m["source_id"] for m in msgs["items"]] == ["D1:1", "D1:2", "D1:3"]
            assert msgs["next"] is None
            facts = await read("memory://u1/facts")
            city = [f for f in facts["items"] if f["subject"].lower() == "alice"]
            assert [f["text"] for f in city] == ["Alice lives in Porto."]  # replaced facts: in its history only
            assert [h["text"].split(",")[0] for h in city[0]["history"]] == [
                "Alice moved to Braga in the week of 22 January 2024", "Alice lives in Lisbon."]

            prompts = (await client.list_prompts()).prompts
            assert [p.name for p in prompts] == ["use_memory"]
            got = await client.get_prompt("use_memory", {"user_id": "u1"})
            text = got.messages[0].content.text
            assert "recall" in text and "remember" in text and "forget" in text and "'u1'" in text

    anyio.run(scenario)


def test_the_web_view_is_served_beside_the_mcp_endpoint(tmp_path: Path) -> None:
    app = app_over(tmp_path)
    with TestClient(app.streamable_http_app(), client=("127.0.0.1", 5000)) as http:
        page = http.get("/view/sessions?user=u1")
        assert page.status_code == 200 and "c1:1" in page.text
        assert http.get("/view/static/htmx-2.0.11.min.js").status_code == 200
    with TestClient(app.streamable_http_app(), client=("198.51.100.7", 5000)) as http:
        assert http.get("/view/sessions?user=u1").status_code == 403
