"""What the extraction rankings score (probes/extraction, task `samples`).

Carlini et al. 2021 ("Extracting Training Data from Large Language Models") rank each generated sample
by metrics of the whole sample, prompt included (their code scores `batch_decode` of the full output
sequence); `scored_text: continuation` keeps the new tokens alone as a named option. The tests run
`samples_rows` on a tiny random GPT over a synthetic token stream and recompute the perplexity ranking
by hand (one forward pass, log-softmax, the mean over the tokens after the start token).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.errors import ConfigError


def _stream(tok, n_words: int = 600, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = ["the", "people", "of", "our", "nation", "have", "spoken", "and", "we", "shall", "keep", "faith",
             "with", "them", "in", "every", "year", "to", "come", "freedom", "union", "congress"]
    text = " ".join(rng.choice(words, n_words))
    return np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def _run_samples(tiny_models, monkeypatch, **overrides):
    """samples_rows on the tiny GPT with `streams_for` giving a synthetic stream; returns the
    generations `generate` produced and, per source, the texts `ranking_scores` received and its scores."""
    import probes.extraction as extraction
    import workbench.running.generate as wg
    from probes.core.runner import make_settings
    from workbench.running.models import ModelHandle
    from workbench.verbatim import NgramIndex

    model, tok = tiny_models["gpt"]
    handle = ModelHandle(model, tok)
    settings = make_settings(extraction.Settings, {
        "tasks": ["samples"], "n_samples": 4, "top_n": 2, "prompt_tokens": 8, "max_new_tokens": 12,
        "verbatim_tokens": 6, "prompt_sources": ["empty", "train"], "rankings": ["perplexity"],
        "n_boot": 10, "progress": False, **overrides})
    settings.validate(extraction.PROBE)
    train, held = _stream(tok, seed=0), _stream(tok, seed=1)
    streams = extraction.Streams(train, held, NgramIndex.build(train, settings.verbatim_tokens), corpus=None)
    monkeypatch.setattr(extraction, "streams_for", lambda *a, **k: streams)
    generations, scored = [], []
    real_generate, real_scores = wg.generate, extraction.ranking_scores

    def spy_generate(*a, **k):
        generations.append(real_generate(*a, **k))
        return generations[-1]

    def spy_scores(handle, texts, *a, **k):
        scored.append((list(texts), real_scores(handle, texts, *a, **k)))
        return scored[-1][1]

    monkeypatch.setattr(wg, "generate", spy_generate)
    monkeypatch.setattr(extraction, "ranking_scores", spy_scores)
    unit = SimpleNamespace(handle=handle, roles={}, progress=False,
                           rows=lambda task, metrics, **kw: pd.DataFrame([{"metric": m, "value": v}
                                                                          for m, v in metrics.items()]))
    extraction.samples_rows(unit, None, settings)
    return handle, generations, scored


def _mean_logprob_by_hand(model, tok, text: str) -> float:
    """Mean log p(w_t | w_<t) of the text's tokens behind the start token (eos: the tiny GPT's bos)."""
    ids = [tok.eos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])
    return float(lp.mean())


def test_the_rankings_score_the_prompt_and_its_continuation(tiny_models, monkeypatch):
    """Default (`sequence`): a training-prompted sample's perplexity score is the mean log-probability
    of prompt + continuation, recomputed by hand; before the fix it was the continuation's alone."""
    handle, generations, scored = _run_samples(tiny_models, monkeypatch)
    model, tok = tiny_models["gpt"]
    (empty_g, train_g), (empty_texts, _), (train_texts, train_scores), (control_texts, _) = generations, *scored
    assert len(scored) == 3  # empty, train, the held-out text control
    for prompt, new, cont, got in zip(train_g.prompt_ids, train_g.new_ids, train_g.texts, train_texts):
        assert len(prompt) == 8
        whole = tok.decode(list(prompt) + list(new), skip_special_tokens=True)  # no eos among the new tokens here
        assert got == whole and got.endswith(cont) and len(got) > len(cont)
    want = [_mean_logprob_by_hand(model, tok, t) for t in train_texts]
    # float32 logits over a ~20-token sum: agreement to ~1e-6 relative; 1e-4 leaves room for batching
    np.testing.assert_allclose(train_scores["perplexity"], want, rtol=1e-4)
    continuation_only = [_mean_logprob_by_hand(model, tok, t) for t in train_g.texts]
    assert not np.allclose(want, continuation_only, rtol=1e-4, atol=0)  # the rule makes a difference here
    assert empty_texts == empty_g.texts  # the start token alone adds no text
    assert len(control_texts) == 4


