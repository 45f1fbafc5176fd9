"""The PEFT methods against their papers' procedure (issue 40, audit deviation 4).

- Houlsby et al. 2019 (google-research/adapter-bert): the adapter takes the sublayer's output after
  its projection and its dropout, before the residual sum and layer norm (a hand-built computation
  with the same dropout mask gives the adapted module's output exactly; at init the adapted model
  is the pretrained one); adapters, every layer norm of the body and the head train
  (`adapter_norms: frozen` keeps the layer norms frozen);
- Hu et al. 2022: LoRA adapts W_q and W_v; on GPT-2's fused c_attn (and DeBERTa v1's per-head
  in_proj) only the query and value outputs move after a training step, the key outputs stay
  bit-identical; `lora_targets: qkv` keeps the whole-projection update;
- BERT's pooler: frozen when pretrained (NSP), trained with the head when the checkpoint's pooler
  is not pretrained (`objective.nsp: false` in its manifest, or no pooler in its weights);
- every new option is part of the run's identity, and a bad value is one line and exit 2 before work.

Tiny random models (2 layers, hidden 32).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.conftest import tiny_bert, tiny_gpt2
from tests.seeding import seeded
from tests.training_helpers import tiny_finetune_config
from workbench.errors import ConfigError
from workbench.drivers.finetune import load_finetune_config, run_finetune
from workbench.running.classifier_loading import build_classifier, load_classifier
from workbench.loop import apply_param_filter
from workbench.running.peft_methods import (
    ADAPTER_TARGETS,
    ADAPTER_TARGETS_BEFORE_DROPOUT,
    Adapted,
    FusedQVLoRA,
    MethodOptions,
    add_adapters,
    add_lora,
    adapter_sites,
    attach,
    checkpoint_pooler_pretrained,
    merge_lora,
)
from workbench.store.results import ResultsStore

H, LAYERS = 32, 2


@pytest.fixture(scope="module")
def folders(tokenizers, tmp_path_factory):
    """Saved tiny checkpoints: a BERT saved as a masked LM (no pooler in its weights), a BERT saved
    with NSP's pooler (BertForPreTraining), the same with a manifest recording nsp: false, a GPT-2."""
    from transformers import BertConfig, BertForPreTraining

    root = tmp_path_factory.mktemp("peft-details")
    tok = tokenizers["bert"]
    out = {}
    tiny_bert(tok, hidden=H).save_pretrained(root / "bert_mlm")
    cfg = BertConfig(vocab_size=len(tok), hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2,
                     intermediate_size=2 * H, pad_token_id=tok.pad_token_id)
    pretraining = seeded(0, lambda: BertForPreTraining(cfg))
    for name in ("bert_nsp", "bert_no_nsp"):
        pretraining.save_pretrained(root / name)
    (root / "bert_no_nsp" / "manifest.json").write_text(json.dumps({"objective": {"objective": "mlm+nsp", "nsp": False}}))
    tiny_gpt2(tokenizers["gpt"], hidden=H).save_pretrained(root / "gpt")
    for name in ("bert_mlm", "bert_nsp", "bert_no_nsp"):
        tok.save_pretrained(root / name)
        out[name] = root / name
    tokenizers["gpt"].save_pretrained(root / "gpt")
    out["gpt"] = root / "gpt"
    out["pads"] = {"bert": tok.pad_token_id, "gpt": tokenizers["gpt"].eos_token_id}
    return out


def _classifier(folders, name):
    family = "gpt" if name == "gpt" else "bert"
    torch.manual_seed(0)
    return build_classifier(folders[name], family, "sentence", "last" if family == "gpt" else "first",
                            ["neg", "pos"], folders["pads"][family])


def _trainable(model, param_filter) -> set[str]:
    apply_param_filter(model, param_filter)
    return {n for n, p in model.named_parameters() if p.requires_grad}


