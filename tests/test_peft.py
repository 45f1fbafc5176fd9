"""Parameter-efficient fine-tuning (workbench/running/peft_methods.py through workbench/drivers/finetune.py).

- trainable-parameter counts equal the methods' formulas (LoRA r*(d_in+d_out) per adapted matrix,
  query and value by default, the key too with lora_targets: qkv; a bottleneck adapter 2*d*m + m + d
  plus 2*d per layer norm of the body unless adapter_norms: frozen; a prompt n*d; plus the classifier
  head, and BERT's pooler where it was not pretrained) in BERT, RoBERTa, DeBERTa-v2 and GPT-2,
  counted from the configs, not from the modules (the papers' details: test_peft_paper_details.py);
- BitFit and head-only training leave every other tensor bit-identical and move what they train;
- the saved checkpoint of every method is plain transformers that gives the trained model's
  outputs: LoRA merged (opens in AutoModel), adapters and prompts back in a probe's forward
  through ModelHandle.load;
- the method is part of the run's identity; a bad method or size is one line and exit 2 before
  any work.

Tiny random models (2 layers, hidden 32) on 64 sentences of sentence_polarity.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import tiny_bert, tiny_gpt2
from tests.seeding import seeded
from tests.training_helpers import tiny_finetune_config
from workbench.errors import ConfigError
from workbench.drivers.finetune import load_finetune_config, run_finetune
from workbench.running.classifier_loading import build_classifier, load_classifier
from workbench.loop import apply_param_filter
from workbench.running.models import ModelHandle
from workbench.running.peft_methods import METHODS, MethodOptions, attach
from workbench.store.results import ResultsStore

H, LAYERS, FFN = 32, 2, 64


def tiny_roberta(tokenizer):
    from transformers import RobertaConfig, RobertaForMaskedLM

    cfg = RobertaConfig(vocab_size=len(tokenizer), hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2,
                        intermediate_size=FFN, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id)
    return seeded(0, lambda: RobertaForMaskedLM(cfg))


def tiny_deberta(tokenizer):
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    cfg = DebertaV2Config(vocab_size=len(tokenizer), hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2,
                          intermediate_size=FFN, max_position_embeddings=128, relative_attention=True,
                          position_buckets=32, pos_att_type=["p2c", "c2p"], pad_token_id=tokenizer.pad_token_id)
    return seeded(0, lambda: DebertaV2ForMaskedLM(cfg))


@pytest.fixture(scope="module")
def checkpoints(tokenizers, tmp_path_factory):
    """Saved tiny pretrained models (2 layers, hidden 32, FFN 64): bert, roberta, deberta-v2, gpt."""
    root = tmp_path_factory.mktemp("pretrained")
    builders = {"bert": lambda t: tiny_bert(t, hidden=H), "roberta": tiny_roberta, "deberta": tiny_deberta,
                "gpt": tiny_gpt2}
    out = {}
    for name, build in builders.items():
        tok = tokenizers["gpt" if name == "gpt" else "bert"]
        path = root / name
        build(tok).save_pretrained(path)
        tok.save_pretrained(path)
        out[name] = path
    return out


def _classifier(path):
    handle = ModelHandle.load(path)
    torch.manual_seed(0)
    return build_classifier(path, handle.family, "sentence", "last" if handle.family == "gpt" else "first",
                            ["neg", "pos"], handle.pad_id)


def _head_size(model) -> int:
    body = {id(p) for p in getattr(model, model.base_model_prefix).parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in body)


# ---------------------------------------------------------------------------------- formulas

# per family: (matrices LoRA adapts as (d_in, d_out), from the config): query and value (Hu et al.);
# GPT-2's are the query and value slices of its fused c_attn (d -> 3d), one update each
LORA_SHAPES = {"bert": [(H, H), (H, H)], "roberta": [(H, H), (H, H)], "deberta": [(H, H), (H, H)],
               "gpt": [(H, H), (H, H)]}
# lora_targets: qkv adds the key matrix; GPT-2: one update of the whole fused c_attn (d -> 3d)
LORA_QKV_SHAPES = {"bert": [(H, H)] * 3, "roberta": [(H, H)] * 3, "deberta": [(H, H)] * 3, "gpt": [(H, 3 * H)]}
# layer norms in the body (Houlsby et al. train them with the adapters), each 2 * H values: BERT-likes
# the embeddings' and two per layer; GPT-2 two per layer and the final ln_f
NORMS = {"bert": 1 + 2 * LAYERS, "roberta": 1 + 2 * LAYERS, "deberta": 1 + 2 * LAYERS, "gpt": 2 * LAYERS + 1}
# BERT's pooler (dense H x H + bias) is in the body; the tiny BERT was saved without one (a masked-LM
# save), so it is random and trains with the head (pooler: auto). RoBERTa's classifier has no pooler,
# DeBERTa's is part of its head, GPT-2 has none.
POOLER = {"bert": H * H + H, "roberta": 0, "deberta": 0, "gpt": 0}


@pytest.mark.parametrize("family", ["bert", "roberta", "deberta", "gpt"])
def test_trainable_counts_equal_the_formulas(checkpoints, family):
    r, m, n = 4, 8, 5
    adapters = LAYERS * 2 * (2 * H * m + m + H)  # one after attention, one after the FFN, per layer
    cases = {  # (method, options) -> (added values, trained values besides the head)
        ("lora", "qv"): (LAYERS * sum(r * (a + b) for a, b in LORA_SHAPES[family]),) * 2,
        ("lora", "qkv"): (LAYERS * sum(r * (a + b) for a, b in LORA_QKV_SHAPES[family]),) * 2,
        ("adapter", "train"): (adapters, adapters + NORMS[family] * 2 * H),
        ("adapter", "frozen"): (adapters, adapters),
        ("prompt", ""): (n * H, n * H),
    }
    for (method, variant), (added, trained) in cases.items():
        opts = MethodOptions(lora_r=r, adapter_size=m, prompt_tokens=n, lora_targets=variant if method == "lora" else "qv",
                             adapter_norms=variant if method == "adapter" else "train")
        model = _classifier(checkpoints[family])
        head = _head_size(model)
        total_before = sum(p.numel() for p in model.parameters())
        record = apply_param_filter(model, attach(model, method, opts))
        assert record["parameters"] == trained + head + POOLER[family], (method, variant)
        assert record["total"] == total_before + added, (method, variant)  # the added modules, nothing else


def test_bitfit_trains_biases_and_the_head_and_head_only_the_head(checkpoints):
    model = _classifier(checkpoints["bert"])
    bitfit = attach(model, "bitfit")
    names = [n for n, p in model.named_parameters() if bitfit.keep(n, p)]
    assert all(n.endswith(".bias") or n.startswith("classifier.") or ".pooler." in n for n in names)
    assert {n for n in names if n.startswith("classifier.")} == {"classifier.weight", "classifier.bias"}
    head = attach(model, "head")
    assert all(n.startswith(("classifier.", "bert.pooler.")) for n, p in model.named_parameters() if head.keep(n, p))


# ---------------------------------------------------------------------------------- training

def _run(checkpoint, out, store, **kw):
    cfg = tiny_finetune_config(checkpoint, out, **{"lr": 3e-3, **kw})
    return cfg, run_finetune(cfg, store=ResultsStore(store))


@pytest.mark.parametrize("method", ["bitfit", "head"])
def test_bitfit_and_head_leave_every_other_tensor_bit_identical(checkpoints, tmp_path, method):
    cfg, res = _run(checkpoints["bert"], tmp_path / "run", tmp_path / "s", method=method)
    best = load_file(str(res.folder / "seed-0" / "best" / "model.safetensors"))
    start = _classifier(checkpoints["bert"]).state_dict()
    moved = {k for k in start if not torch.equal(best[k], start[k])}
    body = {k for k in start if k.startswith("bert.") and ".pooler." not in k}
    if method == "bitfit":
        assert not {k for k in moved if not k.endswith(".bias") and k in body}  # non-bias body: bit-identical
        assert len([k for k in moved if k in body]) >= 10  # the biases moved
    else:
        assert not (moved & body)
    assert {"classifier.weight", "classifier.bias"} <= moved
    manifest = json.loads((res.folder / "seed-0" / "best" / "manifest.json").read_text())
    assert manifest["peft"]["method"] == method and manifest["finetune"]["method"] == method
    rows = res.rows[res.rows["metric"] == "accuracy"]
    seeded = rows[rows["seed"].notna()]
    assert all(e["method"] == method for e in seeded["extra"])
    assert all(e["trainable"] == manifest["trainable"]["parameters"] for e in seeded["extra"])


def test_lora_checkpoint_is_merged_and_gives_the_trained_models_outputs(checkpoints, tmp_path):
    from transformers import AutoModel, AutoModelForSequenceClassification

    from workbench.drivers.finetune import _save_checkpoint

    handle = ModelHandle.load(checkpoints["bert"])
    model = _classifier(checkpoints["bert"])
    apply_param_filter(model, attach(model, "lora", MethodOptions(lora_r=4, lora_alpha=8)))
    with torch.no_grad():  # a trained-looking update: B is zero at the start
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    model.eval()
    ids = handle.tokenize_words([["a", "fine", "film"], ["dull"]])
    batch = {"input_ids": ids.input_ids, "attention_mask": ids.attention_mask}
    with torch.no_grad():
        logits = model(**batch).logits
        states = model.bert(**batch).last_hidden_state
    _save_checkpoint(tmp_path / "ck", model, handle.tokenizer, {"kind": "test"},
                     {"method": "lora", "lora_r": 4, "lora_alpha": 8})
    saved = load_file(str(tmp_path / "ck" / "model.safetensors"))
    assert not [k for k in saved if "lora" in k]  # merged: plain tensor names
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ck").eval()
    body = AutoModel.from_pretrained(tmp_path / "ck").eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(**batch).logits, logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(body(**batch).last_hidden_state, states, atol=1e-5, rtol=1e-5)
        base = handle.model.bert(**batch).last_hidden_state
    assert (states - base).abs().max() > 1e-2  # the update mattered
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert manifest["peft"] == {"method": "lora", "lora_r": 4, "lora_alpha": 8, "merged_layers": 4}


@pytest.mark.parametrize("family", ["bert", "gpt"])
@pytest.mark.parametrize("method", ["adapter", "prompt"])
def test_adapter_and_prompt_checkpoints_run_in_a_probes_forward(checkpoints, tmp_path, family, method):
    """A probe opens the run's best checkpoint with ModelHandle.load: its layers must be the
    fine-tuned model's (adapters in the forward, the prompt after the prefix)."""
    cfg, res = _run(checkpoints[family], tmp_path / "run", tmp_path / "s", method=method, adapter_size=8,
                    prompt_tokens=3, epochs=1)
    best = res.folder / "seed-0" / "best"
    classifier = load_classifier(best)
    probe = ModelHandle.load(best)
    base = ModelHandle.load(checkpoints[family])
    sentences = [["a", "fine", "film", "."], ["dull", "and", "long"]]
    got = list(probe.word_states(sentences))
    # the reference: the classifier's body on the ids the fine-tuning run fed it
    wb = base.tokenize_words(sentences)
    ids, mask = wb.input_ids, wb.attention_mask
    if method == "prompt":
        prompt = json.loads((best / "manifest.json").read_text())["peft"]["prompt_ids"]
        assert len(prompt) == 3 and prompt[0] == base.model.get_input_embeddings().num_embeddings
        at = len(base._prefix)
        ids = torch.cat([ids[:, :at], torch.tensor([prompt] * len(sentences)), ids[:, at:]], 1)
        mask = torch.cat([mask[:, :at], torch.ones(len(sentences), 3, dtype=mask.dtype), mask[:, at:]], 1)
    with torch.no_grad():
        hidden = getattr(classifier, classifier.base_model_prefix)(input_ids=ids, attention_mask=mask,
                                                                    output_hidden_states=True).hidden_states
    shift = len(probe._prefix)
    for s, states in enumerate(got):
        first = wb.word_ids[s].tolist()
        firsts = [first.index(w) - len(base._prefix) + shift for w in range(len(sentences[s]))]
        ref = np.stack([h[s, firsts].numpy() for h in hidden])
        np.testing.assert_allclose(states, ref, atol=1e-4, rtol=1e-4)
        plain = next(iter(base.word_states([sentences[s]])))
        assert np.abs(states[-1] - plain[-1]).max() > 1e-4  # not the starting model's layers


