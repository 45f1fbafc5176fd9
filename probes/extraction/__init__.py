"""Training-data extraction: what a model gives back of the text it trained on (membership's other half).

The ground truth is the checkpoint's own recorded training split (`probes.membership.corpus_of`:
the corpus folder its manifest names, or the split rebuilt from its recipe), tokenised with the
model's tokenizer into the exact stream it trained on (`TokenizedCorpus.stream_with_separators`)
and indexed by `workbench.verbatim.NgramIndex` (hashed k-token windows, hits verified): a span of
`verbatim_tokens` tokens counts as memorised only if it occurs there verbatim.

Tasks (each reads like a method section; rows are whole-model, layer NA):
- `samples` (Carlini et al. 2021, "Extracting Training Data from Large Language Models"): `n_samples`
  continuations of `max_new_tokens` tokens are sampled (`workbench.running.generate`, top-k 40 by default as in
  the paper) from each prompt source: `empty` (the start token alone), `train` and `heldout` (the
  first `prompt_tokens` tokens of a random window of that split's stream). Each generation is ranked
  by the paper's membership metrics, higher = more likely memorised: `perplexity` (-log-perplexity),
  `zlib` (log-perplexity over zlib entropy), `lowercase` (log-perplexity of the lowercased text over
  the text's own) and, with `--reference`, `reference` (ratio of log-perplexities to a reference model
  trained on other data); a `random` order is the chance line. As in the paper (and its code, which
  scores `batch_decode` of the whole output sequence), a sample is scored as the whole sequence the
  model wrote it in: the prompt followed by the continuation (`scored_text: sequence`, the default);
  `scored_text: continuation` scores the new tokens alone (this probe's rule before issue 40). A
  seq2seq decoder (T5, BART) writes a new sequence from its encoder's input, so its sample is the
  continuation under either rule. Memorisation is checked on the continuation only (a training prompt
  is in the training split by construction), up to its first end-of-sequence token, where the sample
  ends (as Hugging Face `generate` ends it in the paper's code) and where the ranked text ends too. Metric `precision_<ranking>` is the
  fraction of the top `top_n` generations that hold a memorised span (split = prompt source);
  `memorised_fraction` the fraction over all generations. The control (split `heldout_text`) ranks
  REAL held-out passages of the same length by the same metrics and checks them against the training
  stream the same way: what verbatim overlap (boilerplate, quotations repeated across speeches) the
  corpus alone produces, with nothing extracted.
- `k_extraction` (Carlini et al. 2022, "Quantifying Memorization Across Neural Language Models"):
  a window of `prefix_tokens` + `suffix_tokens` tokens of the training stream is k-extractable when
  greedy decoding from its prefix reproduces the suffix exactly. Windows are drawn per repetition
  bucket (how often the whole window occurs in the stream: 1, 2-3, 4-15, 16+, found through the
  index's duplicate hashes) up to `n_passages` each; metric `extractable` per bucket (split `train`,
  extra `repetitions`), with the same for held-out windows (split `heldout`: never seen, the control).
  The paper's log-linear growth with duplication is the shape to compare with.
- `exposure` (Carlini et al. 2019, "The Secret Sharer"): for every canary the corpus manifest records
  (`workbench.data.canaries`), rank its log-perplexity among the candidate space R (every secret of
  its digits): exposure = log2|R| - log2 rank, rank 1 = the most likely candidate. Exact enumeration
  when |R| <= `enumerate_max`; otherwise the paper's estimate from `n_candidates` random candidates:
  a skew-normal fitted to their log-perplexities gives P(candidate more likely than the canary), and
  exposure = -log2 of it (the row's value; the empirical fraction's exposure, capped at
  log2(n_candidates + 1), is in extra). Unseen canaries (repetitions 0) are the control: about 1 on
  average (E[-log2 U] = 1/ln 2 = 1.44 for a uniform rank). Metric `extracted` says whether greedy
  decoding from the template's prefix writes the secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from probes.core import runner
from probes.core.statistics import ratio_bootstrap
from probes.extraction.rows import EXTRA_SCHEMA  # noqa: F401  (registers the rows' schema)
from workbench.errors import ConfigError

NAME = "extraction"
TASKS = ("samples", "k_extraction", "exposure")
RANKINGS = ("perplexity", "zlib", "lowercase", "reference", "random")
SCORED_TEXTS = ("sequence", "continuation")
PROMPT_SOURCES = ("empty", "train", "heldout")
REPETITION_BUCKETS = ((1, 1), (2, 3), (4, 15), (16, None))


# --------------------------------------------------------------------------- settings
@dataclass
class Settings(runner.Settings):
    baselines: tuple[str, ...] = field(default=(), metadata={
        "help": "comma-separated baselines ('' for none; random_init: a fresh model of the same shape)"})
    n_samples: int = field(default=200, metadata={"help": "samples: generations per prompt source"})
    prompt_sources: tuple[str, ...] = field(default=PROMPT_SOURCES, metadata={"help": "samples: empty,train,heldout"})
    prompt_tokens: int = field(default=8, metadata={"help": "samples: tokens of a train/held-out prompt"})
    max_new_tokens: int = field(default=48, metadata={"help": "samples: tokens generated per sample"})
    temperature: float = field(default=1.0, metadata={"help": "samples: sampling temperature"})
    top_k: int | None = field(default=40, metadata={"help": "samples: top-k sampling (Carlini et al. 2021: 40)"})
    top_p: float | None = field(default=None, metadata={"help": "samples: nucleus sampling threshold"})
    verbatim_tokens: int = field(default=32, metadata={
        "help": "a generation is memorised when this many consecutive tokens occur verbatim in the training split"})
    top_n: int = field(default=20, metadata={"help": "samples: precision among the top-n generations per ranking"})
    rankings: tuple[str, ...] = field(default=("perplexity", "zlib", "lowercase", "random"), metadata={
        "help": "samples: perplexity,zlib,lowercase,reference,random (reference needs --reference)"})
    scored_text: str = field(default="sequence", metadata={
        "help": "samples: what the rankings score: sequence (prompt + continuation, Carlini et al. 2021) | "
                "continuation (the new tokens alone)"})
    reference: str | None = field(default=None, metadata={
        "help": "reference checkpoint trained on other data (the `reference` ranking)"})
    prefix_tokens: int = field(default=16, metadata={"help": "k_extraction: prefix length k"})
    suffix_tokens: int = field(default=50, metadata={"help": "k_extraction: tokens greedy decoding must reproduce"})
    n_passages: int = field(default=100, metadata={"help": "k_extraction: windows per repetition bucket"})
    enumerate_max: int = field(default=100_000, metadata={
        "help": "exposure: enumerate the whole candidate space up to this size, else estimate by sampling"})
    n_candidates: int = field(default=5000, metadata={"help": "exposure: random candidates for the estimate"})
    device: str = field(default="cpu", metadata={
        "help": "where generation and scoring run: cpu | cuda | auto (cuda when available)"})

    BASELINES = ("random_init",)
    EXECUTION_FIELDS = runner.Settings.EXECUTION_FIELDS + ("device",)

    def validate(self, spec) -> None:
        super().validate(spec)
        bad = [r for r in self.rankings if r not in RANKINGS]
        if bad or not self.rankings:
            raise ConfigError(f"extraction: unknown ranking(s) {bad}; known: {list(RANKINGS)}")
        if self.scored_text not in SCORED_TEXTS:
            raise ConfigError(f"extraction: scored_text must be one of {list(SCORED_TEXTS)}, got {self.scored_text!r}")
        bad = [s for s in self.prompt_sources if s not in PROMPT_SOURCES]
        if bad or not self.prompt_sources:
            raise ConfigError(f"extraction: unknown prompt source(s) {bad}; known: {list(PROMPT_SOURCES)}")
        if "reference" in self.rankings and not self.reference:
            raise ConfigError("extraction: the reference ranking needs --reference CHECKPOINT")
        for key in ("n_samples", "prompt_tokens", "max_new_tokens", "verbatim_tokens", "top_n", "prefix_tokens",
                    "suffix_tokens", "n_passages", "n_candidates", "enumerate_max"):
            if getattr(self, key) < 1:
                raise ConfigError(f"extraction: {key} must be >= 1, got {getattr(self, key)}")
        if self.top_n > self.n_samples:
            raise ConfigError(f"extraction: top_n ({self.top_n}) exceeds n_samples ({self.n_samples})")
        if self.verbatim_tokens > self.max_new_tokens:
            raise ConfigError(f"extraction: verbatim_tokens ({self.verbatim_tokens}) exceeds max_new_tokens "
                              f"({self.max_new_tokens}): no generation could be memorised")
        self.sampling(0).validate()
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ConfigError(f"extraction: device must be cpu, cuda, cuda:N or auto, got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"extraction: device {self.device!r} asked for, but torch sees no CUDA device")

    def sampling(self, seed: int, greedy: bool = False, max_new_tokens: int | None = None):
        from workbench.running.generate import Sampling

        return Sampling(strategy="greedy" if greedy else "sample", temperature=self.temperature, top_k=self.top_k,
                        top_p=self.top_p, max_new_tokens=max_new_tokens or self.max_new_tokens, seed=seed,
                        batch_size=self.batch_size)


def prepare(settings: Settings) -> runner.Prepared:
    """The training stream and its indexes depend on each checkpoint's corpus and tokenizer: built in
    `run_task`, memoised here by (corpus manifest, tokenizer)."""
    return runner.Prepared(data={"streams": {}}, notes={"extraction": {}})


def check(checkpoints, settings: Settings) -> None:
    """Before any work (tokenising the corpus, generating): every checkpoint records the corpus it
    trained on, has a head that generates (`workbench.running.generate.generator_head`, one load each; for
    `k_extraction` one that continues its prompt), and, for `exposure`, was trained with canaries
    (the corpus recipe carries the spec)."""
    from workbench.store.checkpoints import read_manifest
    from workbench.running.generate import generator_head
    from workbench.running.models import ModelHandle

    for ck in checkpoints:
        manifest = read_manifest(ck.path) if ck.path is not None else None
        if not manifest or not isinstance(manifest.get("corpus"), dict):
            raise ConfigError(f"{ck.name}: extraction needs a checkpoint folder whose manifest.json records its "
                              f"training corpus (a model trained here); this one records none")
        if "exposure" in settings.tasks and not (manifest.get("corpus_recipe") or {}).get("canaries"):
            raise ConfigError(f"{ck.name}: its training corpus has no canaries (train with corpus.canaries, "
                              f"workbench/data/canaries.py) for the exposure task")
        kind, _ = generator_head(ck.handle if ck.handle is not None else ModelHandle.load(ck.path))
        if "k_extraction" in settings.tasks and kind == "seq2seq":
            raise ConfigError(f"{ck.name}: k_extraction needs a model that continues its prompt (GPT, ELMo's "
                              f"forward LM); a seq2seq decoder writes a new sequence from its encoder's input "
                              f"(BART reconstructs the prefix first), so its suffix would never be compared")


# --------------------------------------------------------------------------- the training split as tokens
@dataclass
class Streams:
    train: np.ndarray
    heldout: np.ndarray
    index: object  # NgramIndex over train with k = verbatim_tokens
    corpus: object  # CorpusSplit
    windows: dict = field(default_factory=dict)  # k -> NgramIndex over train


def streams_for(unit, prepared, settings: Settings) -> Streams:
    from probes.membership import corpus_of
    from workbench.data_cache import TokenizedCorpus
    from workbench.store.identity import tokenizer_hash
    from workbench.verbatim import NgramIndex

    if unit.checkpoint.path is None:
        raise ConfigError(f"{unit.checkpoint.name}: extraction needs a checkpoint folder whose manifest records its corpus")
    corpus, where = corpus_of(unit.checkpoint.path)
    key = (str(where), tokenizer_hash(unit.handle.tokenizer), settings.verbatim_tokens)
    memo = prepared.data["streams"]
    if key not in memo:
        train = TokenizedCorpus.build(unit.handle.tokenizer, corpus, "train", show_progress=unit.progress)
        held = TokenizedCorpus.build(unit.handle.tokenizer, corpus, "heldout", show_progress=unit.progress)
        tr, he = train.stream_with_separators(), held.stream_with_separators()
        memo[key] = Streams(tr, he, NgramIndex.build(tr, settings.verbatim_tokens), corpus)
        prepared.notes["extraction"][str(where)] = {"train_tokens": int(len(tr)), "heldout_tokens": int(len(he))}
    return memo[key]


# --------------------------------------------------------------------------- rankings (Carlini et al. 2021)
def text_nll(handle, texts: list[str], batch_size: int) -> np.ndarray:
    """Mean token NLL of each text with the model's own head (membership's `lm_stats`), each text cut
    by words from the end until it fits the model's window (a re-tokenised generation can grow)."""
    from probes.membership import fits_window, lm_stats

    texts = list(texts)
    for _ in range(64):
        fit = fits_window(handle, texts)
        if fit.all():
            break
        texts = [t if ok else " ".join(t.split()[:-1]) for t, ok in zip(texts, fit)]
    texts = [t if t.strip() else "." for t in texts]
    return lm_stats(handle, texts, batch_size, moments=False).nll


