"""Every page of the app that has no rows says which command makes them (issue 40), on an empty
runs root and on one holding only syntax-probe rows (where, before, the Compression page told the
user to run `bertology probe prune --checkpoint ...`, a command that does not exist). The pages are
the app's own list (`app.navigation.page_specs`), so a new page without its line fails here."""

from __future__ import annotations

import re

import pytest
from streamlit.testing.v1 import AppTest

from app.navigation import page_specs
from tests.test_app import APP, app_env  # noqa: F401 - the fixture: a copy of the syntax probe store
from workbench.paths import REPO_ROOT

# url -> the command its empty page names (a YAML it names must exist)
COMMANDS = {
    "runs": "bertology run experiments/main.yaml",
    "layer-curves": "bertology run experiments/main.yaml",
    "explorer": "bertology train experiments/train/bert_small.yaml",
    "finetune": "bertology finetune experiments/finetune_polarity.yaml --checkpoint",
    "prune": "bertology prune experiments/prune/minilm_polarity_cpu.yaml",
    "distill": "bertology distill experiments/distill/polarity_minilm_cpu.yaml",
    "peft": "bertology peft experiments/peft/minilm_polarity_cpu.yaml",
    "cost": "bertology train experiments/train/bert_small.yaml",
    "reproduce": "bertology reproduce",
    "probe-syntax": "bertology probe syntax --checkpoint",
    "probe-cloze": "bertology probe cloze --checkpoint",
    "probe-coref": "bertology probe coref --checkpoint",
    "probe-align": "bertology probe align --tasks parallel --checkpoint",
    "probe-extraction": "bertology run experiments/extraction/gpt_tiny_canaries_run.yaml",
    "probe-membership": "bertology probe membership --checkpoint",
}
# pages whose rows the syntax store does not hold
NOT_SYNTAX = ["finetune", "prune", "distill", "peft", "reproduce", "probe-cloze", "probe-coref", "probe-align", "probe-extraction",
              "probe-membership"]


def _page(url: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = url
    return at.run()


def _says_command(at: AppTest, url: str) -> str:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    lines = [i.value for i in at.info]
    line = next((x for x in lines if COMMANDS[url] in x), None)
    assert line is not None, (url, lines)
    for yaml in re.findall(r"experiments/\S+\.yaml", line):
        assert (REPO_ROOT / yaml).is_file(), (url, yaml)
    return line


def test_every_page_has_a_command_for_its_rows():
    assert sorted(s.url for s in page_specs()) == sorted(COMMANDS)


@pytest.mark.slow
def test_every_page_on_an_empty_store_names_the_command_that_makes_its_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    for spec in page_specs():
        _says_command(_page(spec.url), spec.url)


@pytest.mark.slow
def test_pages_without_their_rows_in_a_store_of_other_rows_name_their_command(app_env):  # noqa: F811
    for url in NOT_SYNTAX:
        line = _says_command(_page(url), url)
        assert "bertology probe prune" not in line and "bertology probe finetune" not in line
