"""Extraction precision (issue 30): the CPU-flag rule, bf16 forwards under autocast, the compute dtype
in the activation cache key and meta, fp32 vectors out, Llama-style massive activations intact, and
the probes' `dtype` setting (validated, `auto` resolved, recorded in the run manifest)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.conftest import tiny_bert
from workbench.activations import cache_path, extract
from workbench.errors import ConfigError
from workbench.running.models import ModelHandle
from workbench.precision import autocast, cpu_has_native_bf16, resolve_compute_dtype

SENTENCES = [["The", "cat", "sat", "on", "the", "mat", "."], ["Dogs", "bark", "."], ["A", "very", "long", "word", "list"]]


def _cpuinfo(tmp_path, name: str, flags: str) -> str:
    path = tmp_path / name
    path.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n\n", encoding="utf-8")
    return str(path)


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    assert cpu_has_native_bf16(_cpuinfo(tmp_path, "amx", "avx2 amx_bf16 amx_tile"))
    assert cpu_has_native_bf16(_cpuinfo(tmp_path, "avx512", "avx2 avx512f avx512_bf16"))
    assert not cpu_has_native_bf16(_cpuinfo(tmp_path, "plain", "avx2 avx512f"))  # bf16 emulated: slower than fp32
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))


def test_resolve_compute_dtype(monkeypatch):
    assert resolve_compute_dtype("fp32") == "fp32" and resolve_compute_dtype("bf16") == "bf16"
    import workbench.precision as precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert resolve_compute_dtype("auto", "cpu") == "bf16"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_compute_dtype("auto", torch.device("cpu")) == "fp32"
    with pytest.raises(ConfigError, match="probe.yaml: dtype.*'fp16'"):
        resolve_compute_dtype("fp16", where="probe.yaml: dtype")
    with pytest.raises(ConfigError, match="resolve 'auto' first"):
        with autocast("auto", "cpu"):
            pass


@pytest.fixture(scope="module")
def bert_pair(tokenizers):
    tok = tokenizers["bert"]
    fp32 = ModelHandle(tiny_bert(tok, seed=1, hidden=64, layers=2), tok)
    return fp32, fp32.with_dtype("bf16")


def _reference_states(handle, sentences, bf16: bool) -> list[np.ndarray]:
    """First-subword vectors of each sentence from a plain forward of the model, one sentence at a
    time (optionally under torch.autocast bf16): the reference the handle's batched path must match."""
    out = []
    for words in sentences:
        enc = handle.tokenizer(words, is_split_into_words=True, return_tensors="pt")
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hs = handle.model.base_model(**enc, output_hidden_states=True).hidden_states
        first, seen = [], set()
        for pos, w in enumerate(enc.word_ids()):
            if w is not None and w not in seen:
                seen.add(w)
                first.append(pos)
        out.append(torch.stack([h[0, first].float() for h in hs]).numpy())
    return out


def test_with_dtype_shares_the_model_and_identity(bert_pair):
    fp32, bf16 = bert_pair
    assert (fp32.compute_dtype, bf16.compute_dtype) == ("fp32", "bf16")
    assert bf16.model is fp32.model and bf16.checkpoint_hash == fp32.checkpoint_hash
    assert fp32.with_dtype("fp32") is fp32
    assert all(p.dtype == torch.float32 for p in fp32.model.parameters())  # autocast: weights unchanged
    twin = bf16.derive("random_init", {"seed": 5})
    assert twin.compute_dtype == "bf16"  # a model made from a bf16 handle computes in bf16 too


def test_bf16_word_states_are_fp32_and_match_an_autocast_reference(bert_pair):
    fp32, bf16 = bert_pair
    got32 = [np.array(a) for a in fp32.word_states(SENTENCES)]
    got16 = [np.array(a) for a in bf16.word_states(SENTENCES)]
    ref32 = _reference_states(fp32, SENTENCES, bf16=False)
    ref16 = _reference_states(fp32, SENTENCES, bf16=True)
    for g32, g16, r32, r16 in zip(got32, got16, ref32, ref16):
        assert g16.dtype == np.float32
        np.testing.assert_allclose(g32, r32, atol=1e-5)
        # bf16 batches (padding) round differently from one sentence at a time: bf16's 2^-8 relative step
        np.testing.assert_allclose(g16, r16, atol=0.05 * np.abs(r32).max())
        diff = np.abs(g16 - g32).max()
        assert 0 < diff < 0.05 * np.abs(g32).max()  # bf16 really ran, and stayed close to fp32


