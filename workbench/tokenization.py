"""Train a family's tokenizer on the corpus' TRAIN split and wrap it for transformers.

Four kinds, after the families that made them famous (all trained with HF `tokenizers`):
- "wordpiece": BERT-style WordPiece with `##` continuations (Devlin et al. 2019; Wu et al. 2016);
  cased (no lower-casing or accent stripping, so the Spanish corpora keep their accents). Trained
  reproducibly: `tokenizers`' own WordPieceTrainer breaks count ties in hash-map order, so two
  trainings on the same text differ (huggingface/tokenizers#1794); see `_train_wordpiece`;
- "bytelevel_bpe": GPT-2/RoBERTa byte-level BPE (Radford et al. 2019), every word with a leading
  space marker (add_prefix_space, so `is_split_into_words=True` sees words as in running text);
- "unigram": SentencePiece-style Unigram LM with the `▁` word marker (Kudo 2018; Kudo & Richardson
  2018), as ALBERT and T5 use. Trained reproducibly: `tokenizers`' UnigramTrainer picks the
  pieces, and their scores are re-estimated by a deterministic EM (`_rescore_unigram`), because
  the trainer's own scores (and so its ids) differ between two trainings on the same text;
- "word": a word-level vocabulary (the most frequent words, the rest `unk`) for ELMo's inputs.

The result is a `PreTrainedTokenizerFast` with the family's special tokens in their roles and a
post-processor that adds them like the real family does (`[CLS] a [SEP]`, `<s> a </s>`, `a </s>`).
Trained tokenizers are cached under `<cache_root>/tokenizers/<key>/`, keyed by (kind, vocab size,
special tokens, roles, template, corpus manifest hash), so every run on the same corpus reuses them.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Iterable, Iterator, Protocol

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from workbench.errors import ConfigError
from workbench.io import atomic_dir, sha256_file
from workbench.paths import cache_root



class TokenizerRecipe(Protocol):
    """What `train_tokenizer` needs to know about a tokenizer; a family's `FamilySpec` is one.

    A protocol, so that tokenisation does not depend on the families (no import circle
    families -> data_cache -> tokenization -> families)."""

    name: str
    tokenizer_kind: str
    special_tokens: list[str]
    special_roles: dict[str, str] | None
    template: tuple[str, str | None] | None

TOKENIZER_FORMAT_VERSION = 2  # 2: reproducible WordPiece training
ROLES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")

# Common spellings of special tokens -> their roles, used when a family gives no `special_roles`.
_DEFAULT_ROLES: dict[str, tuple[str, ...]] = {
    "[PAD]": ("pad",), "<pad>": ("pad",), "[UNK]": ("unk",), "<unk>": ("unk",), "<UNK>": ("unk",),
    "[CLS]": ("cls",), "[SEP]": ("sep",), "[MASK]": ("mask",), "<mask>": ("mask",),
    "<s>": ("bos", "cls"), "</s>": ("eos", "sep"), "<S>": ("bos",), "</S>": ("eos",),
    "<|endoftext|>": ("bos", "eos"),
}


def resolve_roles(special_tokens: list[str], special_roles: dict[str, str] | None = None) -> dict[str, str]:
    """role -> token string: the family's explicit `special_roles` on top of the common spellings."""
    roles: dict[str, str] = {}
    for tok in special_tokens:
        for role in _DEFAULT_ROLES.get(tok, ()):
            roles.setdefault(role, tok)
    for role, tok in (special_roles or {}).items():
        if role not in ROLES:
            raise ValueError(f"unknown special-token role {role!r} (known: {ROLES})")
        if tok not in special_tokens:
            raise ValueError(f"special_roles[{role!r}] = {tok!r} is not among the special tokens {special_tokens}")
        roles[role] = tok
    return roles