def _randomise_adapters(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".adapter." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


# ------------------------------------------------------------------------------ adapters: what trains

def test_adapters_train_every_layer_norm_of_the_body_and_frozen_keeps_them(folders):
    for name, norms in (("bert_nsp", {"bert.embeddings.LayerNorm"} |
                         {f"bert.encoder.layer.{i}.{s}.LayerNorm" for i in range(LAYERS)
                          for s in ("attention.output", "output")}),
                        ("gpt", {f"transformer.h.{i}.{ln}" for i in range(LAYERS) for ln in ("ln_1", "ln_2")}
                         | {"transformer.ln_f"})):
        norm_names = {f"{m}.{w}" for m in norms for w in ("weight", "bias")}
        model = _classifier(folders, name)
        got = _trainable(model, attach(model, "adapter", MethodOptions(adapter_size=4)))
        adapters = {n for n in got if ".adapter." in n}
        head = {"classifier.weight", "classifier.bias"} if name != "gpt" else {"score.weight"}
        assert len(adapters) == LAYERS * 2 * 4  # down/up weight and bias, 2 sites a layer
        assert got == adapters | norm_names | head, sorted(got ^ (adapters | norm_names | head))[:6]
        model = _classifier(folders, name)
        frozen = _trainable(model, attach(model, "adapter", MethodOptions(adapter_size=4, adapter_norms="frozen")))
        assert frozen == adapters | head


# -------------------------------------------------------------------------- adapters: where they sit

def test_bert_adapter_follows_the_sublayers_dropout_as_in_adapter_bert(folders):
    """adapter-bert's transformer_model: dense -> dropout -> adapter -> layer_norm(x + input). The
    adapted BertSelfOutput / BertOutput in training mode equal that computation by hand, drawing
    the same dropout mask (same seed, one dropout call of the same shape)."""
    model = _classifier(folders, "bert_nsp")
    attach(model, "adapter", MethodOptions(adapter_size=4))
    _randomise_adapters(model)
    model.train()
    layer = model.bert.encoder.layer[0]
    g = torch.Generator().manual_seed(0)
    for sub, width in ((layer.attention.output, H), (layer.output, 2 * H)):
        assert isinstance(sub.dropout, Adapted) and isinstance(sub.dropout.base, torch.nn.Dropout)
        x, residual = torch.randn(3, 5, width, generator=g), torch.randn(3, 5, H, generator=g)
        ad = sub.dropout.adapter
        with torch.no_grad():
            torch.manual_seed(7)
            got = sub(x, residual)
            torch.manual_seed(7)
            h = F.dropout(sub.dense(x), p=sub.dropout.base.p, training=True)
            h = h + ad.up(F.gelu(ad.down(h)))
            want = sub.LayerNorm(h + residual)
            torch.manual_seed(7)  # the placement before: adapter on the projection, dropout after it
            d = sub.dense(x)
            before = sub.LayerNorm(F.dropout(d + ad.up(F.gelu(ad.down(d))), p=sub.dropout.base.p, training=True)
                                   + residual)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        assert (got - before).abs().max() > 1e-3  # the two placements differ in training


def test_gpt2_adapter_follows_the_residual_dropout(folders):
    model = _classifier(folders, "gpt")
    attach(model, "adapter", MethodOptions(adapter_size=4))
    _randomise_adapters(model)
    model.train()
    block = model.transformer.h[1]
    assert isinstance(block.attn.resid_dropout, Adapted) and isinstance(block.mlp.dropout, Adapted)
    mlp = block.mlp
    x = torch.randn(2, 4, H, generator=torch.Generator().manual_seed(3))
    ad = mlp.dropout.adapter
    with torch.no_grad():
        torch.manual_seed(11)
        got = mlp(x)
        torch.manual_seed(11)
        h = F.dropout(mlp.c_proj(mlp.act(mlp.c_fc(x))), p=mlp.dropout.base.p, training=True)
        want = h + ad.up(F.gelu(ad.down(h)))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def _tiny_config(model_type: str):
    from transformers import AutoConfig

    bert_like = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=2 * H,
                     vocab_size=100, max_position_embeddings=64)
    special = {
        "gpt2": dict(n_embd=H, n_layer=LAYERS, n_head=2, vocab_size=100, n_positions=64),
        "t5": dict(d_model=H, d_kv=16, d_ff=2 * H, num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=2,
                   vocab_size=100),
        "bart": dict(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=2 * H, decoder_ffn_dim=2 * H, vocab_size=100,
                     max_position_embeddings=64),
        "llama": dict(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=LAYERS, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=100),
        "distilbert": dict(dim=H, n_layers=LAYERS, n_heads=2, hidden_dim=2 * H, vocab_size=100,
                           max_position_embeddings=64),
        "albert": dict(bert_like, embedding_size=16),
        "electra": dict(bert_like, embedding_size=H),
    }
    return AutoConfig.for_model(model_type, **special.get(model_type, bert_like))