# ------------------------------------------------------------------------------- identity, input

def test_method_is_part_of_the_run_identity():
    def h(**kw):
        return load_finetune_config({"checkpoint": "x", **kw}).training_hash()

    assert h() == h(lora_r=2)  # full fine-tuning reads no method option
    assert len({h(), h(method="bitfit"), h(method="lora"), h(method="lora", lora_r=2), h(method="adapter")}) == 5
    assert h(method="bitfit") == h(method="bitfit", lora_r=2)  # only what the method reads... is recorded
    cfg = load_finetune_config({"checkpoint": "x", "method": "lora"})
    assert cfg.method == "lora"


def test_full_hash_is_unchanged_by_the_method_fields():
    """The hash of a config without a method is the one before methods existed (resumable runs)."""
    import hashlib

    from workbench.drivers.finetune import FinetuneConfig, METHOD_OPTIONS

    d = FinetuneConfig(checkpoint="x").to_dict()
    for k in ("seeds", "name", "output_dir", "progress", "threads", "baselines", "save_every", "device",
              "method", *METHOD_OPTIONS):
        d.pop(k)
    assert load_finetune_config({"checkpoint": "x"}).training_hash() == \
        hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("override,match", [
    ({"method": "dora"}, r"method: unknown method 'dora' \(known: full, head, bitfit, adapter, prompt, lora\)"),
    ({"method": "lora", "lora_r": 0}, r"lora_r: must be an integer >= 1, got 0"),
    ({"method": "adapter", "adapter_size": -3}, r"adapter_size: must be an integer >= 1"),
    ({"method": "prompt", "prompt_tokens": 126}, r"prompt_tokens: 126 prompt tokens leave fewer than 4"),
    ({"method": "bitfit", "freeze_body": True}, r"freeze_body: trains the head only"),
])
def test_bad_method_settings_are_config_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        load_finetune_config({"checkpoint": "x", **override})