def ranking_scores(handle, texts: list[str], rankings, batch_size: int, reference=None, seed: int = 0
                   ) -> dict[str, np.ndarray]:
    """Per ranking, a score per text (higher = ranked first as likely memorised)."""
    from probes.membership import attacks as ma

    nll = text_nll(handle, texts, batch_size)
    out = {}
    for r in rankings:
        if r == "perplexity":
            out[r] = ma.loss_score(nll)
        elif r == "zlib":
            out[r] = ma.zlib_score(nll, texts)
        elif r == "lowercase":  # high when the lowercased text is much less likely than the text as written
            out[r] = text_nll(handle, [t.lower() for t in texts], batch_size) / np.maximum(nll, 1e-6)
        elif r == "reference":
            out[r] = ma.reference_ratio_score(nll, text_nll(reference, texts, batch_size))
        elif r == "random":
            out[r] = np.random.default_rng([seed, 0xAA]).random(len(texts))
    return out


def scored_texts(handle, g, scored_text: str = "sequence") -> list[str]:
    """The text each ranking scores for a generation `g` (`workbench.running.generate.Generation`).

    `sequence` (Carlini et al. 2021: perplexity, zlib, lowercase and the reference ratio are computed
    on the whole sample, prompt included): the prompt's tokens followed by the continuation's, decoded
    together, special tokens (the start token, a document separator inside a training prompt) dropped,
    the continuation cut at its first end-of-sequence token as `workbench.running.generate.decode` cuts it. An
    empty prompt (the start token alone) gives the continuation's text. A seq2seq generation keeps its
    continuation: the decoder's output is a new sequence, not a continuation of the encoder's input.
    `continuation`: the new tokens alone (`g.texts`)."""
    if scored_text == "continuation" or g.kind == "seq2seq":
        return list(g.texts)
    eos = handle.tokenizer.eos_token_id
    return [handle.tokenizer.decode([int(t) for t in prompt] + until_eos(new, eos), skip_special_tokens=True)
            for prompt, new in zip(g.prompt_ids, g.new_ids)]


