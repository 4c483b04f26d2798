"""The dashboard in a real browser: headless Chromium (Debian's), driven by Playwright, watches the worked example
of docs/deploy.md run (three machines with their own data) and sees its members, their rounds going up, the
graph of chosen peers coloured by discovered group, and their curves. Needs Debian's chromium; bash
tests/run.sh installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port, p2pfed, stop

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As root in a sandbox with no outside network: no sandbox, no GPU, no calls home (refused here, many at a time)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[str]:
    """The worked example, with rounds enough to watch, and a dashboard on it; yields the page's address."""
    if not Path(CHROMIUM).exists():
        pytest.fail("the browser tests need Debian's chromium: bash tests/run.sh installs it")
    subprocess.run([sys.executable, str(ROOT / "node" / "example_data.py"), str(tmp_path / "data")], check=True)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text((ROOT / "node" / "recipe.toml").read_text().replace("rounds = 20", "rounds = 300"))
    boot = f"tcp://127.0.0.1:{free_port()}"
    port = free_port()
    procs = [p2pfed("bootstrap", "--bind", boot, "--mesh", "own", log=tmp_path / "boot.log")]
    procs += [p2pfed("node", "--recipe", str(recipe), "--data", str(tmp_path / "data" / f"{m}.npz"), "--name", m,
                     "--join", boot, "--bind", "tcp://127.0.0.1:0", "--mesh", "own", "--wait-for", "2", "--out",
                     str(tmp_path / m), log=tmp_path / f"{m}.log") for m in "abc"]
    procs.append(p2pfed("dashboard", "--join", boot, "--mesh", "own", "--port", str(port), "--every", "0.5",
                        log=tmp_path / "dashboard.log"))
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop(*procs)


def open_page(browser: Any, url: str) -> Any:
    """A page of url, once the dashboard process serves it (it may still be starting)."""
    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    deadline = time.monotonic() + 60
    while True:
        try:
            page.goto(url)
            return page
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_the_page_shows_the_live_mesh_and_its_updates(mesh: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = open_page(browser, mesh)
            rows = page.locator("#members tbody tr")
            expect(rows).to_have_count(3, timeout=60_000)
            assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.name)")) == ["a", "b", "c"]
            expect(page.locator("#members tbody tr[data-name=a] td").nth(2)).to_have_text("alive")

            def round_of(name: str) -> int:
                text = page.locator(f"#members tbody tr[data-name={name}] td").nth(3).inner_text()
                return int(text)

            first = round_of("a")
            expect(page.locator("#status")).to_contain_text("live mesh via")
            # pFedLIA's choice (after 3 warm-up rounds): a and b aggregate with each other, c with neither
            edges = page.locator("#graph line.edge")
            expect(edges).to_have_count(2, timeout=90_000)
            pairs = sorted(edges.evaluate_all("es => es.map(e => e.dataset.from + '>' + e.dataset.to)"))
            assert pairs == ["a>b", "b>a"]
            fill = {n: page.locator(f"#graph circle[data-name={n}]").get_attribute("fill") for n in "abc"}
            assert fill["a"] == fill["b"] != fill["c"]
            expect(page.locator("#accuracy path.curve")).to_have_count(3, timeout=30_000)
            expect(page.locator("#influence rect.score")).not_to_have_count(0, timeout=30_000)
            deadline = time.monotonic() + 60
            while round_of("a") <= first + 2:  # the page follows the mesh: rounds go up without a reload
                assert time.monotonic() < deadline, "the rounds on the page did not move"
                time.sleep(0.5)
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            if os.environ.get("P2PFED_SCREENSHOT"):  # how the README's picture is made
                page.screenshot(path=os.environ["P2PFED_SCREENSHOT"], full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def test_the_page_shows_a_peer_dropped_from_a_nodes_choice(tmp_path: Path) -> None:
    """A run folder in which n00 dropped n02 (pfedlia-p2p's choice keeps learning): a red dashed edge from n00
    to n02 in the graph, and n02 in n00's "dropped" cell."""
    from playwright.sync_api import expect, sync_playwright

    from tests.dashboard.test_view import write_run

    if not Path(CHROMIUM).exists():
        pytest.fail("the browser tests need Debian's chromium: bash tests/run.sh installs it")
    write_run(tmp_path / "run")
    port = free_port()
    proc = p2pfed("dashboard", str(tmp_path / "run"), "--port", str(port), log=tmp_path / "dashboard.log")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = open_page(browser, f"http://127.0.0.1:{port}/")
                page.get_by_role("button", name="pfedlia-p2p").click()
                dropped = page.locator("#graph line.dropped-edge")
                expect(dropped).to_have_count(1, timeout=30_000)
                assert dropped.evaluate("e => e.dataset.from + '>' + e.dataset.to") == "n00>n02"
                cell = page.locator("#members tbody tr[data-name=n00] td").nth(7)
                expect(cell).to_have_text("n02")
                expect(cell).to_have_class("dropped")
                expect(page.locator("#members tbody tr[data-name=n01] td").nth(7)).to_have_text("–")
            finally:
                browser.close()
    finally:
        stop(proc)