@pytest.mark.parametrize("argv,match", [
    (["--method", "dora"], "method: unknown method 'dora'"),
    (["--method", "lora", "--lora-r", "0"], "lora_r: must be an integer >= 1, got 0"),
    (["--method", "lora", "--lora-r", "two"], "--lora-r: expected an integer, got 'two'"),
])
def test_cli_bad_method_is_one_line_and_exit_2_before_any_work(argv, match, capsys, tmp_path, monkeypatch):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    code = main(["finetune", "--checkpoint", "sentence-transformers/all-MiniLM-L6-v2", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and match in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing written


def test_methods_list_is_the_issues():
    assert METHODS == ("full", "head", "bitfit", "adapter", "prompt", "lora")


# ------------------------------------------------------------------------------------ the sweep

@pytest.fixture(scope="module")
def sweep(checkpoints, tmp_path_factory):
    """`bertology peft`'s sweep over head, full and LoRA (two seeds) on the tiny BERT: (store, run id, rows)."""
    from workbench.drivers.peft_sweep import load_sweep_config, run_sweep

    root = tmp_path_factory.mktemp("sweep")
    ft = {"checkpoint": str(checkpoints["bert"]), "seeds": [0, 1], "epochs": 1, "max_train_examples": 64,
          "max_eval_examples": 32, "batch_size": 16, "baselines": False, "progress": False, "name": "sweep"}
    cfg = load_sweep_config({"finetune": ft, "methods": ["head", "full", "lora"], "cka_sentences": 40,
                             "lr": {"full": 1e-2, "head": 1e-2, "lora": 1e-2}})
    store = ResultsStore(root / "store")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTOLOGY_RUNS", str(root / "runs"))
        run_id, rows = run_sweep(cfg, store=store, progress=False)
    return store, run_id, rows


@pytest.mark.slow
def test_sweep_rows_cka_is_one_where_nothing_changed(sweep):
    """Head-only leaves every layer as it was: CKA exactly 1 at every layer; full fine-tuning at a
    high rate moves the top layer; the embeddings (layer 0) of LoRA, which adapts attention only,
    stay identical. CKA itself is checked against a hand computation."""
    from workbench.geometry import linear_cka
    from workbench.drivers.peft_sweep import cka_to_start

    store, run_id, rows = sweep
    rows = rows.copy()
    rows["method"] = [e["method"] for e in rows["extra"]]
    cka = rows[rows["metric"] == "cka_to_start"]
    assert sorted(cka["layer"].unique()) == [0, 1, 2]
    head = cka[cka["method"] == "head"]["value"].to_numpy()
    np.testing.assert_allclose(head, 1.0, atol=1e-6)
    full = cka[(cka["method"] == "full") & (cka["seed"] == 0)].set_index("layer")["value"]
    assert full.loc[2] < 0.999
    lora = cka[(cka["method"] == "lora") & (cka["seed"] == 0)].set_index("layer")["value"]
    assert lora.loc[0] == pytest.approx(1.0, abs=1e-6) and lora.loc[2] < 1 - 1e-6  # exactly 1 where nothing changed
    counts = rows[(rows["metric"] == "trainable_parameters") & (rows["seed"] == 0)].set_index("method")["value"]
    assert counts["head"] < counts["lora"] < counts["full"]
    assert counts["lora"] - counts["head"] == LAYERS * 2 * 8 * (H + H)  # default r = 8 on query and value
    # the CKA is the hand formula on centred matrices
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 50, 6)), rng.normal(size=(2, 50, 4))
    ac, bc = a[1] - a[1].mean(0), b[1] - b[1].mean(0)
    hand = np.linalg.norm(bc.T @ ac) ** 2 / (np.linalg.norm(ac.T @ ac) * np.linalg.norm(bc.T @ bc))
    assert cka_to_start(a, b)[1] == pytest.approx(hand) == pytest.approx(linear_cka(a[1], b[1]))
    assert len(store.read(run_id)) == len(rows)