def test_bf16_extraction_is_its_own_cache_entry(bert_pair, tmp_path):
    fp32, bf16 = bert_pair
    p32 = cache_path(fp32, SENTENCES, "toy", cache_dir=tmp_path)
    p16 = cache_path(bf16, SENTENCES, "toy", cache_dir=tmp_path)
    assert p32 != p16
    a16 = extract(bf16, SENTENCES, "toy", cache_dir=tmp_path, progress=False)  # bf16 first ...
    a32 = extract(fp32, SENTENCES, "toy", cache_dir=tmp_path, progress=False)  # ... never read back as fp32
    assert (a16.path, a32.path) == (p16, p32)
    assert a16.meta["compute_dtype"] == "bf16" and a32.meta["compute_dtype"] == "fp32"
    ref = np.concatenate(_reference_states(fp32, SENTENCES, bf16=False), axis=1)
    np.testing.assert_allclose(np.asarray(a32.layers), ref, atol=1e-5)
    assert np.abs(np.asarray(a16.layers) - ref).max() > 1e-4
    again = extract(fp32.with_dtype("bf16"), SENTENCES, "toy", cache_dir=tmp_path, progress=False)
    assert again.path == p16  # the same weights in bf16 read the bf16 entry


def test_massive_activations_survive_bf16(tokenizers):
    """Llama-style massive activations (Sun et al. 2024): a few residual-stream values thousands of
    times the rest. bf16 has fp32's exponent, so nothing overflows (fp16's limit is 65504), and
    under autocast the residual stream stays fp32: the massive value keeps its size and a linear
    readout of the ordinary dimensions keeps working."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizers["gpt"]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    the = tok(" the")["input_ids"][0]
    with torch.no_grad():
        model.model.embed_tokens.weight[the, 7] = 1.0e5  # massive: > fp16's max, as in real Llamas' sink tokens
    fp32 = ModelHandle(model, tok)
    bf16 = fp32.with_dtype("bf16")
    s32 = np.concatenate([np.array(a) for a in fp32.word_states(SENTENCES)], axis=1)
    s16 = np.concatenate([np.array(a) for a in bf16.word_states(SENTENCES)], axis=1)
    assert np.isfinite(s16).all()
    words = [w for s in SENTENCES for w in s]
    at = [i for i, w in enumerate(words) if w == "the"]
    # the residual stream (layers 0..L-1) carries it; the last entry is after the final RMSNorm
    assert np.abs(s32[:-1, at, 7]).min() > 9e4
    np.testing.assert_allclose(s16[:, at, 7], s32[:, at, 7], rtol=1e-2)
    others = np.delete(s32, 7, axis=2)
    np.testing.assert_allclose(np.delete(s16, 7, axis=2), others, atol=0.05 * np.abs(others).max())


@pytest.mark.parametrize("value, message", [("fp16", "dtype must be one of"), ("float32", "dtype must be one of")])
def test_probe_dtype_setting_is_validated(value, message):
    import probes
    from probes.core import runner

    spec = probes.get_probe("syntax")
    with pytest.raises(ConfigError, match=message):
        runner.resolve_settings(spec, {"tasks": "upos", "dtype": value}, "probe syntax")


@pytest.mark.slow  # two syntax-probe runs of a tiny model (~20 s on a loaded 2-core machine)
def test_probe_dtype_auto_is_resolved_and_recorded(tiny_checkpoint, tmp_path, monkeypatch):
    import workbench.precision as precision
    from probes.core import runner
    import probes
    from workbench.store.results import ResultsStore

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    spec = probes.get_probe("syntax")
    settings = runner.resolve_settings(spec, {"tasks": "upos", "dtype": "auto"}, "probe syntax")
    assert settings.dtype == "bf16" and settings.resume_key()["dtype"] == "bf16"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert runner.resolve_settings(spec, {"tasks": "upos", "dtype": "auto"}, "x").dtype == "fp32"

    # a run in bf16 records it, and its cache entries are the bf16 ones
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    store = ResultsStore(tmp_path / "runs")
    common = dict(tasks=("upos",), baselines=(), max_train_sentences=40, max_eval_sentences=20, mdl_tasks=(),
                  scalar_mix_tasks=(), cache_dir=str(tmp_path / "acts"), progress=False)
    ids = {}
    for dtype in ("fp32", "bf16"):
        run_id, rows = runner.run_probe("syntax", [str(tiny_checkpoint)], {**common, "dtype": dtype}, store=store)
        m = store.manifest(run_id)
        assert m["config"]["dtype"] == dtype and m["notes"]["compute_dtype"] == dtype
        ids[dtype] = rows
    metas = [json.loads((p / "meta.json").read_text()) for p in (tmp_path / "acts").iterdir() if not p.name.startswith(".")]
    assert sorted({m["compute_dtype"] for m in metas}) == ["bf16", "fp32"]
    a32 = ids["fp32"].sort_values(["layer", "metric"])["value"].to_numpy()
    a16 = ids["bf16"].sort_values(["layer", "metric"])["value"].to_numpy()
    assert len(a32) == len(a16) and np.nanmax(np.abs(a32 - a16)) < 0.1  # a tiny random model: same accuracies, roughly


def test_shipped_bf16_experiment_config_loads_and_resolves():
    from pathlib import Path

    import probes
    from app.experiments import load_experiment
    from probes.core import runner

    spec = load_experiment(Path(__file__).resolve().parents[1] / "experiments" / "probe_real_bf16.yaml")
    settings = runner.resolve_settings(probes.get_probe("syntax"), spec["probe"]["syntax"], "probe_real_bf16.yaml")
    assert settings.dtype == "bf16" and settings.tasks == ("upos",)
