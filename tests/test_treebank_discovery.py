"""A UD treebank copied into the data root under a new name is found (workbench.data.conllu's
`discover_treebanks`) and read by the syntax probe and by the alignment probe's parallel task,
with no code change: here slices of the real EWT and PUD files, renamed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.data.conllu import SHIPPED_TREEBANKS, TREEBANKS, read_conllu, treebank_path
from workbench.paths import DATA_ENV, data_path


def _first_sentences(src, dst, n: int, rename: tuple[str, str] | None = None) -> None:
    """The first `n` sentence blocks of the CoNLL-U file `src`, written to `dst` unchanged."""
    blocks = src.read_text(encoding="utf-8").split("\n\n")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n\n".join(blocks[:n]) + "\n\n", encoding="utf-8")


@pytest.fixture
def new_data_root(tmp_path, monkeypatch):
    """A data root holding only treebanks the code has never heard of:
    - `xx_new`: 150 sentences of EWT train and 50 of dev, as `xx_new-ud-train.conllu`, `-dev.conllu`;
    - `aa_par` and `bb_par`: the same first 60 sentences of PUD English (a parallel pair whose
      two sides are identical text: the planted perfect alignment);
    - `broken`: a folder whose file does not follow UD's naming (not a treebank)."""
    real = {name: data_path("ud", name) for name in ("en_ewt", "en_pud")}
    root = tmp_path / "data"
    ud = root / "ud"
    _first_sentences(real["en_ewt"] / "en_ewt-ud-train.conllu", ud / "xx_new" / "xx_new-ud-train.conllu", 150)
    _first_sentences(real["en_ewt"] / "en_ewt-ud-dev.conllu", ud / "xx_new" / "xx_new-ud-dev.conllu", 50)
    for name in ("aa_par", "bb_par"):
        _first_sentences(real["en_pud"] / "en_pud-ud-test.conllu", ud / name / f"{name}-ud-test.conllu", 60)
    _first_sentences(real["en_ewt"] / "en_ewt-ud-dev.conllu", ud / "broken" / "dev.conllu", 5)
    monkeypatch.setenv(DATA_ENV, str(root))
    return {"root": root, "ewt_dev": real["en_ewt"] / "en_ewt-ud-dev.conllu"}


def test_treebanks_are_discovered_from_the_data_root(new_data_root):
    assert TREEBANKS["xx_new"] == ("train", "dev")
    assert TREEBANKS["aa_par"] == TREEBANKS["bb_par"] == ("test",)
    assert "broken" not in TREEBANKS
    for name, splits in SHIPPED_TREEBANKS.items():  # the shipped ones keep their names and splits
        assert TREEBANKS[name] == splits
    assert set(TREEBANKS) == set(SHIPPED_TREEBANKS) | {"xx_new", "aa_par", "bb_par"}
    dev = read_conllu(treebank_path("xx_new", "dev"))
    real = read_conllu(new_data_root["ewt_dev"])[:50]
    assert [s.words for s in dev] == [s.words for s in real] and [s.heads for s in dev] == [s.heads for s in real]
    with pytest.raises(ValueError, match=r"treebank xx_new has no 'test' split; it has \('train', 'dev'\)"):
        treebank_path("xx_new", "test")


@pytest.mark.slow
def test_syntax_probe_reads_a_new_treebank(new_data_root, tiny_checkpoint, tmp_path, capsys):
    from app.cli import main
    from workbench.store.results import ResultsStore

    runs = tmp_path / "runs"
    code = main(["probe", "syntax", "--treebank", "xx_new", "--tasks", "upos", "--checkpoint", str(tiny_checkpoint),
                 "--max-train-sentences", "150", "--max-eval-sentences", "50", "--n-boot", "20", "--baselines", "",
                 "--runs-root", str(runs), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = ResultsStore(runs).query(probe="syntax")
    acc = rows[(rows["task"] == "upos") & (rows["metric"] == "accuracy")]
    assert sorted(acc["layer"]) == [0, 1, 2]
    # evaluated on every word of the 50 dev sentences, the treebank named in the rows
    n_words = sum(len(s) for s in read_conllu(new_data_root["ewt_dev"])[:50])
    assert set(acc["n"]) == {n_words}
    assert {json.loads(e)["treebank"] for e in acc["extra"]} == {"xx_new"}
    assert ((acc["value"] > 0) & (acc["value"] <= 1)).all()


def test_align_parallel_task_reads_a_new_pair(new_data_root, tiny_checkpoint, tmp_path):
    from probes.core.runner import run_probe
    from workbench.store.results import ResultsStore

    same = tmp_path / "en-en.tsv"
    same.write_text("".join(f"{w}\t{w}\n" for w in ("the", "of", "and", "a", "in", "is", "to")))
    settings = {"tasks": "parallel", "parallel_src": "ud:aa_par", "parallel_tgt": "ud:bb_par",
                "dictionary": f"tsv:{same}", "baselines": "", "n_boot": 20, "progress": False, "threads": 1,
                "cache_dir": str(tmp_path / "cache")}
    _, rows = run_probe("align", [str(tiny_checkpoint)], settings, store=ResultsStore(tmp_path / "runs"))
    acc = rows[(rows["task"] == "parallel") & (rows["metric"] == "accuracy")].sort_values("layer")
    assert len(acc) == 3 and set(acc["n"]) == {30}  # 60 pairs matched by sent_id, half held out
    # both sides are the same sentences through the same model: the identity map retrieves each one
    assert np.all(acc["value"].to_numpy() == 1.0)
