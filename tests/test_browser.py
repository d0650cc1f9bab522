"""The web page in a real browser: `seqrec serve` runs as a subprocess on a tiny UniSRec run and headless
Chromium drives the page (search, history, recommend, add an item by text, a session). What the page
shows must equal what the HTTP API answers for the same requests; the page must log no script error.
Each test saves a full-page screenshot under its tmp dir and under test-output/browser/ (kept by CI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve_helpers import free_port, stop_process, train_tiny_runs, wait_healthy

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "test-output" / "browser"
TIMEOUT_MS = 20_000  # any one wait on the page
WRITE_TOKEN = "browser-test-write-token-0123"  # the service takes catalogue changes with it only
WRITER = {"Authorization": f"Bearer {WRITE_TOKEN}"}
# the browser's console line for POST /items refused without the token (the page shows the refusal)
REFUSED_ADD = re.compile(r"status of 401 \(Unauthorized\) \(http://127\.0\.0\.1:\d+/items\)$")

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} not installed (apt-get install chromium; "
                                                              ".ci/run installs it)")
pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`seqrec serve` on a tiny UniSRec run, on a free loopback port, its write token from the environment;
    yields its base URL."""
    root = tmp_path_factory.mktemp("browser")
    run = train_tiny_runs(root, ("unisrec",))["unisrec"]
    port, log = free_port(), root / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "SEQREC_WRITE_TOKEN": WRITE_TOKEN}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "seqrec.cli", "serve", str(run), "--host", "127.0.0.1",
                                 "--port", str(port), "--threads", "1"], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=REPO)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log)
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def browser(server: str) -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser, server: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Page]:
    """The page, loaded (health shown, the first search listed); screenshots it after the test and
    fails the test on any script error."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(f"{msg.text} ({msg.location.get('url')})")
            if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico") else None)
    expected = [REFUSED_ADD]  # what the browser logs of an answer the page shows: not a script error
    try:
        page.goto(server)
        expect(page.locator("#health")).to_contain_text("items can be added by text")
        expect(page.locator("#search-results li")).to_have_count(20)  # the first search: every item, 20 shown
        yield page
    finally:
        name = request.node.name.replace("/", "_")
        for folder in (tmp_path, SHOTS):
            folder.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
        context.close()
    errors = [e for e in errors if not any(p.search(e) for p in expected)]
    assert not errors, f"script errors on the page: {errors}"


def _pick(page: Page, item: str) -> None:
    """Type the item id into the search box and click its (only) result: appends it to the history."""
    box = page.locator("#q")
    box.fill("")
    box.press_sequentially(item, delay=30)
    hits = page.locator("#search-results li")
    expect(hits).to_have_count(1)
    expect(hits.first).to_have_attribute("data-item", item)
    hits.first.click()


def _recommend(server: str, history: list[str], k: int = 10) -> list[str]:
    got = httpx.post(f"{server}/recommend", json={"history": history, "k": k}, timeout=30.0)
    assert got.status_code == 200, got.text
    return [r["item"] for r in got.json()["items"]]


def _shown(page: Page) -> list[str]:
    rows = page.locator("#results tr")
    return [rows.nth(i).get_attribute("data-item") for i in range(rows.count())]


def _build_history_and_recommend(page: Page, history: list[str]) -> None:
    for item in history:
        _pick(page, item)
    expect(page.locator("#history .chip")).to_have_text(history)
    page.locator("#recommend").click()
    expect(page.locator("#rec-status")).to_have_text(re.compile(r"^\d+ ms$"))


def test_search_history_and_recommend(page: Page, server: str) -> None:
    history = ["i3", "i4", "i5"]
    _build_history_and_recommend(page, history)
    want = _recommend(server, history)
    assert len(want) == 10
    expect(page.locator("#results tr")).to_have_count(10)
    assert _shown(page) == want


def test_item_added_by_text_is_shown_among_its_neighbours(page: Page, server: str) -> None:
    history = ["i7", "i8", "i9"]
    top = _recommend(server, history)[0]
    title = httpx.get(f"{server}/items/{top}", timeout=10.0).json()["title"]
    assert title, f"{top} has no title to copy"
    _build_history_and_recommend(page, history)
    page.locator("#new-id").fill("web-new")
    page.locator("#new-text").fill(title)
    page.locator("#new-title").fill("Added on the page")
    page.locator("#add-item").click()  # without the write token: refused, and the page says why
    expect(page.locator("#add-status")).to_contain_text("Authorization: Bearer")
    assert httpx.get(f"{server}/items/web-new", timeout=10.0).status_code == 404
    page.locator("#write-token").fill(WRITE_TOKEN)  # shown because /health says the service needs it
    page.locator("#add-item").click()
    try:
        expect(page.locator("#add-status")).to_contain_text("added web-new")
        # the page asks again once the item is in; the same text ties with `top`, so it is near the top
        expect(page.locator('#results tr[data-item="web-new"]')).to_have_class("new")
        expect(page.locator('#results tr[data-item="web-new"]')).to_contain_text("Added on the page")
        want = _recommend(server, history)
        assert "web-new" in want[:3] and top in want[:3], want
        assert _shown(page) == want
        assert page.locator("#results tr.new").count() == 1
    finally:  # its twin would tie with `top` in the other tests' lists
        httpx.delete(f"{server}/items/web-new", headers=WRITER, timeout=10.0)


def test_session_steps_equal_recommend_on_each_prefix(page: Page, server: str) -> None:
    events = ["i12", "i13", "i14"]
    page.locator("#k").fill("4")  # the session lists follow the page's k
    for item in events:
        page.locator("#session-item").fill(item)
        page.locator("#session-add").click()
        expect(page.locator("#session-status")).to_contain_text(
            f"{events.index(item) + 1} events")
    steps = page.locator("#session-log .step")
    expect(steps).to_have_count(len(events))
    for n in range(1, len(events) + 1):
        step = steps.nth(n - 1)
        expect(step).to_contain_text(f"event {n}: {events[n - 1]}")
        expect(step).to_contain_text("KV cache")  # UniSRec with positions from the start extends its cache
        shown = [line.split(" ")[0] for line in step.locator("ol li").all_inner_texts()]
        assert shown == _recommend(server, events[:n], k=4), n
    # "New session" ends this one on the server (it filled --max-sessions until it expired)
    session = page.locator("#session-status").inner_text().split()[1].rstrip(":")
    assert httpx.get(f"{server}/sessions/{session}", timeout=10.0).status_code == 200
    page.locator("#session-reset").click()
    expect(page.locator("#session-status")).to_contain_text("new session")
    deadline = time.monotonic() + 10
    while httpx.get(f"{server}/sessions/{session}", timeout=10.0).status_code != 404:
        assert time.monotonic() < deadline, f"session {session} still there after New session"
        time.sleep(0.1)


def test_the_api_page_needs_no_internet(browser: Browser, server: str) -> None:
    """/docs renders the OpenAPI schema from files the service itself serves: every request the page makes
    goes to the service (FastAPI's own page loads Swagger UI from a CDN: blank without internet)."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    elsewhere: list[str] = []
    page.on("request", lambda req: elsewhere.append(req.url) if not req.url.startswith(server) else None)
    try:
        page.goto(f"{server}/docs")
        expect(page.locator(".opblock-summary-path", has_text="/recommend").first).to_be_visible()
        page.screenshot(path=str(SHOTS / "api_docs.png"), full_page=False)
    finally:
        context.close()
    assert not elsewhere, elsewhere
