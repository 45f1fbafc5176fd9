"""The app in a real browser: `bertology app` (on the loopback, its default) over a copy of the
probe store (plus a tiny BERT checkpoint for the explorer), every page opened in headless Chromium
(Debian's `chromium`, driven by playwright), charts awaited, no exception or error element allowed,
and a screenshot of each page saved under tests/artifacts/screenshots/ (gitignored).

Every page also opens by its link as the first request (issue 40): a fresh server whose very first
request is a deep link (`/prune`), then every page's URL (and the root) as the first request of a
new browser session on it, and two more fresh servers opened by another deep link each: a probe page,
and the default page's own link `/runs` (issue 51: it showed "Page not found", since Streamlit serves
the default page at the root; `app.streamlit_app.build_pages` serves its path by a hidden alias). What a first request depends
on: Streamlit decides once per server process, at its first session, whether the app is a
file-based multipage app (`PagesManager.uses_pages_directory`: a folder `pages` beside the entry
script), and resolves the URL path of each new session's first script run against the pages that
run registers (`st.navigation`). The old `app/pages/` folder made the first deep link run the page
module as a script: a blank page under a sidebar of file names, for every later visitor too."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
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


def runs_root(probe_store, tokenizers, tmp_path) -> Path:
    """A copy of the probe store and a tiny BERT checkpoint under one runs root."""
    store = copy_store(probe_store, tmp_path / "runs")
    folder = store.root / TINY
    tiny_bert(tokenizers["bert"], seed=1).save_pretrained(folder)
    tokenizers["bert"].save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps({"family": "bert", "step": 1, "seed": 0}))
    return store.root


@dataclass(frozen=True)
class Served:
    base: str  # http://127.0.0.1:PORT (the tests connect to the loopback only)
    proc: subprocess.Popen  # `bertology app`; Streamlit is its child, in its process group
    log_path: Path  # what the command printed (stdout and stderr)


STARTUP_S = 300  # a cold start measured 22 s at load average 10 on 2 cores


@contextlib.contextmanager
def streamlit_server(root: Path, tmp_path: Path, name: str = "streamlit", flags: tuple[str, ...] = ()):
    """`bertology app --port PORT *flags` (the real command, `app.cli.main`) on a free loopback port
    over `root`; yields a `Served` once its health endpoint answers on 127.0.0.1 (no page has been
    requested yet: the server is fresh). The command and its Streamlit child run in a process group
    of their own, stopped whole at the end."""
    port = free_port()
    # no file watcher (nothing here edits the app while it runs; polling costs CPU on a loaded machine)
    env = {**os.environ, "BERTOLOGY_RUNS": str(root), "HF_HUB_CACHE": str(tmp_path / "hf"),
           "OMP_NUM_THREADS": "1", "STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none"}
    env.pop("BERTOLOGY_APP_TOKEN", None)
    log_path = tmp_path / f"{name}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "app", "--port", str(port), *flags],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:  # until healthy, or until it exits or the deadline passes
            try:
                if urllib.request.urlopen(f"{base}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the app did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield Served(base, proc, log_path)
    finally:
        stop_group(proc)
        log.close()


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of `proc` (the command and Streamlit), SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture
def server(probe_store, tokenizers, tmp_path):
    with streamlit_server(runs_root(probe_store, tokenizers, tmp_path), tmp_path) as served:
        yield served.base


def wait_until_drawn(page, timeout_ms: int = 90_000) -> None:
    """Until the script run has finished: the status widget no longer says it is running."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText.includes('Running')",
        timeout=timeout_ms)


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


# url -> the heading the page draws first (its own title, not Streamlit's page of a file)
HEADINGS = {
    "runs": "Runs", "layer-curves": "Layer curves", "explorer": "Model explorer", "finetune": "Fine-tuning",
    "prune": "Compression: tickets, quantization, low rank", "distill": "Distillation: what a student keeps of its teacher",
    "peft": "Fine-tuning methods", "cost": "Cost of every checkpoint",
    "reproduce": "The literature's findings beside ours", "probe-syntax": "Syntax probes",
    "probe-cloze": "Cloze probes (oLMpics, Talmor et al. 2020)", "probe-coref": "Coreference probes",
    "probe-align": "Alignment: cross-lingual and cross-model", "probe-extraction": "Training-data extraction",
    "probe-membership": "Membership inference",
}