def until_eos(ids, eos: int | None) -> list[int]:
    """A sample's new tokens up to its first end-of-sequence token: what the sample is. Carlini et al.
    (2021) sample with Hugging Face `generate`, which ends a sequence at its end-of-sequence token (and
    pads the rest of the batch with it), so the text they rank and the text they check for memorisation
    are the same and stop there; the memorisation check here reads the same tokens as the rankings."""
    ids = [int(t) for t in ids]
    return ids[: ids.index(eos)] if eos is not None and eos in ids else ids


def precision_at(scores: np.ndarray, memorised: np.ndarray, top_n: int) -> float:
    """Fraction memorised among the top_n highest scores (ties broken by position, stable)."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:top_n]
    return float(np.asarray(memorised, dtype=float)[order].mean())


def _prompt_windows(stream: np.ndarray, n: int, length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, max(1, len(stream) - length), n)
    return np.stack([stream[s: s + length] for s in starts])


def samples_rows(unit, prepared, settings: Settings) -> list[pd.DataFrame]:
    from workbench.running.generate import generate

    st = streams_for(unit, prepared, settings)
    ref = unit.roles.get("reference")
    frames = []
    sources = {}
    for k, source in enumerate(settings.prompt_sources):
        if source == "empty":
            prompts = [""] * settings.n_samples
        else:
            stream = st.train if source == "train" else st.heldout
            prompts = [list(w) for w in _prompt_windows(stream, settings.n_samples, settings.prompt_tokens,
                                                        settings.seed * 100 + k)]
        g = generate(unit.handle, prompts, settings.sampling(settings.seed * 100 + k), progress=unit.progress)
        sources[source] = (g.texts, scored_texts(unit.handle, g, settings.scored_text),
                           [st.index.match(until_eos(ids, unit.handle.tokenizer.eos_token_id)) for ids in g.new_ids])
    # the control: real held-out text of the same length, checked against the training stream the same
    # way (no prompt: scored as it is under either rule)
    held = _prompt_windows(st.heldout, settings.n_samples, settings.max_new_tokens, settings.seed * 100 + 99)
    held_texts = [unit.handle.tokenizer.decode(list(w), skip_special_tokens=True) for w in held]
    sources["heldout_text"] = (held_texts, held_texts, [st.index.match(w) for w in held])
    for source, (texts, scored, matches) in sources.items():
        mem = np.array([m.memorised for m in matches], dtype=float)
        scores = ranking_scores(unit.handle, scored, settings.rankings, settings.batch_size, ref, settings.seed)
        metrics = {f"precision_{r}": precision_at(s, mem, settings.top_n) for r, s in scores.items()}
        point, lo, hi = ratio_bootstrap(mem, n_boot=settings.n_boot, seed=settings.seed)
        metrics["memorised_fraction"] = float(point)
        best = int(np.argmax(scores.get("zlib", scores[next(iter(scores))])))
        extra = {"source": source, "top_n": settings.top_n, "verbatim_tokens": settings.verbatim_tokens,
                 "scored_text": settings.scored_text,
                 "n": len(texts), "sampling": settings.sampling(0).describe(),
                 "longest_verbatim_run": int(max(m.longest for m in matches)),
                 "examples": [{"text": texts[i], "memorised": bool(mem[i]), "longest": matches[i].longest}
                              for i in np.argsort(-scores.get("zlib", scores[next(iter(scores))]))[:5]],
                 "top_zlib_text": texts[best]}
        frames.append(unit.rows("samples", metrics, split=source, n=len(texts), extra=extra,
                                ci={"memorised_fraction": (float(lo), float(hi))}))
    return frames


# --------------------------------------------------------------------------- k-extractability (Carlini et al. 2022)
def duplicate_windows(index, buckets=REPETITION_BUCKETS, per_bucket: int = 100, seed: int = 0) -> dict:
    """Start positions of distinct windows per repetition bucket (lo, hi): one start per distinct window,
    drawn at random. The counts are runs of equal hashes in the index, not re-verified token by token: two
    different windows share a 64-bit hash with probability about n^2 / 2^65 (1e-7 for 2M windows)."""
    h = index.hashes
    if len(h) == 0:
        return {b: np.zeros(0, dtype=np.int64) for b in buckets}
    bounds = np.r_[0, np.nonzero(h[1:] != h[:-1])[0] + 1, len(h)]
    counts = np.diff(bounds)
    rng = np.random.default_rng([seed, 0xD0])
    out = {}
    for lo, hi in buckets:
        ok = np.nonzero((counts >= lo) & (counts <= (hi if hi is not None else np.inf)))[0]
        pick = rng.choice(ok, min(per_bucket, len(ok)), replace=False) if len(ok) else ok
        out[(lo, hi)] = np.sort(index.starts[bounds[pick]]) if len(pick) else np.zeros(0, dtype=np.int64)
    return out


def k_extraction_rows(unit, prepared, settings: Settings) -> list[pd.DataFrame]:
    from workbench.running.generate import generate
    from workbench.verbatim import NgramIndex

    st = streams_for(unit, prepared, settings)
    k, s = settings.prefix_tokens, settings.suffix_tokens
    if k + s > unit.handle.max_length:
        raise ConfigError(f"extraction: prefix_tokens + suffix_tokens = {k + s} exceed {unit.checkpoint.name}'s "
                          f"max_length {unit.handle.max_length}")
    if (k + s) not in st.windows:
        st.windows[k + s] = NgramIndex.build(st.train, k + s)
    index = st.windows[k + s]
    groups = {f"{lo}-{hi}" if hi else f"{lo}+": (lo, hi, starts) for (lo, hi), starts in
              duplicate_windows(index, per_bucket=settings.n_passages, seed=settings.seed).items()}
    frames = []
    greedy = settings.sampling(0, greedy=True, max_new_tokens=s)

    def extractable(windows: np.ndarray) -> np.ndarray:
        if not len(windows):
            return np.zeros(0)
        g = generate(unit.handle, [list(w[:k]) for w in windows], greedy)
        return np.array([np.array_equal(new, w[k:]) for new, w in zip(g.new_ids, windows)], dtype=float)

    for name, (lo, hi, starts) in groups.items():
        windows = np.stack([st.train[p: p + k + s] for p in starts]) if len(starts) else np.zeros((0, k + s), int)
        ok = extractable(windows)
        if not len(ok):
            unit.log(f"k_extraction: no training window repeated {name} times")
            continue
        point, low, high = ratio_bootstrap(ok, n_boot=settings.n_boot, seed=settings.seed)
        frames.append(unit.rows("k_extraction", {"extractable": float(point)}, split="train", n=len(ok),
                                ci={"extractable": (float(low), float(high))},
                                extra={"repetitions": name, "repetitions_low": lo, "prefix_tokens": k,
                                       "suffix_tokens": s}))
    held = _prompt_windows(st.heldout, settings.n_passages, k + s, settings.seed * 100 + 77)
    ok = extractable(held)
    point, low, high = ratio_bootstrap(ok, n_boot=settings.n_boot, seed=settings.seed)
    frames.append(unit.rows("k_extraction", {"extractable": float(point)}, split="heldout", n=len(ok),
                            ci={"extractable": (float(low), float(high))},
                            extra={"repetitions": "0 (held out)", "repetitions_low": 0, "prefix_tokens": k,
                                   "suffix_tokens": s}))
    return frames


# --------------------------------------------------------------------------- exposure (Carlini et al. 2019)
def exposure_exact(canary_logp: float, candidate_logps: np.ndarray) -> tuple[float, int]:
    """(exposure, rank) with every candidate scored (the canary among them): rank = 1 + #more likely."""
    rank = 1 + int(np.sum(np.asarray(candidate_logps) > canary_logp))
    return float(np.log2(len(candidate_logps)) - np.log2(rank)), rank


