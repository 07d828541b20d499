"""The MCP surface, through the SDK's own client over stdio, as a host would use it."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_with_client, server_env

TOOLS = {"remember", "recall", "deep_memory_search", "forget", "explain_plan"}


async def call(client: Any, tool: str, **args: Any) -> dict[str, Any]:
    """Call a tool and return its structured content, failing on a tool error."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def error_text(client: Any, tool: str, **args: Any) -> str:
    """Call a tool that must fail and return the error text."""
    result = await client.call_tool(tool, args)
    assert result.is_error, f"{tool}({args}) should have failed: {result.structured_content}"
    return " ".join(c.text for c in result.content)


def texts(recall: dict[str, Any]) -> list[str]:
    return [item["text"] for item in recall["items"]]


def test_lists_exactly_the_five_tools_with_schemas(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        for tool in tools:
            assert tool.input_schema["type"] == "object"
            assert tool.output_schema and tool.output_schema["type"] == "object"
            assert tool.description
        annotations = {t.name: t.annotations for t in tools}
        for name in ("recall", "deep_memory_search", "explain_plan"):
            assert annotations[name].read_only_hint is True
        assert annotations["forget"].destructive_hint is True

    run_with_client(tmp_path / "data", scenario)


def test_remember_recall_forget_round_trip_and_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def first(client: Any) -> str:
        stored = await call(client, "remember", content="My sister Ingrid lives in Trondheim", user_id="alice")
        assert stored["stored"] == 1
        again = await call(client, "remember", content="My sister Ingrid lives in Trondheim", user_id="alice")
        assert again["stored"] == 0 and again["duplicates"] == 1 and again["ids"] == stored["ids"]
        found = await call(client, "recall", query="Where does Ingrid live?", user_id="alice")
        assert "My sister Ingrid lives in Trondheim" in texts(found)
        assert "Trondheim" in found["context"]
        assert found["items"][0]["scores"]
        return stored["ids"][0]

    rid = run_with_client(data, first)

    async def after_restart(client: Any) -> None:
        found = await call(client, "recall", query="Where does Ingrid live?", user_id="alice")
        assert texts(found) == ["My sister Ingrid lives in Trondheim"]
        receipt = await call(client, "forget", ids=[rid], user_id="alice")
        assert receipt["removed"] == 1 and receipt["purged"] is True
        gone = await call(client, "recall", query="Where does Ingrid live?", user_id="alice")
        assert texts(gone) == []
        deep = await call(client, "deep_memory_search", query="Ingrid Trondheim", user_id="alice")
        assert deep["items"] == []

    run_with_client(data, after_restart)


def test_users_are_isolated_through_every_tool(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        a = await call(client, "remember", content="Alice's locker code is 4471 at the Oslo gym", user_id="alice")
        await call(client, "remember", content="Bob likes the Oslo opera", user_id="bob")
        for query in ("locker code Oslo gym", "Alice", "4471", "user_id:alice locker"):
            assert all("4471" not in t for t in texts(await call(client, "recall", query=query, user_id="bob")))
            deep = await call(client, "deep_memory_search", query=query, user_id="bob")
            assert all("4471" not in item["text"] for item in deep["items"])
        plan = await call(client, "explain_plan", query="Alice locker", user_id="bob")
        assert "4471" not in str(plan)
        # Bob can neither see nor delete Alice's memory by id.
        text = await error_text(client, "forget", ids=a["ids"], user_id="bob")
        assert "not_found" in text
        assert texts(await call(client, "recall", query="locker code", user_id="alice"))
        # A caller plan cannot reach another user either.
        edited = plan["deep_plan"]
        deep = await call(client, "deep_memory_search", query="locker", user_id="bob", plan=edited)
        assert all("4471" not in item["text"] for item in deep["items"])

    run_with_client(tmp_path / "data", scenario)


def test_bad_inputs_are_tool_errors_with_codes(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        checks = [
            ("remember", {"content": "   "}, "invalid_input"),
            ("remember", {"content": "x" * 40_000}, "too_large"),
            ("remember", {"content": "a\x00b"}, "invalid_input"),
            ("remember", {}, "invalid_input"),
            ("remember", {"content": "x", "messages": [{"content": "y"}]}, "invalid_input"),
            ("recall", {"query": ""}, "invalid_input"),
            ("recall", {"query": "q", "limit": 0}, "invalid_input"),
            ("recall", {"query": "q", "time_range": {"after": "2024-01-02", "before": "2024-01-01"}}, "inverted"),
            ("deep_memory_search", {"query": "q", "max_results": 31}, "invalid_input"),
            ("forget", {"ids": ["not-an-id"]}, "invalid_input"),
            ("forget", {"ids": ["0" * 32]}, "not_found"),
            ("forget", {}, "invalid_input"),
            ("forget", {"scope": "session"}, "invalid_input"),
            ("remember", {"content": "x", "user_id": "bad\nuser"}, "invalid_input"),
            ("remember", {"content": "x", "metadata": {"blob": "m" * 20_000}}, "too_large"),
            ("remember", {"content": "x", "speaker": "s" * 500}, "[invalid_input] speaker is longer"),
            ("remember", {"messages": [{"content": "x"}, {"content": "y", "speaker": "s" * 500}]}, "messages[1].speaker"),
            ("remember", {"messages": [{"content": "x"}], "speaker": "s" * 500}, "[invalid_input] speaker is longer"),
            ("deep_memory_search", {"query": "q", "plan": {"query": "q", "steps": [
                {"step_id": "a", "index": "bm25", "params": {"kinds": ["bogus"]}}]}}, "invalid_plan"),
            # arguments that do not fit the input schema: the same code and a hint, field by field
            ("remember", {"messages": [{"text": "hi"}]},
             "[invalid_input] 2 argument(s) do not fit the tool's input schema: messages.0.content: field "
             "required; messages.0.text: extra inputs are not permitted. Hint:"),
            ("remember", {"content": "hi", "occurred_at": "yesterday"},
             "occurred_at: input should be a valid datetime"),
            ("recall", {"query": "q", "limit": "ten"}, "[invalid_input] 1 argument(s) do not fit"),
            ("forget", {"scope": "user", "user_id": ""}, "[invalid_input] user_id is empty"),
        ]
        for tool, args, code in checks:
            text = await error_text(client, tool, **args)
            assert code in text, (tool, args, text)
            assert "Traceback" not in text and ".py" not in text and "/tmp" not in text
            assert "pydantic" not in text
        cjk = await call(client, "remember", content="x", user_id="carol", metadata={"note": "犬" * 3_000})
        assert cjk["stored"] == 1  # the limit counts characters, not their JSON escapes
        # What is stored with a memory comes back with it, from both searches.
        await call(client, "remember", content="I keep the spare key under the blue pot", user_id="erin",
                   metadata={"source": "chat", "tags": ["home", 3]})  # fmt: skip
        for tool in ("recall", "deep_memory_search"):
            items = (await call(client, tool, query="where is the spare key?", user_id="erin"))["items"]
            said = next(i for i in items if i["kind"] == "message")
            assert said["metadata"] == {"source": "chat", "tags": ["home", 3]}
        # Query syntax is just words: a correct (possibly empty) result, never an error or a leak.
        await call(client, "remember", content="the quick brown fox", user_id="carol")
        await call(client, "remember", content="secret of dave", user_id="dave")
        for query in ['"unbalanced', "a:b", "fox AND", "*", "(fox", "user_id:dave", "fox OR user_id:dave", "\x07bell"]:
            found = await call(client, "recall", query=query, user_id="carol")
            assert all("dave" not in t for t in texts(found))
        found = await call(client, "recall", query="quick fox AND (brown", user_id="carol")
        assert texts(found) == ["the quick brown fox"]
        # Control characters other than NUL are stored verbatim.
        ok = await call(client, "remember", content="tab\there, bell\x07 too", user_id="carol")
        assert ok["stored"] == 1

    run_with_client(tmp_path / "data", scenario)


def test_forgotten_secret_leaves_no_bytes_on_disk(tmp_path: Path) -> None:
    data = tmp_path / "data"
    secret = "zq9-marmalade-xylophone-4471"

    async def scenario(client: Any) -> None:
        for i in range(30):
            await call(client, "remember", content=f"filler message number {i} about gardening", user_id="erin",
                       session_id="s1")  # fmt: skip
        stored = await call(
            client, "remember", user_id="erin", session_id="s1",
            content=f"My backup passphrase is {secret} and Zqmarmalade Xylophone keeps it",
        )  # fmt: skip
        await call(client, "remember", content="the next turn after the secret", user_id="erin", session_id="s1")
        found = await call(client, "recall", query=f"passphrase {secret}", user_id="erin")
        assert any(secret in t for t in texts(found))
        await call(client, "forget", ids=stored["ids"], user_id="erin")
        assert all(secret not in t for t in texts(await call(client, "recall", query="passphrase", user_id="erin")))

    run_with_client(data, scenario)
    needles = [secret, "zqmarmalade", "Zqmarmalade Xylophone", "marmalade"]
    for needle in needles:
        hits = subprocess.run(["grep", "-rli", "--", needle, str(data)], capture_output=True, text=True).stdout
        assert hits == "", f"{needle!r} still on disk in: {hits}"


def test_forget_scopes(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        await call(client, "remember", content="project alpha kickoff notes", user_id="f", project_id="alpha")
        await call(client, "remember", content="project beta kickoff notes", user_id="f", project_id="beta")
        await call(client, "remember", content="session one chat about kickoff", user_id="f", session_id="one")
        receipt = await call(client, "forget", scope="project", project_id="alpha", user_id="f")
        assert receipt["removed"] == 1
        receipt = await call(client, "forget", scope="session", session_id="one", user_id="f")
        assert receipt["removed"] == 1
        assert texts(await call(client, "recall", query="kickoff", user_id="f")) == ["project beta kickoff notes"]
        receipt = await call(client, "forget", scope="user", user_id="f")
        assert receipt["removed"] == 1
        assert texts(await call(client, "recall", query="kickoff", user_id="f")) == []

    run_with_client(tmp_path / "data", scenario)


def test_undecodable_bytes_never_crash_the_server(tmp_path: Path) -> None:
    """Raw JSON-RPC over stdio: invalid UTF-8 and lone surrogates must not take the server down."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnemoplan", "serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env(tmp_path / "d"),
    )  # fmt: skip
    assert proc.stdin and proc.stdout

    def send(line: bytes) -> None:
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()

    def receive(timeout: float = 600.0) -> dict[str, Any] | None:  # only reached when no answer comes
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        return json.loads(proc.stdout.readline()) if ready else None

    def call(rid: int, tool: str, args: str) -> bytes:
        return (
            f'{{"jsonrpc":"2.0","id":{rid},"method":"tools/call","params":{{"name":"{tool}","arguments":'.encode()
            + args.encode("latin-1") + b"}}"
        )

    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}).encode())
        assert receive()["id"] == 1
        send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        # Half of a surrogate pair (text cut inside an emoji) is answered and stored, the half
        # replaced by U+FFFD; the SDK alone would drop the message and leave the caller waiting.
        send(call(2, "remember", '{"content":"cut \\ud83d here, and \\\\ud800 is text", "user_id":"raw"}'))
        stored = receive()
        assert stored["id"] == 2 and not stored["result"].get("isError")
        send(call(5, "recall", '{"query":"cut here", "user_id":"raw"}'))
        texts = [i["text"] for i in receive()["result"]["structuredContent"]["items"]]
        assert "cut \ufffd here, and \\ud800 is text" in texts
        # Invalid UTF-8 bytes are replaced (U+FFFD) by the transport: stored, findable, nothing lost around them.
        send(call(3, "remember", '{"content":"caf\xe9 \xff\xfe latte", "user_id":"raw"}'))
        stored = receive()
        assert stored["id"] == 3 and not stored["result"].get("isError")
        send(call(4, "recall", '{"query":"latte", "user_id":"raw"}'))
        found = receive()
        assert found["id"] == 4
        assert "latte" in found["result"]["structuredContent"]["items"][0]["text"]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_explain_plan_then_an_edited_plan_runs_exactly_as_given(tmp_path: Path) -> None:
    async def scenario(client: Any) -> None:
        await call(client, "remember", user_id="gail", session_id="s",
                   messages=[{"content": "I planted tulips in the allotment", "speaker": "Gail"},
                             {"content": "The tulips came up red in April", "speaker": "Gail"}])  # fmt: skip
        explained = await call(client, "explain_plan", query="When did the tulips come up?", user_id="gail", full=True)
        assert {d["name"] for d in explained["indexes"]} >= {
            "semantic", "bm25", "entity_graph", "graph_traversal", "temporal", "fact_store", "working_memory",
            "hierarchical"}  # fmt: skip
        assert explained["planner_instructions"] and explained["plan_schema"]["title"] == "QueryPlan"
        plan = explained["deep_plan"]
        dropped = plan["steps"][-1]["step_id"]
        plan["steps"] = [s for s in plan["steps"] if s["step_id"] != dropped and dropped not in s["depends_on"]]
        result = await call(client, "deep_memory_search", query="When did the tulips come up?", user_id="gail",
                            plan=plan)  # fmt: skip
        assert result["stats"]["rounds"] == 1
        ran = result["plans"][0]
        assert [s["step_id"] for s in ran["steps"]] == [s["step_id"] for s in plan["steps"]]
        assert [s["params"] for s in ran["steps"]] == [s["params"] for s in plan["steps"]]
        assert {s["step_id"] for s in result["steps"]} == {s["step_id"] for s in plan["steps"]}
        assert ran["source"] == "caller"
        # A plan naming an unknown index is a clear error listing the valid ones.
        bad = {**plan, "steps": [{"step_id": "x", "index": "telepathy"}]}
        text = await error_text(client, "deep_memory_search", query="tulips", user_id="gail", plan=bad)
        assert "invalid_plan" in text and "telepathy" in text and "semantic" in text

    run_with_client(tmp_path / "data", scenario)


@pytest.mark.parametrize(
    ("line", "repaired"),
    [
        (r'{"t":"a \ud83d\ude00 b"}', r'{"t":"a \ud83d\ude00 b"}'),  # a whole pair is kept
        (r'{"t":"a \ud83d b"}', r'{"t":"a \ufffd b"}'),  # a high half alone
        (r'{"t":"a \ude00 b"}', r'{"t":"a \ufffd b"}'),  # a low half alone
        (r'{"t":"\ude00\ud83d"}', r'{"t":"\ufffd\ufffd"}'),  # halves in the wrong order
        (r'{"t":"\\ud800"}', r'{"t":"\\ud800"}'),  # an escaped backslash, then plain text
        (r'{"t":"\\\ud800"}', r'{"t":"\\\ufffd"}'),  # an escaped backslash, then a lone half
        (r'{"t":"\u00e9\"\ud83d"}', r'{"t":"\u00e9\"\ufffd"}'),
    ],
)
def test_lone_surrogate_escapes_are_repaired_and_nothing_else_changes(line: str, repaired: str) -> None:
    from mnemoplan.server.stdio import repair_lone_surrogates

    assert repair_lone_surrogates(line) == repaired
    json.loads(repaired).get("t").encode("utf-8")  # valid UTF-8 once parsed


def test_a_large_remember_reports_progress_to_a_caller_that_asks(tmp_path: Path) -> None:
    heard: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, total))

    async def scenario(client: Any) -> None:
        messages = [{"content": f"Entry {i}: the tomatoes on bed {i} need water and some shade today",
                     "speaker": "Ann"} for i in range(400)]  # fmt: skip
        result = await client.call_tool("remember", {"messages": messages, "user_id": "p", "session_id": "s"},
                                        progress_callback=on_progress)  # fmt: skip
        assert not result.is_error and result.structured_content["stored"] == 400
        quiet = await client.call_tool("remember", {"content": "one more note about the shade", "user_id": "p"})
        assert not quiet.is_error  # no token, no notifications

    run_with_client(tmp_path / "data", scenario)
    assert len(heard) >= 2  # several slices of sentences
    assert [p for p, _ in heard] == sorted(p for p, _ in heard)
    assert heard[-1][0] == heard[-1][1]  # the last report says all of them