def test_no_pages_folder_beside_the_entry_script():
    """Streamlit serves `.py` files of a folder named `pages` beside the entry script as pages of its
    own (the first session of a server decides); the page modules live in app/page_modules/."""
    pages = Path(APP).with_name("pages")
    assert not (pages.is_dir() and any(pages.glob("*.py"))), (
        f"{pages}: Streamlit would take it for a file-based multipage app and serve its modules as "
        f"pages on a fresh server's first deep link; keep page modules in app/page_modules/")


def request_first(browser, base: str, url: str):
    """`base/url` as the first request of a new browser session; returns (context, page, start time)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1600})
    page = context.new_page()
    t0 = time.time()
    page.goto(f"{base}/{url}", wait_until="domcontentloaded")
    return context, page, t0


def check_page(opened, base: str, url: str, title: str) -> None:
    """The page opened by `request_first`, once drawn, is the app's own: its heading, the app's
    sidebar (`title` among its pages), no exception, error element or dialog ("Page not found"), the
    URL kept. `url` "" is the root, which opens the default page (Runs)."""
    context, page, t0 = opened
    heading = HEADINGS[url or "runs"]
    try:
        # a heading, or Streamlit's own sidebar of file pages (the blank page: fail at once)
        page.wait_for_function(
            "() => document.querySelector('[data-testid=\"stHeading\"]') || (document.querySelector("
            "'[data-testid=\"stSidebarNav\"]') || {innerText: ''}).innerText.includes('streamlit app')",
            timeout=120_000)
        wait_until_drawn(page)
        headings = [h.inner_text().strip() for h in page.locator('[data-testid="stHeading"]').all()]
        assert headings and headings[0] == heading, (url, headings)
        nav = page.locator('[data-testid="stSidebarNav"]').inner_text()
        assert "Model explorer" in nav and title in nav and "streamlit app" not in nav, (url, nav)
        # the default page's own link included: before issue 51 `/runs` showed "Page not found" and
        # fell back to the root (the default page is served at the root, its URL path "")
        assert "Page not found" not in page.inner_text("body"), url
        assert page.locator('[data-testid="stDialog"]').count() == 0, url
        assert page.url.rstrip("/") == f"{base}/{url}".rstrip("/"), (url, page.url)
        assert page.locator('[data-testid="stException"]').count() == 0, url
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0, url
    finally:
        context.close()
    print(f"/{url}: {time.time() - t0:.1f} s")


@pytest.mark.slow
def test_every_page_opens_by_its_link_on_a_fresh_server(probe_store, tokenizers, tmp_path):
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium); the browser test needs it")
    from playwright.sync_api import sync_playwright

    from app.navigation import page_specs

    specs = {s.url: s for s in page_specs()}
    assert sorted(specs) == sorted(HEADINGS)  # a new page gets its heading here
    root = runs_root(probe_store, tokenizers, tmp_path)
    t0 = time.time()
    with streamlit_server(root, tmp_path, "first") as first_server, \
            streamlit_server(root, tmp_path, "second") as second_server, \
            streamlit_server(root, tmp_path, "third") as third_server, sync_playwright() as p:
        first, second, third = first_server.base, second_server.base, third_server.base
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"])
        # the first request of each fresh server is a deep link (issue 40's /prune, a probe page, and
        # issue 51's /runs, the default page's own link); the servers start their first script run at once
        cold = [(first, "prune"), (second, "probe-syntax"), (third, "runs")]
        opened = [request_first(browser, base, url) for base, url in cold]
        for (base, url), o in zip(cold, opened):
            check_page(o, base, url, specs[url].title)
        # then every other page's URL as a new session's first request, the default page (runs) and
        # the root last
        for url in sorted((u for u in specs if u != "prune"), key=lambda u: (u == "runs", u)) + [""]:
            check_page(request_first(browser, first, url), first, url, specs[url or "runs"].title)
        browser.close()
    print(f"{len(specs) + 3} links on three fresh servers in {time.time() - t0:.1f} s")
