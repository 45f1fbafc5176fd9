"""Training-data extraction (probes/extraction) and canaries (workbench/data/canaries.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from probes.extraction import exposure_estimate, exposure_exact, precision_at
from workbench.config import load_train_config
from workbench.data.canaries import insert_canaries, make_canaries, validate_spec
from workbench.data.raw import Document
from workbench.errors import ConfigError

SPEC = {"repetitions": [1, 4], "per_count": 2, "unseen": 3, "digits": 4, "seed": 5}


def test_canaries_are_seeded_distinct_and_inserted_as_often_as_asked():
    a, b = make_canaries(SPEC), make_canaries(SPEC)
    assert a == b and len({c.secret for c in a}) == 7
    assert [c.repetitions for c in a] == [1, 1, 4, 4, 0, 0, 0]
    assert all(c.text == "my number is " + " ".join(c.secret) and len(c.secret) == 4 for c in a)
    train = [Document(f"d{i}", "x", f"text {i}") for i in range(50)]
    out, canaries = insert_canaries(train, SPEC)
    planted = [d for d in out if d.source == "canary"]
    assert len(planted) == 10 and [d for d in out if d.source != "canary"] == train  # order of the rest kept
    for c in canaries:
        assert sum(d.text == c.text for d in planted) == c.repetitions
    assert make_canaries({**SPEC, "seed": 6})[0].secret != a[0].secret


@pytest.mark.parametrize("bad, match", [({"repetitions": [0, 4]}, "integer >= 1"), ({"repetitions": []}, "integer >= 1"),
                                        ({"digits": 0}, "digits"), ({"colour": 1}, "unknown key"),
                                        ({"template": "no secret"}, "template"),
                                        ({"repetitions": 4}, "repetitions: expected a list"),
                                        ({"per_count": "two"}, "per_count: expected an integer"),
                                        ({"unseen": 1.5}, "unseen: expected an integer"),
                                        ({"digits": None}, "digits: cannot be empty")])
def test_bad_canary_specs_are_one_clear_error(bad, match):
    with pytest.raises(ConfigError, match=match):
        validate_spec({**SPEC, **bad})


def test_canaries_join_the_training_hash_only_when_present():
    base = {"family": "gpt", "steps": 10}
    plain = load_train_config(base)
    assert plain.training_hash() == load_train_config({**base, "corpus": {"canaries": None}}).training_hash()
    with_c = load_train_config({**base, "corpus": {"canaries": SPEC}})
    assert with_c.training_hash() != plain.training_hash()
    with pytest.raises(ConfigError, match=r"<dict>: corpus.canaries.repetitions"):
        load_train_config({**base, "corpus": {"canaries": {"repetitions": [0]}}})


def test_exposure_exact_by_hand():
    logps = np.log(np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05]))
    assert exposure_exact(logps[0], logps) == (pytest.approx(np.log2(6)), 1)  # the most likely: maximum exposure
    value, rank = exposure_exact(logps[4], logps)
    assert rank == 5 and value == pytest.approx(np.log2(6) - np.log2(5))


def test_exposure_estimate_matches_the_distribution_it_samples():
    rng = np.random.default_rng(0)
    logp = -stats.skewnorm.rvs(4, loc=30, scale=3, size=20000, random_state=rng)  # log-perplexity ~ skew-normal
    for q in (0.25, 1e-3, 1e-6):  # the canary at the q-quantile of log-perplexity: exposure -log2 q
        canary = -stats.skewnorm.ppf(q, 4, loc=30, scale=3)
        fit, emp = exposure_estimate(canary, logp)
        assert fit == pytest.approx(-np.log2(q), abs=0.35 + 0.05 * -np.log2(q))
        assert emp <= np.log2(len(logp) + 1) + 1e-9
    assert exposure_estimate(-30.0 - 100, logp)[0] < 0.01  # far less likely than any candidate: ~0


def test_precision_at_top_n_by_hand():
    scores = np.array([0.9, 0.1, 0.8, 0.7, 0.2])
    memorised = np.array([1, 1, 0, 1, 0])
    assert precision_at(scores, memorised, 2) == 0.5 and precision_at(scores, memorised, 3) == pytest.approx(2 / 3)


@pytest.mark.slow
def test_a_tiny_gpt_memorises_its_repeated_canary_and_not_the_unseen_ones(tmp_path, monkeypatch):
    """Planted signal: a canary seen 256 times in a ~10k-token corpus sits at the maximum exposure
    (log2 1000 = 9.97, exact enumeration); unseen canaries near a random candidate's (~1). Dropout is
    off so that memorising is the training's only outcome, not one draw of its masks.

    The repetitions are set so that greedy decoding writes all three digits on every CPU kind: at 64
    the exposure was maximal everywhere, but whether greedy decoding wrote the secret depended on
    the arithmetic (yes on the Intel Xeon; on the AMD EPYC for 1 of 3 training seeds). At 128 and
    256 it wrote it for 3 of 3 seeds on the AMD EPYC (2026-11-29); a change of seed moves the
    training far more than a change of CPU kind does, so 256 (twice the smallest safe count) holds."""
    from probes.core.runner import run_probe
    from tests.training_helpers import run_tiny_training

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    run = run_tiny_training("gpt", 600, tmp_path / "train", lr=5e-3,
                            **{"corpus.sources": ["inaugural"], "corpus.max_documents": 6, "max_len": 32,
                               "model.resid_pdrop": 0.0, "model.embd_pdrop": 0.0, "model.attn_pdrop": 0.0,
                               "corpus.canaries": {"repetitions": [256], "per_count": 1, "unseen": 4, "digits": 3}})
    _, rows = run_probe("extraction", [run.checkpoint], {"tasks": ["exposure"], "progress": False, "n_boot": 10})
    exp = rows[rows["metric"] == "exposure"]
    seen, unseen = exp[exp["split"] == "seen"]["value"], exp[exp["split"] == "unseen"]["value"]
    assert len(seen) == 1 and len(unseen) == 4
    assert seen.iloc[0] >= np.log2(1000 / 2) - 1e-9  # rank <= 2 of 1000 (rank 1: 9.97; rank 2: 8.97)
    assert unseen.mean() < 3.0
    ext = rows[(rows["metric"] == "extracted") & (rows["split"] == "seen")]["value"]
    assert ext.iloc[0] == 1.0  # greedy decoding from "my number is" writes the secret


def test_cli_refuses_an_encoder_and_zero_repetitions_in_one_line(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    assert main(["generate", str(tiny_checkpoint), "hello"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot generate: its LM head is 'mlm'" in err[0] and str(tiny_checkpoint) in err[0]
    cfg = tmp_path / "canary.yaml"
    cfg.write_text("family: gpt\nsteps: 5\ncorpus: {canaries: {repetitions: [4, 0]}}\n")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{cfg}: corpus.canaries.repetitions" in err[0]
    assert not (tmp_path / "runs").exists()  # nothing written before the refusal
    cfg.write_text("family: gpt\nsteps: 5\ncorpus: {canaries: {repetitions: [4], per_count: two}}\n")
    assert main(["train", str(cfg)]) == 2  # a malformed value: one line, not a traceback
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(cfg) in err[0] and "per_count: expected an integer, got 'two'" in err[0]
    assert not (tmp_path / "runs").exists()


def test_probe_settings_refuse_impossible_requests():
    from probes.core.runner import make_settings
    from probes.extraction import PROBE, Settings

    for bad, match in (({"rankings": ["loudness"]}, "unknown ranking"), ({"rankings": ["reference"]}, "--reference"),
                       ({"verbatim_tokens": 60, "max_new_tokens": 48}, "verbatim_tokens"),
                       ({"top_n": 500, "n_samples": 100}, "top_n"), ({"top_p": 2.0}, "top_p")):
        s = make_settings(Settings, {"tasks": ["samples"], **bad})
        with pytest.raises(ConfigError, match=match):
            s.validate(PROBE)


def test_rankings_by_hand(tiny_models, tokenizers):
    """Carlini et al. 2021's metrics from the model's own token log-probs: -log-ppl, zlib, lowercase, reference."""
    import zlib

    from probes.extraction import ranking_scores
    from tests.conftest import tiny_gpt2
    from workbench.running.lm_scores import lm_scorer
    from workbench.running.models import ModelHandle

    target = ModelHandle(*tiny_models["gpt"])
    reference = ModelHandle(tiny_gpt2(tokenizers["gpt"], seed=5), tokenizers["gpt"])
    texts = ["The City Council met on Monday .", "I like green tea", "WE THE PEOPLE of the United States"]
    nll = lambda h, ts: np.array([-s.logprobs.mean() for s in lm_scorer(h).causal_logprobs(ts)])  # noqa: E731
    got = ranking_scores(target, texts, ("perplexity", "zlib", "lowercase", "reference", "random"), 4, reference)
    t = nll(target, texts)
    np.testing.assert_allclose(got["perplexity"], -t, rtol=1e-5)
    np.testing.assert_allclose(got["zlib"], -t / [len(zlib.compress(x.encode())) for x in texts], rtol=1e-5)
    np.testing.assert_allclose(got["lowercase"], nll(target, [x.lower() for x in texts]) / t, rtol=1e-5)
    np.testing.assert_allclose(got["reference"], -t / nll(reference, texts), rtol=1e-5)
    assert got["random"].shape == (3,) and len(set(got["random"])) == 3


def test_probe_refuses_bad_checkpoints_before_any_work(tiny_models, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """A model that cannot generate, a checkpoint without a recorded corpus, and exposure on a corpus
    without canaries: one line, exit 2, before the training split is tokenised or a run is opened."""
    import json
    import shutil

    import probes.extraction as extraction
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(extraction, "streams_for", lambda *a, **k: pytest.fail("the corpus was read"))
    corpus = {"dir": "cache/corpus/x", "manifest": "cache/corpus/x/manifest.json", "split": "train"}
    gpt = tmp_path / "gpt"
    model, tok = tiny_models["gpt"]
    model.save_pretrained(gpt)
    tok.save_pretrained(gpt)
    (gpt / "manifest.json").write_text(json.dumps({"family": "gpt", "corpus": corpus,
                                                   "corpus_recipe": {"recipe": 1, "seed": 0}}))
    bart = tmp_path / "bart"
    model, tok = tiny_models["bart"]
    model.save_pretrained(bart)
    tok.save_pretrained(bart)
    (bart / "manifest.json").write_text(json.dumps({"family": "bart", "corpus": corpus}))
    bert = tmp_path / "bert"
    shutil.copytree(tiny_checkpoint, bert)
    (bert / "manifest.json").write_text(json.dumps({"family": "bert", "corpus": corpus}))
    capsys.readouterr()  # the saving above printed progress bars
    for ckpt, tasks, message in ((tiny_checkpoint, "samples", "records its training corpus"),
                                 (bert, "samples", "cannot generate: its LM head is 'mlm'"),
                                 (f"{gpt},{bert}", "k_extraction", "cannot generate"),  # the 2nd of two
                                 (gpt, "exposure", "has no canaries"),
                                 (bart, "k_extraction", "k_extraction needs a model that continues its prompt")):
        assert main(["probe", "extraction", "--checkpoint", str(ckpt), "--tasks", tasks]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    results = tmp_path / "runs" / "results"
    assert not results.exists() or not [p for p in results.iterdir() if not p.name.startswith(".")]  # no run


def test_generate_reads_a_training_folder_at_its_last_step(tokenizers, tmp_path, capsys):
    """`bertology generate runs/train/NAME/seed-0 ...` (the README's form) generates from the last
    saved step, exactly as naming that step does; several seeds are one line asking for one."""
    from app.cli import main
    from tests.conftest import tiny_gpt2

    tok = tokenizers["gpt"]
    for seed in (0, 1):
        for step in (0, 10):  # step 10 another model than step 0: the last step must be the one read
            folder = tmp_path / "run" / f"seed-{seed}" / f"step-{step:07d}"
            tiny_gpt2(tok, seed=step).save_pretrained(folder)
            tok.save_pretrained(folder)
    capsys.readouterr()
    args = ["The city", "--max-new-tokens", "6", "--json"]  # greedy: near-uniform random models differ in argmax
    assert main(["generate", str(tmp_path / "run" / "seed-0"), *args]) == 0
    by_folder = capsys.readouterr().out
    assert main(["generate", str(tmp_path / "run" / "seed-0" / "step-0000010"), *args]) == 0
    assert capsys.readouterr().out == by_folder
    assert main(["generate", str(tmp_path / "run" / "seed-0" / "step-0000000"), *args]) == 0
    assert capsys.readouterr().out != by_folder
    assert main(["generate", str(tmp_path / "run"), "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds checkpoints of 2 seeds; give one seed-S folder" in err[0]


@pytest.mark.parametrize("family", ["gpt", "t5", "bart"])
def test_exposure_scores_every_generating_family(tiny_models, family):
    """Exposure ranks the filled template by the model's own likelihood: GPT left to right, T5 and
    BART as the target of itself (the samples rankings' reading); checked against the scorer."""
    from probes.extraction import _secret_logps, exposure_exact
    from workbench.running.lm_scores import lm_scorer
    from workbench.running.models import ModelHandle

    handle = ModelHandle(*tiny_models[family])
    secrets = [f"{i:02d}" for i in range(100)]
    got = _secret_logps(handle, "my number is {secret}", secrets, 32)
    texts = [f"my number is {s[0]} {s[1]}" for s in secrets]
    scorer = lm_scorer(handle)
    want = [t.total for t in (scorer.seq2seq_logprobs(texts, texts) if family != "gpt" else scorer.text_logprobs(texts))]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.isfinite(got).all() and len(set(np.round(got, 6))) > 1
    value, rank = exposure_exact(got[int(np.argmax(got))], got)
    assert rank == 1 and value == pytest.approx(np.log2(100))