def infer_template(roles: dict[str, str]) -> tuple[str, str] | None:
    """The post-processor templates of the classic families, from the roles present.

    [CLS]/[SEP] -> BERT ("[CLS] A [SEP]", pair with segment ids 1); <s>/</s> -> RoBERTa/BART
    ("<s> A </s>", pair "<s> A </s></s> B </s>"); only an eos -> T5 ("A </s>"). None = add nothing
    (GPT-2 style; a family can also say so with template=("$A", "$A $B:1")); distinct bos and
    eos without cls -> "<S> A </S>" (ELMo's sentence boundary tokens).
    """
    cls, sep, eos = roles.get("cls"), roles.get("sep"), roles.get("eos")
    if cls and sep and cls == "[CLS]":
        return f"{cls} $A {sep}", f"{cls} $A {sep} $B:1 {sep}:1"
    if cls and sep:
        return f"{cls} $A {sep}", f"{cls} $A {sep} {sep} $B {sep}"
    bos = roles.get("bos")
    if bos and eos and bos != eos and not cls:
        return f"{bos} $A {eos}", f"{bos} $A {eos} {bos}:1 $B:1 {eos}:1"
    if eos and not cls and not bos:
        return f"$A {eos}", f"$A {eos} $B:1 {eos}:1"
    return None


def _backend(kind: str, special_tokens: list[str], roles: dict[str, str], vocab_size: int, show_progress: bool):
    """(untrained Tokenizer, trainer) for one kind."""
    unk = roles.get("unk")
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk or "[UNK]", continuing_subword_prefix="##"))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = None  # see _train_wordpiece
    elif kind == "bytelevel_bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=show_progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=special_tokens, unk_token=unk,
                                          show_progress=show_progress)
    elif kind == "word":
        if unk is None:
            raise ValueError("a word-level tokenizer needs an unk token among the special tokens")
        tok = Tokenizer(models.WordLevel(unk_token=unk))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
        tok.decoder = decoders.WordPiece(prefix="\0", cleanup=False)  # joins words with spaces
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=show_progress)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    return tok, trainer


# While training, continuation characters ("##c") are spelled as characters of Unicode's
# supplementary private use area A, which BertNormalizer(clean_text=True) removes from the text.
_CONTINUATION_BASE = 0xF0000
_CONTINUATION_END = 0xFFFFD


def _train_wordpiece(tok: Tokenizer, texts: Iterable[str], special_tokens: list[str], unk: str, vocab_size: int,
                     show_progress: bool) -> models.WordPiece:
    """A WordPiece vocabulary learned the way `tokenizers`' WordPieceTrainer learns it, reproducibly.

    That trainer is BPE over words whose non-initial characters carry the `##` prefix, and it gives
    the `##c` symbols ids in hash-map order; those ids break ties between merges of equal count, so
    two trainings on the same text disagree at the cut-off (huggingface/tokenizers#1794). Here every
    non-initial character is spelled as its own private-use character instead, so the BPE trainer
    sees a plain alphabet, which it sorts, and its tie-breaking is fixed; the learned pieces are
    spelled back with `##`. The alphabet holds every character seen (as WordPieceTrainer's does).
    """
    table: dict[str, str] = {}

    def continuation(c: str) -> str:
        mark = table.get(c)
        if mark is None:
            if _CONTINUATION_BASE + len(table) > _CONTINUATION_END:
                raise ValueError("more distinct characters than the private use area holds")
            mark = table[c] = chr(_CONTINUATION_BASE + len(table))
        return mark

    alphabet: set[str] = set()
    marked: list[str] = []
    for text in texts:
        words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))]
        for w in words:
            alphabet.update(w)
        marked.append(" ".join(w[0] + "".join(continuation(c) for c in w[1:]) for w in words))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=show_progress,
                                  initial_alphabet=sorted(alphabet))
    bpe.train_from_iterator(marked, trainer)
    plain = {mark: c for c, mark in table.items()}
    vocab: dict[str, int] = {}
    for piece, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1]):
        if piece in special_tokens:
            spelled = piece
        elif piece[0] in plain:
            spelled = "##" + "".join(plain[c] for c in piece)
        else:
            spelled = piece[0] + "".join(plain.get(c, c) for c in piece[1:])
        vocab.setdefault(spelled, len(vocab))
    return models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##")