@pytest.mark.slow
def test_peft_figures_draw_the_seed_means_of_the_store(sweep):
    from app.figures import load_spec, query_rows
    from app.page_modules.peft import PLOTS, method_table

    store, run_id, rows = sweep
    rows = rows.assign(method=[e["method"] for e in rows["extra"]])
    for name, plot in (("peft_accuracy_vs_parameters", "peft_accuracy_vs_parameters"),
                       ("peft_cka_to_start", "peft_cka_to_start")):
        spec = load_spec(name)[1]
        assert spec["plot"] == plot and spec["query"]["probe"] == "peft"
        got, runs = query_rows(store, spec["query"])
        assert runs == [run_id]
        drawn = PLOTS[plot](got, spec["title"], spec.get("options") or {})
        data = drawn.data
        if plot == "peft_cka_to_start":
            want = rows[rows["metric"] == "cka_to_start"].groupby(["method", "layer"])["value"].mean()
            for (method, layer), v in want.items():
                row = data[(data["model"].str.endswith("/ " + method)) & (data["layer"] == layer)]
                assert row["value"].iloc[0] == pytest.approx(v, abs=1e-9)
        else:
            test = rows[(rows["metric"] == "accuracy") & (rows["split"] == "test")]
            for method, g in test.groupby("method"):
                row = data[data["model"].str.endswith("/ " + method) & (data["metric"] == "accuracy")]
                assert row["value"].iloc[0] == pytest.approx(g["value"].mean())
                assert row["ci_low"].iloc[0] == pytest.approx(g["value"].min())
                n = data[data["model"].str.endswith("/ " + method) & (data["metric"] == "trainable_parameters")]
                assert n["value"].iloc[0] == g["extra"].iloc[0]["trainable"]
    table = method_table(store.read(run_id))
    assert list(table["method"]) == ["full", "head", "lora"] and set(table["seeds"]) == {2}
    assert table.set_index("method")["share_of_model"]["full"] == pytest.approx(1.0)