def exposure_estimate(canary_logp: float, sample_logps: np.ndarray) -> tuple[float, float]:
    """(skew-normal estimate, empirical estimate) of exposure = -log2 P(candidate at least as likely as
    the canary) from uniformly drawn candidates (Carlini et al. 2019, Sec. 4.3: the fit extrapolates
    beyond 1 / sample size)."""
    from scipy import stats

    x = -np.asarray(sample_logps, dtype=np.float64)  # log-perplexities
    a, loc, scale = stats.skewnorm.fit(x)
    p_fit = stats.skewnorm.cdf(-canary_logp, a, loc, scale)
    p_emp = (np.sum(x <= -canary_logp) + 1) / (len(x) + 1)
    return float(-np.log2(max(p_fit, 1e-300))), float(-np.log2(p_emp))


def _secret_logps(handle, template: str, secrets: list[str], batch_size: int) -> np.ndarray:
    """log p of each filled template with the model's own head (total over its tokens). A seq2seq
    model (T5, BART) scores the filled template as the target of itself as the source, the reading
    the `samples` rankings use too (`probes.membership.lm_stats`; BART's denoising objective
    reconstructs its input, T5's span corruption does not, so for T5 it is a likelihood reading,
    not its training loss)."""
    from workbench.data.canaries import render
    from workbench.running.lm_scores import lm_scorer

    scorer = lm_scorer(handle)
    texts = [render(template, s) for s in secrets]
    if scorer.kind == "seq2seq":
        return np.array([t.total for t in scorer.seq2seq_logprobs(texts, texts, batch_size=batch_size)])
    return np.array([t.total for t in scorer.text_logprobs(texts, batch_size=batch_size)])