# sites per block that are the projection, not a dropout module: the family applies no dropout
# module there (ALBERT after its feed-forward block, DistilBERT after attention; Llama none; BART a
# functional dropout)
PROJECTION_SITES = {"albert": 1, "distilbert": 1, "llama": 2, "bart": 2}


@pytest.mark.parametrize("model_type", sorted(ADAPTER_TARGETS))
def test_every_model_type_gets_two_adapters_a_layer_in_its_forward(model_type):
    """Per block: one adapter after the attention output and one after the feed-forward output (T5
    and BART: encoder and decoder blocks; ALBERT: its one shared layer), each on the dropout module
    where the family has one; the adapted body is the pretrained one at init, and each adapter is in
    the forward (moving one moves the output: an unused dropout module would not)."""
    from transformers import AutoModel

    config = _tiny_config(model_type)
    body = seeded(0, lambda: AutoModel.from_config(config))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    kwargs = {"input_ids": ids, **({"decoder_input_ids": ids} if config.is_encoder_decoder else {})}
    with torch.no_grad():
        base = body(**kwargs).last_hidden_state
    sites = add_adapters(body, model_type, 4)
    blocks = 1 if model_type == "albert" else LAYERS * (2 if config.is_encoder_decoder else 1)
    assert len(sites) == 2 * blocks, sites
    bases = [type(body.get_submodule(s).base).__name__ for s in sites]
    assert bases.count("Dropout") == len(sites) - PROJECTION_SITES.get(model_type, 0) * blocks, bases
    body.eval()
    with torch.no_grad():
        torch.testing.assert_close(body(**kwargs).last_hidden_state, base, atol=0, rtol=0)
        for s in sites:
            up = body.get_submodule(s).adapter.up
            up.bias.copy_(torch.linspace(-1, 1, up.bias.numel()))  # not constant: a layer norm removes a constant
            moved = (body(**kwargs).last_hidden_state - base).abs().max()
            up.bias.zero_()
            assert moved > 1e-4, f"{model_type}: the adapter at {s} is not in the forward"


# ------------------------------------------------------------------------------------------- LoRA

def test_gpt2_lora_moves_query_and_value_and_leaves_the_key_after_a_step(folders):
    """Hu et al.: W_q and W_v. After one optimizer step on the classifier's loss, c_attn's key outputs
    are the pretrained ones bit for bit, its query and value outputs have moved; the merged
    checkpoint weight gives the same outputs."""
    model = _classifier(folders, "gpt")
    start = copy.deepcopy(model.transformer.h[0].attn.c_attn)
    apply_param_filter(model, attach(model, "lora", MethodOptions(lora_r=4, lora_alpha=8)))
    c_attn = model.transformer.h[0].attn.c_attn
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(2):  # B is zero at first: the first step moves B, the second A too
        ids = torch.randint(5, 200, (4, 7), generator=torch.Generator().manual_seed(0))
        loss = model(input_ids=ids, labels=torch.tensor([0, 1, 0, 1])).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, ref = c_attn(x).split(H, dim=-1), start(x).split(H, dim=-1)
    assert torch.equal(got[1], ref[1])  # the key
    assert (got[0] - ref[0]).abs().max() > 1e-4 and (got[2] - ref[2]).abs().max() > 1e-4
    assert isinstance(c_attn, FusedQVLoRA)
    with torch.no_grad():
        lora_out = c_attn(x)
        merged = copy.deepcopy(c_attn).merged()
        torch.testing.assert_close(merged(x), lora_out, atol=1e-5, rtol=1e-5)
        whole = copy.deepcopy(model)
        assert merge_lora(whole) == LAYERS
        assert not [n for n, _ in whole.named_parameters() if "lora" in n]