def _rescore_unigram(tok: Tokenizer, texts: list[str], special_tokens: list[str], iterations: int = 5) -> models.Unigram:
    """The trained Unigram vocabulary with scores re-estimated deterministically, ids in a canonical order.

    `tokenizers`' UnigramTrainer sums its EM statistics in hash-map order (Rust's randomly seeded
    HashMap; single-threaded too), so two trainings on the same text give scores that differ in the
    last digits (up to ~1e-4 after its pruning rounds) and, since ids follow the score order,
    different ids. Here the trainer only chooses the pieces; their log-probabilities come from
    `iterations` rounds of EM (Kudo 2018: forward-backward over each word's segmentation lattice,
    expected piece counts, normalised) started from uniform scores and summed over the words in
    sorted order, which depends on nothing but the pieces and the text. Ids: the special tokens
    first, then the pieces by descending score, ties broken by the piece string. Same pieces ->
    identical tokenizer files. A piece no word uses gets the count 1e-3.
    """
    trained = json.loads(tok.to_str())["model"]
    pieces = [p for p, _ in trained["vocab"] if p not in special_tokens]
    index = {p: i for i, p in enumerate(pieces)}
    longest = max(len(p) for p in pieces)
    counts: dict[str, int] = {}
    for text in texts:
        for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
            counts[w] = counts.get(w, 0) + 1
    # each word's lattice once: edges (start, end, piece) by end position; words a piece set cannot
    # cover (characters outside it) are left out, as they tokenise to unk anyway
    lattices = []
    for w in sorted(counts):
        edges = [[(j, index[w[j:i]]) for j in range(max(0, i - longest), i) if w[j:i] in index] for i in range(1, len(w) + 1)]
        if all(edges):
            lattices.append((counts[w], edges))
    logp = [-math.log(len(pieces))] * len(pieces)
    for _ in range(iterations):
        expected = [0.0] * len(pieces)
        for count, edges in lattices:
            n = len(edges)
            alpha = [0.0] + [-math.inf] * n
            for i in range(1, n + 1):
                alpha[i] = _logsumexp([alpha[j] + logp[k] for j, k in edges[i - 1]])
            beta = [-math.inf] * n + [0.0]
            for i in range(n, 0, -1):
                for j, k in edges[i - 1]:
                    beta[j] = _logsumexp([beta[j], beta[i] + logp[k]])
            z = alpha[n]
            for i in range(1, n + 1):
                for j, k in edges[i - 1]:
                    expected[k] += count * math.exp(alpha[j] + logp[k] + beta[i] - z)
        expected = [max(c, 1e-3) for c in expected]
        log_total = math.log(math.fsum(expected))
        logp = [math.log(c) - log_total for c in expected]
    order = sorted(range(len(pieces)), key=lambda k: (-logp[k], pieces[k]))
    vocab = [(t, 0.0) for t in special_tokens] + [(pieces[k], logp[k]) for k in order]
    unk = trained["vocab"][trained["unk_id"]][0] if trained.get("unk_id") is not None else None
    unk_id = next((i for i, (t, _) in enumerate(vocab) if t == unk), None)
    return models.Unigram(vocab, unk_id=unk_id, byte_fallback=False)


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