def test_continuation_scoring_is_kept_as_an_option(tiny_models, monkeypatch):
    handle, generations, scored = _run_samples(tiny_models, monkeypatch, scored_text="continuation")
    model, tok = tiny_models["gpt"]
    train_g, (train_texts, train_scores) = generations[1], scored[1]
    assert train_texts == train_g.texts
    np.testing.assert_allclose(train_scores["perplexity"],
                               [_mean_logprob_by_hand(model, tok, t) for t in train_texts], rtol=1e-4)


def test_scored_texts_cut_the_continuation_at_eos_and_leave_seq2seq_alone(tiny_models):
    from probes.extraction import scored_texts
    from workbench.running.models import ModelHandle

    model, tok = tiny_models["gpt"]
    handle = ModelHandle(model, tok)
    a, b = tok("we the people", add_special_tokens=False)["input_ids"], tok(" of the union", add_special_tokens=False)["input_ids"]
    tail = tok(" congress", add_special_tokens=False)["input_ids"]
    g = SimpleNamespace(kind="causal", prompt_ids=[np.array([tok.eos_token_id] + a)],
                        new_ids=[np.array(b + [tok.eos_token_id] + tail)], texts=["(the continuation)"])
    (got,) = scored_texts(handle, g)
    assert got == tok.decode(a + b) and got.strip() == "we the people of the union"  # "congress" is after eos
    assert scored_texts(handle, g, "continuation") == ["(the continuation)"]
    assert scored_texts(handle, SimpleNamespace(**{**vars(g), "kind": "seq2seq"})) == ["(the continuation)"]


def test_a_bad_scored_text_is_one_line_and_exit_2_before_any_work(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import probes.extraction as extraction
    from app.cli import main
    from probes.core.runner import make_settings

    with pytest.raises(ConfigError, match="scored_text must be one of"):
        make_settings(extraction.Settings, {"tasks": ["samples"], "scored_text": "prompt"}).validate(extraction.PROBE)
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(extraction, "streams_for", lambda *a, **k: pytest.fail("the corpus was read"))
    capsys.readouterr()
    assert main(["probe", "extraction", "--checkpoint", str(tiny_checkpoint), "--tasks", "samples",
                 "--scored-text", "prompt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scored_text must be one of ['sequence', 'continuation'], got 'prompt'" in err[0], err
    results = tmp_path / "runs" / "results"
    assert not results.exists() or not [p for p in results.iterdir() if not p.name.startswith(".")]


def test_memorisation_is_checked_on_the_sample_up_to_its_end_of_sequence_token():
    """The sample ends at its first end-of-sequence token (Hugging Face `generate`, as in Carlini et
    al.'s code): a training span written after it is not part of the sample, for the rankings and the
    memorisation check alike."""
    from probes.extraction import until_eos
    from workbench.verbatim import NgramIndex

    eos = 0
    stream = np.array([5, 6, 7, 8, 9, 10, 11, 12], dtype=np.int64)
    index = NgramIndex.build(stream, k=4)
    new = [21, 22, eos, 5, 6, 7, 8]  # the model closes its text, then writes training text
    assert until_eos(new, eos) == [21, 22]
    assert index.match(np.array(new)).memorised  # all tokens: a false memorisation
    assert not index.match(np.array(until_eos(new, eos))).memorised  # the sample: nothing memorised
    assert until_eos([5, 6, 7, 8], eos) == [5, 6, 7, 8] and until_eos([eos], eos) == []
    assert until_eos([5, 0], None) == [5, 0]
    assert not index.match(np.array([], dtype=np.int64)).memorised