def test_sweep_config_refuses_bad_methods_before_any_work(checkpoints):
    from workbench.drivers.peft_sweep import load_sweep_config

    ft = {"checkpoint": str(checkpoints["bert"])}
    with pytest.raises(ConfigError, match="methods: unknown method 'dora'"):
        load_sweep_config({"finetune": ft, "methods": ["full", "dora"]})
    with pytest.raises(ConfigError, match=r"finetune \(full\): lora_r: must be an integer >= 1"):
        load_sweep_config({"finetune": {**ft, "lora_r": 0}, "methods": ["full", "lora"]})
    with pytest.raises(ConfigError, match="methods: unknown method .lorra."):
        load_sweep_config({"finetune": ft}, methods=["lorra"])
    with pytest.raises(ConfigError, match="lr: prompt: must be a number > 0"):
        load_sweep_config({"finetune": ft, "lr": {"prompt": -1}})


@pytest.mark.slow
def test_peft_page_shows_the_stored_values(sweep, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from workbench.paths import REPO_ROOT

    store, run_id, rows = sweep
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    at = AppTest.from_file(str(REPO_ROOT / "app" / "streamlit_app.py"), default_timeout=180)
    at.query_params["page"] = "peft"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    table = at.container("peft-table").dataframe[0].value
    test = rows[(rows["metric"] == "accuracy") & (rows["split"] == "test")]
    for method in ("full", "head", "lora"):
        want = [v for v, e in zip(test["value"], test["extra"]) if e["method"] == method]
        assert table.set_index("method")["accuracy"][method] == pytest.approx(np.mean(want))
    cka = at.container("peft-cka-table").dataframe[0].value
    assert list(cka.columns) == ["layer", "full", "head", "lora"]
    np.testing.assert_allclose(cka["head"], 1.0, atol=1e-6)


def test_peft_page_on_an_empty_store_says_what_to_run(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from workbench.paths import REPO_ROOT

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    at = AppTest.from_file(str(REPO_ROOT / "app" / "streamlit_app.py"), default_timeout=180)
    at.query_params["page"] = "peft"
    at.run()
    assert not at.exception and not at.error
    assert "bertology peft experiments/peft/" in at.info[0].value


def test_prompt_ids_follow_embedding_rows_that_no_token_names(checkpoints, tmp_path):
    """A model whose embedding has more rows than its tokenizer has tokens: the saved prompt tokens
    still get the ids of their rows (the gap is named), and the probe reads the prompted model."""
    from workbench.drivers.finetune import _save_checkpoint

    handle = ModelHandle.load(checkpoints["bert"])
    model = _classifier(checkpoints["bert"])
    model.resize_token_embeddings(len(handle.tokenizer) + 5)
    apply_param_filter(model, attach(model, "prompt", MethodOptions(prompt_tokens=2)))
    _save_checkpoint(tmp_path / "ck", model, handle.tokenizer, {"kind": "test"}, {"method": "prompt", "prompt_tokens": 2})
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    V = len(handle.tokenizer) + 5
    assert manifest["peft"]["prompt_ids"] == [V, V + 1]
    probe = ModelHandle.load(tmp_path / "ck")
    assert probe._prefix[-2:] == [V, V + 1] and len(probe.tokenizer) == V + 2


@pytest.mark.parametrize("method", ["lora", "adapter"])
def test_an_interrupted_method_run_resumes_to_identical_weights(checkpoints, tmp_path, method):
    """The added modules are in the resume state: an interrupted LoRA / adapter run ends with the
    same saved checkpoint (merged LoRA weights, adapter file) as an uninterrupted one."""
    kw = {"epochs": 2, "save_every": 3, "max_train_examples": 80, "method": method, "lora_r": 2, "adapter_size": 4}
    store = ResultsStore(tmp_path / "store")
    full = run_finetune(tiny_finetune_config(checkpoints["bert"], tmp_path / "full", **kw), store=store)

    def interrupt(step):
        if step == 7:  # mid-epoch 2 (5 steps per epoch); the last saved state is step 6
            raise KeyboardInterrupt

    cfg = tiny_finetune_config(checkpoints["bert"], tmp_path / "cut", **kw)
    with pytest.raises(KeyboardInterrupt):
        run_finetune(cfg, store=store, on_step=interrupt)
    resumed = run_finetune(cfg, store=store)
    files = ["model.safetensors"] + (["adapters.safetensors"] if method == "adapter" else [])
    for name in files:
        a = load_file(tmp_path / "full" / "seed-0" / "best" / name)
        b = load_file(tmp_path / "cut" / "seed-0" / "best" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.seeds[0].curve == full.seeds[0].curve
