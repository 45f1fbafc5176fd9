"""Shared fixtures: real EWT text, small tokenizers trained on it, tiny random models.

The tokenizers are trained once per test session on the running text of EWT train with the
workbench's own trainer (`workbench.tokenization.build_tokenizer`, HF `tokenizers` underneath):
WordPiece for BERT, byte-level BPE for GPT-2 and BART, Unigram with T5's sentinel tokens.
The model builders make 2-layer models of hidden size 32, seeded, so any test can run them in
milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from tests.seeding import seeded
from workbench.paths import data_path

# Tiny models run far faster on one thread, above all when several test runs share the 2 cores
# (two OpenMP threads each spin against each other: 25x slower measured under load).
torch.set_num_threads(1)

EWT_TRAIN = ("ud", "en_ewt", "en_ewt-ud-train.conllu")
T5_SENTINELS = [f"<extra_id_{i}>" for i in range(10)]
TOKENIZER_SPECS = {
    "bert": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]),
    "gpt": ("bytelevel_bpe", ["<|endoftext|>"]),
    "bart": ("bytelevel_bpe", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]),
    "t5": ("unigram", ["<pad>", "</s>", "<unk>"] + T5_SENTINELS),
}


@dataclass
class EwtSentence:
    text: str  # the `# text =` line (running text)
    words: list[str]  # syntactic words (integer ids): "don't" -> "do", "n't"


def read_ewt_minimal(path) -> list[EwtSentence]:
    """`# text` lines and word forms of a CoNLL-U file (a minimal reader for fixtures only;
    `workbench.data.conllu` is the validating reader)."""
    out, text, words = [], None, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("# text = "):
                text = line[len("# text = "):]
            elif not line:
                if words:
                    out.append(EwtSentence(text, words))
                text, words = None, []
            elif not line.startswith("#"):
                cols = line.split("\t")
                if cols[0].isdigit():
                    words.append(cols[1])
    if words:
        out.append(EwtSentence(text, words))
    return out


@pytest.fixture
def one_thread():
    """One torch and BLAS thread for the test (shared 2-core machines: no spin-waiting under
    oversubscription; fits whose numbers are compared run the same reductions every time)."""
    from threadpoolctl import threadpool_limits

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def ewt_train() -> list[EwtSentence]:
    return read_ewt_minimal(data_path(*EWT_TRAIN))


@pytest.fixture(scope="session")
def tokenizers(ewt_train) -> dict:
    """{"bert", "gpt", "bart", "t5"} -> PreTrainedTokenizerFast trained on EWT train text."""
    from workbench.tokenization import build_tokenizer

    texts = [s.text for s in ewt_train]
    # Unigram's EM training is the slow one (seconds per thousand sentences): its first 3,000.
    return {name: build_tokenizer(kind, special, texts[:3000] if kind == "unigram" else texts, vocab_size=1000)
            for name, (kind, special) in TOKENIZER_SPECS.items()}


def tiny_bert(tokenizer, seed: int = 0, max_positions: int = 128, hidden: int = 32, layers: int = 2):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=max_positions,
                     pad_token_id=tokenizer.pad_token_id)
    return seeded(seed, lambda: BertForMaskedLM(cfg))


def tiny_gpt2(tokenizer, seed: int = 0, max_positions: int = 128, hidden: int = 32, layers: int = 2):
    from transformers import GPT2Config, GPT2LMHeadModel

    eos = tokenizer.eos_token_id
    cfg = GPT2Config(vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=2, n_positions=max_positions,
                     bos_token_id=eos, eos_token_id=eos)
    return seeded(seed, lambda: GPT2LMHeadModel(cfg))


def tiny_t5(tokenizer, seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=len(tokenizer), d_model=hidden, d_kv=hidden // 2, d_ff=2 * hidden, num_layers=layers,
                   num_decoder_layers=layers, num_heads=2, pad_token_id=tokenizer.pad_token_id,
                   eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    return seeded(seed, lambda: T5ForConditionalGeneration(cfg))


def tiny_bart(tokenizer, seed: int = 0, max_positions: int = 128, hidden: int = 32, layers: int = 2):
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=len(tokenizer), d_model=hidden, encoder_layers=layers, decoder_layers=layers,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=2 * hidden,
                     decoder_ffn_dim=2 * hidden, max_position_embeddings=max_positions,
                     pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.eos_token_id,
                     forced_eos_token_id=None)
    return seeded(seed, lambda: BartForConditionalGeneration(cfg))


TINY_BUILDERS = {"bert": tiny_bert, "gpt": tiny_gpt2, "t5": tiny_t5, "bart": tiny_bart}


@pytest.fixture(scope="session")
def tiny_models(tokenizers) -> dict:
    """{"bert", "gpt", "t5", "bart"} -> (model, tokenizer), random weights, seed 0."""
    return {name: (build(tokenizers[name]), tokenizers[name]) for name, build in TINY_BUILDERS.items()}


@pytest.fixture(scope="session")
def probe_store(tmp_path_factory, tokenizers):
    """A results store holding real result rows: the syntax probes (UPOS with scalar mix, deprel,
    structural distance) on every saved step (0, 10) of a tiny BERT training folder, with twins,
    plus a one-checkpoint run. For the app and figure tests."""
    import json

    from probes.syntax import run_syntax_probes
    from workbench.store.results import ResultsStore

    root = tmp_path_factory.mktemp("probe-store")
    train = root / "train" / "tinyrun" / "seed-0"
    for step in (0, 10):
        folder = train / f"step-{step:07d}"
        tiny_bert(tokenizers["bert"], seed=step, hidden=32, layers=2).save_pretrained(folder)
        tokenizers["bert"].save_pretrained(folder)
        (folder / "manifest.json").write_text(json.dumps({"family": "bert", "step": step, "seed": 0}))
    store = ResultsStore(root / "runs")
    kw = dict(max_train_sentences=80, max_eval_sentences=40, n_boot=30, structural={"epochs": 2},
              mdl_tasks=(), scalar_mix_tasks=("upos",), cache_dir=root / "cache", progress=False)
    run_syntax_probes([train], ["upos", "deprel", "structural-distance"], store=store, name="over-steps", **kw)
    run_syntax_probes([train / "step-0000010"], ["upos", "structural-distance"], store=store, name="last-step", **kw)
    return store


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tokenizers):
    """A saved 2-layer BERT (hidden 32) folder named `tiny-bert` with a manifest (family bert, step 7, seed 3)."""
    import json

    folder = tmp_path_factory.mktemp("ckpt") / "tiny-bert"
    tok = tokenizers["bert"]
    tiny_bert(tok, seed=0, max_positions=128, hidden=32, layers=2).save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps({"family": "bert", "step": 7, "seed": 3}))
    return folder


@pytest.fixture(scope="session")
def tiny_electra(tokenizers, tmp_path_factory):
    """A tiny ELECTRA (generator + discriminator, random weights, seed 0) saved as the training loop
    saves it: (folder, the pretrainer module, tokenizer)."""
    from workbench.families import get_family

    tok = tokenizers["bert"]
    family = get_family("electra")
    torch.manual_seed(0)
    pretrainer = family.build_model(family.model_config("tiny"), tok).eval()
    folder = tmp_path_factory.mktemp("electra") / "ckpt"
    pretrainer.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, pretrainer, tok


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real single-node Slurm cluster for the session (tests/slurm_cluster.py), its commands pointed
    at it through SLURM_CONF (which submitted jobs inherit). Fails, naming the install, without Slurm."""
    import shutil
    import tempfile
    from pathlib import Path

    from tests import slurm_cluster as slurm

    folder = Path(tempfile.mkdtemp(prefix="slurm-"))  # short: a unix socket path is at most 107 bytes
    cluster = slurm.start(folder)
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        slurm.stop(cluster)
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        shutil.rmtree(folder, ignore_errors=True)