def build_tokenizer(
    kind: str,
    special_tokens: list[str],
    texts: Iterable[str],
    vocab_size: int,
    special_roles: dict[str, str] | None = None,
    template: tuple[str, str | None] | None = None,
    show_progress: bool = False,
    length: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train a tokenizer of `kind` on `texts` (one sentence or line each) and wrap it (no caching)."""
    roles = resolve_roles(special_tokens, special_roles)
    tok, trainer = _backend(kind, special_tokens, roles, vocab_size, show_progress)
    if kind == "wordpiece":
        tok.model = _train_wordpiece(tok, texts, special_tokens, roles.get("unk") or "[UNK]", vocab_size, show_progress)
    elif kind == "unigram":
        texts = list(texts)
        tok.train_from_iterator(texts, trainer, length=length)
        tok.model = _rescore_unigram(tok, texts, special_tokens)
    else:
        tok.train_from_iterator(texts, trainer, length=length)
    template = template if template is not None else infer_template(roles)
    if template is not None:
        single, pair = template
        used = {p.split(":")[0] for t in (single, pair or "") for p in t.split() if not p.startswith("$")}
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(t, tok.token_to_id(t)) for t in sorted(used)]
        )
    kwargs = {f"{role}_token": t for role, t in roles.items()}
    extra = [t for t in special_tokens if t not in roles.values()]
    if extra:
        kwargs["extra_special_tokens"] = extra
    if template is not None and ":1" in (template[1] or ""):
        kwargs["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=1_000_000, **kwargs)
    if kind == "bytelevel_bpe":
        wrapped.add_prefix_space = True
        wrapped.init_kwargs["add_prefix_space"] = True
    return wrapped


def corpus_sentences(corpus, split: str = "train") -> Iterator[str]:
    """Every non-empty line of every document of `split`: the unit tokenizers are trained on."""
    for doc in corpus.documents(split):
        for line in doc.text.split("\n"):
            if line.strip():
                yield line


def tokenizer_cache_key(family: TokenizerRecipe, vocab_size: int, corpus_manifest_sha256: str) -> str:
    spec = {
        "format": TOKENIZER_FORMAT_VERSION,
        "kind": family.tokenizer_kind,
        "vocab_size": int(vocab_size),
        "special_tokens": list(family.special_tokens),
        "roles": resolve_roles(family.special_tokens, family.special_roles),
        "template": list(family.template) if family.template else None,
        "corpus": corpus_manifest_sha256,
    }
    if family.tokenizer_kind == "unigram":
        spec["scores"] = "em-rescored"  # reproducible Unigram scores (`_rescore_unigram`)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


def train_tokenizer(
    family: TokenizerRecipe, corpus, vocab_size: int, cache_dir: str | Path | None = None, show_progress: bool = True
) -> PreTrainedTokenizerFast:
    """The family's tokenizer trained on `corpus`'s train split (a `CorpusSplit`), cached on disk.

    Only the train split is read, so held-out documents stay unseen (membership ground truth).
    """
    manifest_sha = sha256_file(Path(corpus.dir) / "manifest.json")
    key = tokenizer_cache_key(family, vocab_size, manifest_sha)
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "tokenizers"
    path = folder / f"{family.tokenizer_kind}-{vocab_size}-{key}"
    if (path / "tokenizer.json").exists():
        return load_tokenizer(path)
    tok = build_tokenizer(
        family.tokenizer_kind, list(family.special_tokens), corpus_sentences(corpus, "train"), vocab_size,
        special_roles=family.special_roles, template=family.template, show_progress=show_progress,
    )
    with atomic_dir(path) as tmp:
        tok.save_pretrained(tmp)
        (tmp / "workbench_tokenizer.json").write_text(json.dumps(
            {"family": family.name, "kind": family.tokenizer_kind, "vocab_size": vocab_size,
             "corpus_manifest_sha256": manifest_sha, "key": key}, indent=2))
    return load_tokenizer(path)


def reuse_tokenizer(family: TokenizerRecipe, path: str | Path, vocab_size: int) -> PreTrainedTokenizerFast:
    """A trained tokenizer from a checkpoint or tokenizer folder (config `tokenizer.path`), checked to
    carry the family's special tokens and `vocab_size` entries (ConfigError naming the folder if not)."""
    folder = Path(path)
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"tokenizer.path: {folder} has no tokenizer.json (give a checkpoint or tokenizer folder)")
    tok = load_tokenizer(folder)
    missing = [t for t in family.special_tokens if t not in tok.get_vocab()]
    if missing:
        raise ConfigError(f"tokenizer.path: {folder} lacks the {family.name} special tokens {missing}")
    if len(tok) != vocab_size:
        raise ConfigError(f"tokenizer.path: {folder} has {len(tok)} entries but tokenizer.vocab_size is "
                          f"{vocab_size}; set vocab_size to {len(tok)}")
    return tok


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A saved tokenizer folder, loaded the way users will (`AutoTokenizer.from_pretrained`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
