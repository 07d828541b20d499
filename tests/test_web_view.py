"""The web view in a real headless browser (Debian's Chromium, driven by Playwright): each page
loads, a search shows its plan, hits and scores, and a memory forgotten from the view is gone.

Also, without a browser: the pages' access rule and the view mounted in the MCP HTTP app.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.testclient import TestClient

from mnemoplan.service.service import MemoryService
from mnemoplan.transfer.importer import import_file
from mnemoplan.web.app import create_view_app, service_caller

FIXTURES = Path(__file__).parent / "fixtures" / "transfer"
CHROMIUM = "/usr/bin/chromium"
# What the machine's closed network needs: no background connections Chromium would make.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]  # fmt: skip


def filled(service: MemoryService) -> MemoryService:
    import_file(service, FIXTURES / "chatgpt_conversations.json", user_id="u1")
    import_file(service, FIXTURES / "messages.jsonl", user_id="u1")
    import_file(service, FIXTURES / "mcp_memory.jsonl", user_id="u1")
    return service


@pytest.fixture
def view_url(service: MemoryService) -> Iterator[str]:
    """The view of a filled memory, served by uvicorn on a loopback port in a thread."""
    filled(service)
    listener = socket.socket()  # bound and listening before the server runs: nothing to wait for
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_view_app(service_caller(service)), log_level="warning",
                                           lifespan="off"))  # fmt: skip
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)
    listener.close()


def _browser_or_skip() -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium before the tests")
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium); .ci/run installs it and runs this test")


@pytest.mark.browser
def test_every_page_search_and_forget_in_chromium(view_url: str, tmp_path: Path, service: MemoryService) -> None:
    _browser_or_skip()
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{view_url}/")  # redirected to /view/
        page.get_by_role("link", name="u1").click()
        expect(page.get_by_role("heading", name="Timeline of sessions")).to_be_visible()
        expect(page.locator("a.session")).to_have_count(6)
        page.locator("a.session", has_text="c1:1").click()
        expect(page.locator("tr.message")).to_have_count(3)
        expect(page.locator("tr.message").first).to_contain_text("I started pottery classes last week.")
        page.screenshot(path=str(tmp_path / "session.png"), full_page=True)

        page.get_by_role("link", name="Facts").click()
        expect(page.get_by_role("heading", name="Current facts")).to_be_visible()
        page.get_by_role("link", name="Graph").click()
        expect(page.locator("#graph[data-ready]")).to_have_count(1, timeout=30_000)  # cytoscape drew it
        assert int(page.locator("#graph").get_attribute("data-ready") or 0) > 0
        page.screenshot(path=str(tmp_path / "graph.png"), full_page=True)

        page.get_by_role("link", name="Search").click()
        page.get_by_label("query").fill("pottery classes")
        page.get_by_role("button", name="Search").click()  # htmx swaps the results in
        expect(page.locator("tr.item").first).to_contain_text("pottery")
        expect(page.locator("table.steps tr")).not_to_have_count(1)
        expect(page.locator("tr.item").first.locator("td.scores")).to_contain_text("bm25")
        page.screenshot(path=str(tmp_path / "search.png"), full_page=True)

        forgotten = page.locator("tr.item").first.get_attribute("data-id")
        page.locator("tr.item").first.locator("a.forget").click()
        expect(page.get_by_role("heading", name="Forget this memory?")).to_be_visible()
        page.locator("#confirm-forget").click()
        expect(page.locator("#receipt")).to_contain_text("record(s) removed")
        page.goto(f"{view_url}/view/session?user=u1&id=c1:1")
        expect(page.locator("tr.message")).to_have_count(2)
        expect(page.locator("body")).not_to_contain_text("I started pottery classes last week.")
        page.goto(f"{view_url}/view/search?user=u1&q=pottery+classes")
        expect(page.locator(f'tr.item[data-id="{forgotten}"]')).to_have_count(0)
        browser.close()
    assert errors == []
    assert service.store.log.get("u1", [forgotten or ""]) == {}
    if os.environ.get("MNEMOPLAN_SCREENSHOTS"):  # to refresh the README's picture: docs/web-view.png
        shutil.copy(tmp_path / "search.png", os.environ["MNEMOPLAN_SCREENSHOTS"])


def test_the_view_answers_loopback_only_and_refuses_cross_site_forgets(service: MemoryService) -> None:
    filled(service)
    app = create_view_app(service_caller(service))
    remote = TestClient(app, client=("203.0.113.9", 4000))
    assert remote.get("/view/sessions?user=u1").status_code == 403
    local = TestClient(app, client=("127.0.0.1", 4000))
    assert local.get("/view/sessions?user=u1").status_code == 200
    assert local.get("/view/session?user=u1&id=nope").status_code == 404
    rid = service.store.log.ids(__import__("mnemoplan.model.scope", fromlist=["RecordFilter"]).RecordFilter("u1"))[0]
    refused = local.post("/view/forget?user=u1", data={"id": rid}, headers={"origin": "http://evil.example"})
    assert refused.status_code == 403
    assert service.store.log.get("u1", [rid])
    read_only = TestClient(create_view_app(service_caller(service), writes=False), client=("127.0.0.1", 4000))
    assert read_only.post("/view/forget?user=u1", data={"id": rid},
                          headers={"origin": "http://testserver"}).status_code == 403  # fmt: skip
    assert "Forget</a>" not in read_only.get("/view/session?user=u1&id=c1:1").text
    done = local.post("/view/forget?user=u1", data={"id": rid}, headers={"origin": "http://testserver"})
    assert done.status_code == 200 and service.store.log.get("u1", [rid]) == {}


def test_a_view_started_with_tokens_never_falls_back_to_loopback(service: MemoryService, tmp_path: Path) -> None:
    """Every token revoked while the server runs: the view still asks for one (no admin view for
    whoever reaches it from this machine, a reverse proxy included)."""
    from starlette.applications import Starlette

    from mnemoplan.storage.tokens import TokenStore
    from mnemoplan.web.app import WebView

    filled(service)
    tokens = TokenStore(tmp_path / "tokens")
    secret, info = tokens.create(user_id="u1")
    app = Starlette(routes=WebView(service_caller(service), writes=True, tokens=tokens).routes())
    local = TestClient(app, client=("127.0.0.1", 4000))
    assert local.get("/view/sessions?user=u1", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    tokens.revoke(info.id)
    assert local.get("/view/sessions?user=u1").status_code == 401
    assert local.get("/view/sessions?user=u1", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