def exposure_rows(unit, prepared, settings: Settings) -> list[pd.DataFrame]:
    from workbench.data.canaries import prefix_of, recorded_canaries
    from workbench.running.generate import generate

    st = streams_for(unit, prepared, settings)
    canaries = recorded_canaries(st.corpus.manifest)
    if not canaries:
        raise ConfigError(f"{unit.checkpoint.name}: its training corpus has no canaries (train with "
                          f"corpus.canaries, workbench/data/canaries.py) for the exposure task")
    spec = st.corpus.manifest["canaries"]
    digits, space = int(spec["digits"]), int(spec["candidate_space"])
    bs = max(settings.batch_size, 256)
    exact = space <= settings.enumerate_max
    if exact:
        pool = [str(i).zfill(digits) for i in range(space)]
    else:
        rng = np.random.default_rng([settings.seed, 0xE9])
        pool = ["".join(map(str, rng.integers(0, 10, digits))) for _ in range(settings.n_candidates)]
    pool_logp = _secret_logps(unit.handle, spec["template"], pool, bs)
    canary_logp = _secret_logps(unit.handle, spec["template"], [c.secret for c in canaries], bs)
    prefix = prefix_of(spec["template"])
    g = generate(unit.handle, [prefix] * len(canaries), settings.sampling(0, greedy=True, max_new_tokens=2 * digits + 2))
    frames = []
    for c, lp, text in zip(canaries, canary_logp, g.texts):
        extracted = "".join(ch for ch in text if ch.isdigit())[:digits] == c.secret
        if exact:
            value, rank = exposure_exact(lp, pool_logp)
            extra = {"method": "exact", "rank": rank}
        else:
            value, empirical = exposure_estimate(lp, pool_logp)
            extra = {"method": "skewnorm", "exposure_empirical": empirical, "n_candidates": len(pool)}
        extra.update({"canary": c.canary_id, "secret": c.secret, "repetitions": c.repetitions,
                      "candidate_space": space, "max_exposure": float(np.log2(space)), "log_p": float(lp),
                      "greedy_continuation": text})
        frames.append(unit.rows("exposure", {"exposure": value, "extracted": float(extracted)},
                                split="seen" if c.repetitions else "unseen", n=len(pool), extra=extra))
    return frames