def test_deberta_v1_lora_follows_its_per_head_layout():
    """DeBERTa v1's in_proj interleaves [q_h | k_h | v_h] per head (transpose_for_scores, chunk 3):
    the updates land on the query and value chunks of every head, never on a key chunk."""
    from transformers import AutoModel

    config = _tiny_config("deberta")
    body = seeded(0, lambda: AutoModel.from_config(config)).eval()
    proj = body.encoder.layer[0].attention.self.in_proj
    start = copy.deepcopy(proj)
    add_lora(body, "deberta", 4, 8.0, "qv")
    proj = body.encoder.layer[0].attention.self.in_proj
    with torch.no_grad():
        for k in ("q", "v"):
            proj.lora_B[k].weight.normal_(0, 0.5)
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(2))
    heads = config.num_attention_heads
    with torch.no_grad():
        got = proj(x).view(2, 5, heads, -1).chunk(3, dim=-1)
        ref = start(x).view(2, 5, heads, -1).chunk(3, dim=-1)
        body(input_ids=torch.tensor([[5, 6, 7]]))  # the model runs with it
    assert torch.equal(got[1], ref[1])
    for i in (0, 2):
        assert (got[i] - ref[i]).abs().amax(dim=(0, 1, 3)).min() > 1e-4  # every head's query and value moved


def test_bert_lora_default_adapts_query_and_value_and_qkv_the_key_too(folders):
    for variant, want in (("qv", {"query", "value"}), ("qkv", {"query", "key", "value"})):
        model = _classifier(folders, "bert_nsp")
        got = _trainable(model, attach(model, "lora", MethodOptions(lora_r=2, lora_targets=variant)))
        adapted = {n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n in got if ".lora_A." in n}
        assert adapted == want


# ------------------------------------------------------------------------------------------ pooler

def test_the_checkpoint_says_whether_its_pooler_was_pretrained(folders):
    got = {name: checkpoint_pooler_pretrained(_classifier(folders, name)) for name in ("bert_mlm", "bert_nsp", "bert_no_nsp")}
    assert got["bert_nsp"][0] is True
    assert got["bert_mlm"] == (False, "the checkpoint's weights hold no pooler")
    assert got["bert_no_nsp"][0] is False and "nsp: false" in got["bert_no_nsp"][1]


