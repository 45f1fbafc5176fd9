"""The app in a real browser: `streamlit run` on localhost over a copy of the probe store (plus a
tiny BERT checkpoint for the explorer), every page opened in headless Chromium (Debian's
`chromium`, driven by playwright), charts awaited, no exception or error element allowed, and a
screenshot of each page saved under tests/artifacts/screenshots/ (gitignored)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import tiny_bert
from tests.test_app import APP, TINY, copy_store
from workbench.paths import REPO_ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = REPO_ROOT / "tests" / "artifacts" / "screenshots"
# page url -> whether it draws plotly charts on this store
PAGES = {"runs": False, "layer-curves": True, "explorer": True, "probe-syntax": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(probe_store, tokenizers, tmp_path):
    store = copy_store(probe_store, tmp_path / "runs")
    folder = store.root / TINY
    tiny_bert(tokenizers["bert"], seed=1).save_pretrained(folder)
    tokenizers["bert"].save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps({"family": "bert", "step": 1, "seed": 0}))
    port = free_port()
    env = {**os.environ, "BERTOLOGY_RUNS": str(store.root), "HF_HUB_CACHE": str(tmp_path / "hf"),
           "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", APP, "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    while True:  # until healthy, or until it exits (no deadline: pytest-timeout stops a hang)
        try:
            if urllib.request.urlopen(f"{base}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            pass
        if proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"streamlit did not start: {(tmp_path / 'streamlit.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield base
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.mark.slow
def test_every_page_renders_in_chromium(server):
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium); the browser test needs it")
    from playwright.sync_api import sync_playwright

    from probes import probe_names

    pages = {**PAGES, **{f"probe-{p}": PAGES.get(f"probe-{p}", False) for p in probe_names()}}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        for url, has_charts in pages.items():
            page.goto(f"{server}/{'' if url == 'runs' else url}", wait_until="domcontentloaded")  # runs: default
            page.wait_for_selector('[data-testid="stHeading"]', timeout=90_000)
            if has_charts:
                page.wait_for_selector('[data-testid="stPlotlyChart"] .main-svg', timeout=90_000)
            # the script has finished when the status widget no longer says it is running
            page.wait_for_function(
                "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
                " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText.includes('Running')",
                timeout=90_000)
            # dataframes and charts are drawn once their lazily loaded components arrive
            page.wait_for_function("() => document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0",
                                   timeout=90_000)
            page.wait_for_timeout(500)
            shot = SCREENSHOTS / f"{url}.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
            assert page.locator('[data-testid="stException"]').count() == 0, url
            assert page.locator('[data-testid="stAlertContentError"]').count() == 0, url
            assert page.locator('[data-testid="stDialog"]').count() == 0, url  # e.g. "Page not found"
            if has_charts:
                assert page.locator('[data-testid="stPlotlyChart"] .main-svg').count() >= 1, url
            assert shot.stat().st_size > 10_000
        browser.close()