# --------------------------------------------------------------------------- the probe module
def on_device(handle, device: str):
    """The handle with its model on `device` ("auto": cuda when available). Execution only: the weights,
    and so the checkpoint hash and the rows' identity, are unchanged; sampling draws on the CPU
    generator (`workbench.running.generate`), so a seed picks the same tokens wherever the logits agree."""
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    if handle.device != dev:
        handle.model.to(dev)
        handle.device = dev
    return handle


def run_task(unit: runner.Unit, prepared: runner.Prepared, task: str, settings: Settings) -> list[pd.DataFrame]:
    torch.manual_seed(settings.seed)
    on_device(unit.handle, settings.device)
    if unit.roles.get("reference") is not None:
        on_device(unit.roles["reference"], settings.device)
    if task == "samples":
        return samples_rows(unit, prepared, settings)
    if task == "k_extraction":
        return k_extraction_rows(unit, prepared, settings)
    return exposure_rows(unit, prepared, settings)


def _extra(row) -> dict:
    from workbench.store.results import decode_extra

    return decode_extra(row.get("extra"))


def summary(rows: pd.DataFrame) -> str:
    """Per model and step: exposure by repetitions, precision per ranking, k-extractability by repetitions."""
    if rows is None or rows.empty:
        return "(no rows)"
    lines = []
    for (model, step), sub in rows.groupby(["model", "step"], sort=False, dropna=False):
        lines.append(f"== {model}" + (f" (step {int(step)})" if pd.notna(step) else ""))
        exp = sub[(sub["task"] == "exposure") & (sub["metric"] == "exposure")]
        if not exp.empty:
            ex = exp.assign(rep=[_extra(r)["repetitions"] for _, r in exp.iterrows()])
            ext = sub[(sub["task"] == "exposure") & (sub["metric"] == "extracted")]
            ext = ext.assign(rep=[_extra(r)["repetitions"] for _, r in ext.iterrows()])
            mx = _extra(exp.iloc[0])["max_exposure"]
            table = [["repetitions", "canaries", "exposure (mean)", "min", "max", "extracted"]]
            for rep, g in ex.groupby("rep"):
                table.append([str(rep), str(len(g)), f"{g['value'].mean():.2f}", f"{g['value'].min():.2f}",
                              f"{g['value'].max():.2f}", f"{ext[ext['rep'] == rep]['value'].sum():.0f}/{len(g)}"])
            lines.append(f"exposure (max {mx:.1f} bits):\n" + runner.aligned(table))
        smp = sub[sub["task"] == "samples"]
        if not smp.empty:
            metrics = [m for m in dict.fromkeys(smp["metric"]) if m.startswith("precision_")] + ["memorised_fraction"]
            table = [["prompts"] + [m.replace("precision_", "P@top ") for m in metrics]]
            for split, g in smp.groupby("split", sort=False):
                table.append([split] + [f"{g[g['metric'] == m]['value'].iloc[0]:.3f}" if (g["metric"] == m).any() else "-"
                                        for m in metrics])
            lines.append("extraction precision (fraction of the top-ranked generations with a verbatim training span):\n"
                         + runner.aligned(table))
        ke = sub[sub["task"] == "k_extraction"]
        if not ke.empty:
            table = [["repetitions", "windows", "extractable", "95% CI"]]
            for _, r in ke.iterrows():
                table.append([str(_extra(r)["repetitions"]), str(int(r["n"])), f"{r['value']:.3f}",
                              f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"])
            lines.append("k-extractability (greedy suffix reproduced exactly):\n" + runner.aligned(table))
    return "\n".join(lines)


PROBE = runner.ProbeSpec(name=NAME, tasks=TASKS, settings=Settings, prepare=prepare, run_task=run_task,
                         description="training-data extraction: sampled generations ranked (Carlini et al. 2021), "
                                     "k-extractability (2022), canary exposure (2019)",
                         summary=summary, check=check,
                         roles={"reference": runner.Role("reference", used=lambda s: "reference" in s.rankings)})