@pytest.mark.parametrize("method", ["head", "bitfit", "adapter", "prompt", "lora"])
def test_a_random_pooler_trains_with_the_head_and_a_pretrained_one_stays_frozen(folders, method):
    pooler = {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    for name, option, trains in (("bert_no_nsp", "auto", True), ("bert_mlm", "auto", True),
                                 ("bert_nsp", "auto", False), ("bert_no_nsp", "frozen", False),
                                 ("bert_nsp", "train", True)):
        model = _classifier(folders, name)
        param_filter = attach(model, method, MethodOptions(lora_r=2, adapter_size=4, prompt_tokens=2, pooler=option))
        got = _trainable(model, param_filter)
        if method == "bitfit" and not trains:
            assert got & pooler == {"bert.pooler.dense.bias"}, (name, option)  # a bias like every other
        else:
            assert (pooler <= got) == trains, (name, option)
        assert param_filter.name.endswith("+pooler") == trains, param_filter.name


def test_head_only_fine_tuning_of_a_bert_without_nsp_trains_its_pooler(folders, tmp_path):
    """End to end: the saved head-only checkpoint of the NSP-less BERT has a moved pooler and an
    untouched encoder; with pooler: frozen the pooler is the checkpoint's, bit for bit."""
    start = load_file(str(folders["bert_no_nsp"] / "model.safetensors"))
    for option, moves in (("auto", True), ("frozen", False)):
        chosen = {} if option == "auto" else {"pooler": option}  # auto: the default
        cfg = tiny_finetune_config(folders["bert_no_nsp"], tmp_path / option, method="head", lr=1e-2, **chosen)
        res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"))
        best = load_file(str(res.folder / "seed-0" / "best" / "model.safetensors"))
        assert torch.equal(best["bert.encoder.layer.1.output.dense.weight"],
                           start["bert.encoder.layer.1.output.dense.weight"])
        moved = not torch.equal(best["bert.pooler.dense.weight"], start["bert.pooler.dense.weight"])
        assert moved == moves, option
        manifest = json.loads((res.folder / "seed-0" / "best" / "manifest.json").read_text())
        assert manifest["peft"]["pooler"] == option
        assert manifest["trainable"]["filter"] == ("head_only+pooler" if moves else "head_only")


# ------------------------------------------------------------------- old adapter checkpoints reopen

def test_an_adapter_checkpoint_saved_before_the_move_reopens_with_its_adapters_after_the_projection(folders, tmp_path):
    from workbench.drivers.finetune import _save_checkpoint

    model = _classifier(folders, "bert_nsp")
    body = model.bert
    old_sites = adapter_sites(body, "bert", ADAPTER_TARGETS_BEFORE_DROPOUT)
    assert all(s.endswith(".dense") for s in old_sites) and len(old_sites) == 2 * LAYERS
    add_adapters(body, "bert", 4, sites=old_sites)
    _randomise_adapters(model)
    model.eval()
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
    tok = __import__("transformers").AutoTokenizer.from_pretrained(folders["bert_nsp"])
    _save_checkpoint(tmp_path / "ck", model, tok, {"kind": "test"}, {"method": "adapter", "adapter_size": 4})
    saved = load_file(str(tmp_path / "ck" / "adapters.safetensors"))
    assert all(".output.dense.adapter." in k for k in saved)
    reopened = load_classifier(tmp_path / "ck")
    with torch.no_grad():
        torch.testing.assert_close(reopened(input_ids=ids).logits, want, atol=1e-6, rtol=1e-6)
    assert isinstance(reopened.bert.encoder.layer[0].attention.output.dense, Adapted)


# ------------------------------------------------------------------------------- identity, input

def test_the_new_options_are_part_of_the_run_identity_of_the_methods_that_read_them():
    def h(**kw):
        return load_finetune_config({"checkpoint": "x", **kw}).training_hash()

    assert h() == h(pooler="train", lora_targets="qkv", adapter_norms="frozen")  # full reads none
    assert h(method="lora") != h(method="lora", lora_targets="qkv")
    assert h(method="adapter") != h(method="adapter", adapter_norms="frozen")
    assert h(method="head") != h(method="head", pooler="frozen")
    assert h(method="bitfit") == h(method="bitfit", lora_targets="qkv", adapter_norms="frozen")
    cfg = load_finetune_config({"checkpoint": "x", "method": "lora"})
    assert (cfg.lora_targets, cfg.adapter_norms, cfg.pooler) == ("qv", "train", "auto")


@pytest.mark.parametrize("override,match", [
    ({"method": "lora", "lora_targets": "qk"}, r"lora_targets: must be one of qv, qkv, got 'qk'"),
    ({"method": "adapter", "adapter_norms": "yes"}, r"adapter_norms: must be one of train, frozen, got 'yes'"),
    ({"method": "head", "pooler": "random"}, r"pooler: must be one of auto, train, frozen, got 'random'"),
])
def test_bad_variants_are_config_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        load_finetune_config({"checkpoint": "x", **override})


@pytest.mark.parametrize("argv,match", [
    (["--method", "lora", "--lora-targets", "k"], "lora_targets: must be one of qv, qkv, got 'k'"),
    (["--method", "adapter", "--adapter-norms", "off"], "adapter_norms: must be one of train, frozen, got 'off'"),
    (["--method", "head", "--pooler", "new"], "pooler: must be one of auto, train, frozen, got 'new'"),
])
def test_cli_bad_variant_is_one_line_and_exit_2_before_any_work(argv, match, capsys, tmp_path, monkeypatch):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    code = main(["finetune", "--checkpoint", "sentence-transformers/all-MiniLM-L6-v2", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and match in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_the_evidence_configs_differ_only_in_the_options_they_compare():
    """experiments/peft/{bert_tiny_nonsp,gpt_tiny}_{paper,before}.yaml (docs/evidence/peft.md): the same recipe,
    the defaults against the options that keep the behaviour before."""
    from workbench.drivers.peft_sweep import load_sweep_config, method_config
    from workbench.paths import REPO_ROOT

    for model, changed in (("bert_tiny_nonsp", {"pooler": "frozen", "adapter_norms": "frozen"}),
                           ("gpt_tiny", {"lora_targets": "qkv", "adapter_norms": "frozen"})):
        paper, before = (load_sweep_config(REPO_ROOT / "experiments" / "peft" / f"{model}_{v}.yaml")
                         for v in ("paper", "before"))
        assert set(before.methods) < set(paper.methods) and "full" not in before.methods
        for method in before.methods:
            a, b = (method_config(c, method).to_dict() for c in (paper, before))
            diff = {k for k in a if a[k] != b[k]}
            assert diff <= {"name", *changed} and all(b[k] == v for k, v in changed.items()), (method, diff)
