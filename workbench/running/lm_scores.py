"""A model's own LM head: per-token log-probabilities, pseudo-log-likelihood, cloze candidate scores.

One home for every probe that asks a model how likely a text is (cloze: which candidate fills a
blank; membership: how well a text is predicted). `LMScorer(handle)` (or the cached
`lm_scorer(handle)`) finds the head once and scores with it; everything is natural log.

Which head, per family (`LMScorer.kind`):
- "mlm" (BERT, RoBERTa, SpanBERT, ALBERT, DistilBERT; ELECTRA through its generator, saved in
  `generator/` beside the discriminator, see `workbench.families.electra`, the default for ELECTRA):
  a text's score is its
  pseudo-log-likelihood (Salazar et al. 2020, "Masked Language Model Scoring"): every content
  token masked in turn, PLL = sum_t log p(w_t | w_\\t). All masked copies of a sentence go into ONE
  batch, several sentences per batch; the LM head is applied only at the masked position of each
  copy. Special tokens ([CLS], [SEP]) are context, not scored.
- "causal" (GPT): log p(w_t | w_<t) of every token after the first; the token the model's
  pretraining put between documents (`causal_start_id`) goes in front when the tokenizer adds no
  special token there, so the first word is scored too.
- "seq2seq" (T5, BART): log p(target | source), every target token (the tokenizer's closing
  token included) behind `decoder_start_token_id`, teacher-forced.
- "bilm" (ELMo, Peters et al. 2018): the forward LM's log p(w_t | w_<t) and the backward LM's
  log p(w_t | w_>t), through `ElmoForBiLM`'s shared softmax. Per token, the two are added (the
  forward LM is given <S>, the backward LM </S>: 0 for those); the total is
  log p_fwd(sentence) + log p_bwd(sentence), the two terms of ELMo's training objective.
- "rtd" (ELECTRA through its discriminator, `LMScorer(handle, electra_head="discriminator")`):
  the replaced-token-detection head (Clark et al. 2020) reads the UNMODIFIED text in one forward
  and gives every token a logit z_t for "replaced"; a token's score is
  log P(original_t | text) = log sigmoid(-z_t), special tokens excluded as for PLL. The text's
  total is the sum, so a mean over tokens says how confidently the discriminator calls every real
  token original (a text it trained on should look more "original" to it). This is no likelihood
  of the text; it is the discriminator's own per-token probability, used in the same slots
  (LOSS, Min-K%). Moments for Min-K%++ are those of log P(z) for z ~ Bernoulli over
  {original, replaced}: mu = p log p + q log q, sigma = sqrt(pq) |log p - log q|.

Candidate scoring (`score_candidates`: contexts holding one `<blank>`, a list of candidates each):
- masked LM, every candidate of a context one piece: log p(candidate) of the MLM distribution at
  the one mask position (the MC-MLM setup of Talmor et al. 2020, oLMpics; comparing these log-probs
  is comparing the distribution restricted to the candidates). Method "mask".
- masked LM, some candidate of the context more than one piece: the PLL of each filled sentence
  for every candidate of that context (so they stay comparable), method "pll"; a mask token written
  in the text (a content-free slot) is context there, not scored. Nothing is dropped;
  `CandidateScores.method` says which rule scored each candidate and `n_pieces` why.
- causal: log p(the whole filled sentence) (oLMpics and LM-eval-harness: the words after the blank
  take part). ELMo: forward + backward log p of the filled sentence.
- T5 (sentinel tokens): source = context with the blank replaced by the first sentinel; target =
  sentinel0 + candidate + sentinel1 (Raffel et al. 2020); score = log p of the candidate pieces and
  of the closing sentinel (so a candidate cannot win by being a prefix of a longer one).
- BART (mask token): source = context with one <mask> (text infilling, Lewis et al. 2020); target =
  the filled sentence, every token scored.
- `answer_only=True`, every head: the same inputs, only the candidate's own tokens scored (the
  answer-only scoring of Holtzman et al. 2021's domain-conditional PMI, `probes.cloze.scoring`):
  masked LM its pieces each masked in turn (one piece: "mask"; several: "pll-answer"), causal
  LM log p(candidate | words before it), ELMo forward + backward log p of its pieces, T5 its
  pieces behind the sentinel (not the closing sentinel), BART its pieces in the infilled target.
  The method gets "-answer" (masked LM: "mask" / "pll-answer").

The head on any layer (`layer_head`, the logit lens): the same output head applied to an earlier
layer's hidden states, per family (its docstring says which norm goes in front and why the encoder
of a seq2seq model has none); the cloze probe's lens and the app's explorer read layers through it.

Errors: a model without a trained LM head (a bare body such as sentence-transformers'
all-MiniLM-L6-v2, an ELECTRA discriminator without `generator/`, an ELMo saved without its softmax)
is a `CheckpointError` at construction; a text or context longer than the model's `max_length`,
a context without exactly one blank, or a candidate that shares a token with its context is a
`ConfigError` naming the input. Counts go to the handle's `stats` (never reset): lm_texts,
lm_tokens_scored, mlm_forward_rows, candidates, candidates_by_pll.

Concerns:
- which LM head a handle has (per family; ELECTRA's generator; DeBERTa's legacy MLM head):
  `lm_kind`, `is_electra`, `find_lm_head`, `handle_location`, `deberta_mlm_logits`
- scoring texts and cloze candidates with it (PLL, causal, seq2seq, biLM): `TextScore`,
  `CandidateScores`, `LMScorer`, `lm_scorer`
- the head as a function of one layer's hidden states (the logit lens): `mlm_head`, `final_norm`,
  `layer_head`
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from workbench.errors import CheckpointError, ConfigError, WorkbenchError
from workbench.families import ModelTypeTable
from workbench.running.lm_inputs import LMInputs, filled_items, text_start
from workbench.running.models import ModelHandle
from workbench.running import ModelRunner
from workbench.running.model_loading import load_weights

KINDS = ("mlm", "causal", "seq2seq", "bilm", "rtd")
ELECTRA_HEADS = ("generator", "discriminator")

# Masked-LM classes whose head can be applied to the hidden states of the masked positions alone
# (the head over every position of every copy would cost about as much as the body); any other
# masked LM takes the full logits and reads the masked positions (same numbers, slower).
MLM_HEADS: dict[str, Callable] = {
    "BertForMaskedLM": lambda m, h: m.cls(h),
    "RobertaForMaskedLM": lambda m, h: m.lm_head(h),
    "DebertaV2ForMaskedLM": lambda m, h: deberta_mlm_logits(m, h),
    "AlbertForMaskedLM": lambda m, h: m.predictions(h),
    "ElectraForMaskedLM": lambda m, h: m.generator_lm_head(m.generator_predictions(h)),
    "DistilBertForMaskedLM": lambda m, h: m.vocab_projector(m.vocab_layer_norm(m.activation(m.vocab_transform(h)))),
}


def deberta_mlm_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """A `DebertaV2ForMaskedLM`'s MLM head on hidden states: the legacy BERT-style head `cls` (config
    `legacy`, the default and what the workbench trains) or else `lm_predictions`, which takes the word
    embeddings as its decoder."""
    if getattr(model.config, "legacy", True):
        return model.cls(hidden)
    return model.lm_predictions(hidden, model.deberta.embeddings.word_embeddings)


@dataclass
class TextScore:
    """Scores of one text's tokens under the model's own head (natural log).

    `ids[k]` is the k-th scored token and `logprobs[k]` its log-probability; `total` their sum (the
    text's log-likelihood, or its PLL for a masked LM). With `moments=True`, `mu[k]` and
    `sigma[k]` are the mean and standard deviation of log p(z) for z drawn from the model's
    distribution at that position (what Min-K%++ standardises by; ELMo: the two directions'
    means added, variances added). ELMo also keeps each direction in `directions`."""

    ids: np.ndarray
    logprobs: np.ndarray
    method: str
    directions: dict[str, np.ndarray] = field(default_factory=dict)
    mu: np.ndarray | None = None
    sigma: np.ndarray | None = None

    @property
    def total(self) -> float:
        return float(self.logprobs.sum())


@dataclass
class CandidateScores:
    """`scores[i][j]`: log-probability of candidate j filling context i's blank (see the module
    docstring); `method[i][j]`: the rule that scored it ("mask", "pll", "causal", "bilm",
    "seq2seq-sentinel", "seq2seq-infill"); `n_pieces[i][j]`: its number of tokens in the filled
    context (a masked LM falls back to "pll" for a whole context when one of them is above 1)."""

    scores: list[list[float]]
    method: list[list[str]]
    n_pieces: list[list[int]]

    def best(self) -> list[int]:
        """Index of the highest-scoring candidate per context (the first on ties; -1 if none)."""
        return [int(np.argmax(s)) if len(s) else -1 for s in self.scores]


# model type -> where its LM scores come from when not its own head (`FamilySpec.lm_head`): "bilm"
# (ELMo's softmax over both directions) or "generator" (ELECTRA's generator)
LM_HEAD_OF_MODEL_TYPE = ModelTypeTable({}, lambda spec: None if spec.lm_head == "own" else spec.lm_head, primary=False)


def _lm_head_of(config) -> str | None:
    return LM_HEAD_OF_MODEL_TYPE.get(getattr(config, "model_type", ""))


def lm_kind(model) -> str:
    """'mlm', 'causal', 'seq2seq' (a model class with that LM head), 'bilm' (ELMo's LM) or 'base'."""
    name = type(model).__name__
    if _lm_head_of(model.config) == "bilm":
        return "bilm" if name == "ElmoForBiLM" else "base"
    try:
        has_head = model.get_output_embeddings() is not None
    except (NotImplementedError, AttributeError):
        has_head = False
    if not has_head:
        return "base"
    if getattr(model.config, "is_encoder_decoder", False):
        return "seq2seq"
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal"
    if name.endswith("ForMaskedLM"):
        return "mlm"
    return "base"


def lm_scorer(handle: ModelHandle, electra_head: str = "generator") -> "LMScorer":
    """The handle's scorer, built once per head and kept on the handle (ELMo's softmax and
    ELECTRA's generator or discriminator head load from disk)."""
    if handle.shifted_position_offset:
        # Its shifted-alphabet text must read offset positions, which the scorer's forwards do not pass.
        raise WorkbenchError(f"{handle_location(handle)}: LM scores are not supported for a model trained with separate "
                             f"positions for shifted text (objective.shifted_position_offset)")
    key = "_lm_scorer" if electra_head == "generator" else f"_lm_scorer_{electra_head}"
    scorer = handle.__dict__.get(key)
    if scorer is None:
        scorer = handle.__dict__[key] = LMScorer(handle, electra_head)
    return scorer


def is_electra(handle: ModelHandle) -> bool:
    """Whether the handle's LM scores can come from a generator beside its own head (ELECTRA)."""
    return _lm_head_of(handle.config) == "generator"


class LMScorer:
    """Scores with the LM head of `handle`'s model; raises `CheckpointError` if it has none.

    `electra_head`: which of ELECTRA's two heads scores ("generator": its masked LM, kind "mlm";
    "discriminator": replaced-token detection, kind "rtd"); a ConfigError for "discriminator" on
    any other model."""

    def __init__(self, handle: ModelHandle, electra_head: str = "generator"):
        self.handle = handle
        if electra_head not in ELECTRA_HEADS:
            raise ConfigError(f"electra_head must be one of {list(ELECTRA_HEADS)}, got {electra_head!r}")
        if electra_head == "discriminator":
            if not is_electra(handle):
                raise ConfigError(f"{handle_location(handle)}: only ELECTRA has a discriminator to score with "
                                  f"(model type {getattr(handle.config, 'model_type', '?')!r})")
            self.kind, self.model = "rtd", _electra_discriminator(handle)
        else:
            self.kind, self.model = find_lm_head(handle)
        self.model.eval()
        self.runner = ModelRunner(self.model)  # every forward of the scorer goes through it
        self.inputs = LMInputs(handle)
        self.mask_id = self.inputs.mask_id
        if self.kind == "mlm" and self.mask_id is None:
            raise CheckpointError(f"{handle_location(handle)}: masked LM whose tokenizer has no mask token")

    # ------------------------------------------------------------------ texts

    def text_logprobs(self, texts: Sequence[str], batch_size: int | None = None, moments: bool = False,
                      progress: bool = False) -> list[TextScore]:
        """Each text's per-token log-probabilities with the family's own likelihood: causal LM,
        ELMo's two LMs, or a masked LM's PLL (`batch_size` = sentences per batch for causal/ELMo,
        default 32; masked copies per batch for PLL, default 64). A seq2seq model needs a source:
        `seq2seq_logprobs`."""
        if self.kind == "causal":
            return self.causal_logprobs(texts, batch_size or 32, moments, progress)
        if self.kind == "bilm":
            return self.bilm_logprobs(texts, batch_size or 32, moments, progress)
        if self.kind == "mlm":
            return self.pseudo_log_likelihood(texts, batch_size or 64, moments, progress)
        if self.kind == "rtd":
            return self.rtd_logprobs(texts, batch_size or 32, moments, progress)
        raise ConfigError(f"{handle_location(self.handle)}: a seq2seq model scores a target given a source; "
                          f"use seq2seq_logprobs(sources, targets)")

    def pseudo_log_likelihood(self, texts: Sequence[str], batch_size: int = 64, moments: bool = False,
                              progress: bool = False) -> list[TextScore]:
        """PLL of each text (Salazar et al. 2020): every content token masked in turn. `batch_size`
        = masked copies per forward; a sentence's copies are never split across batches, so a
        sentence longer than `batch_size` tokens gets a batch of its own."""
        self._need("mlm", "pseudo-log-likelihood")
        rows = self.inputs.encode_texts(texts, "text")
        scored = [np.nonzero(~special)[0] for _, special in rows]
        out = _masked_scores(self, [ids for ids, _ in rows], scored, batch_size, moments, progress)
        return [self._text_score(rows[i][0][pos], out[i], "pll") for i, pos in enumerate(scored)]

    def causal_logprobs(self, texts: Sequence[str], batch_size: int = 32, moments: bool = False,
                        progress: bool = False) -> list[TextScore]:
        """log p(w_t | w_<t) of every token after the first (a bos/eos is put in front when the
        tokenizer adds no special token there)."""
        self._need("causal", "causal log-probabilities")
        rows = [self.causal_row(ids, special, f"text {i} ({text_start(texts[i])})")
                for i, (ids, special) in enumerate(self.inputs.encode_texts(texts, "text"))]
        out = self._causal_scores(rows, batch_size, moments, progress)
        return [self._text_score(ids[1:], o, "causal") for ids, o in zip(rows, out)]

    def bilm_logprobs(self, texts: Sequence[str], batch_size: int = 32, moments: bool = False,
                      progress: bool = False) -> list[TextScore]:
        """ELMo: per token of `<S> text </S>`, forward log p(w_t | w_<t) + backward log p(w_t | w_>t)."""
        self._need("bilm", "forward/backward LM log-probabilities")
        rows = [ids for ids, _ in self.inputs.encode_texts(texts, "text")]
        out = self._bilm_scores(rows, batch_size, moments, progress)
        return [self._text_score(ids, o, "bilm") for ids, o in zip(rows, out)]

    def rtd_logprobs(self, texts: Sequence[str], batch_size: int = 32, moments: bool = False,
                     progress: bool = False) -> list[TextScore]:
        """ELECTRA's discriminator on the unmodified text: log P(original) = log sigmoid(-z_t) of
        every content token (special tokens are context, not scored)."""
        self._need("rtd", "replaced-token log-probabilities")
        rows = self.inputs.encode_texts(texts, "text")
        out = self._rtd_scores([ids for ids, _ in rows], [np.nonzero(~sp)[0] for _, sp in rows], batch_size,
                               moments, progress)
        return [self._text_score(ids[~sp], o, "rtd") for (ids, sp), o in zip(rows, out)]

    def seq2seq_logprobs(self, sources: Sequence[str], targets: Sequence[str], batch_size: int = 32,
                         moments: bool = False, progress: bool = False) -> list[TextScore]:
        """log p(target | source) of every target token (with the tokenizer's special tokens, e.g.
        T5's closing </s>, BART's <s> ... </s>), teacher-forced behind decoder_start_token_id."""
        self._need("seq2seq", "seq2seq log-probabilities")
        if len(sources) != len(targets):
            raise ConfigError(f"{len(sources)} sources but {len(targets)} targets")
        src = [ids for ids, _ in self.inputs.encode_texts(sources, "source")]
        tgt = [ids for ids, _ in self.inputs.encode_texts(targets, "target")]
        out = self._seq2seq_scores(src, tgt, [0] * len(tgt), batch_size, moments, progress)
        return [self._text_score(t, o, "seq2seq") for t, o in zip(tgt, out)]

    # ------------------------------------------------------------------ cloze candidates

    def score_candidates(self, contexts: Sequence[str], candidates: Sequence[Sequence[str]],
                         batch_size: int = 32, answer_only: bool = False) -> CandidateScores:
        """log-probability of each candidate filling the one `<blank>` of its context, by the rule
        of the model's kind (module docstring); `answer_only`: the candidate's tokens alone.
        `batch_size`: filled sentences per forward (masked LM: masked copies per forward, a
        sentence's copies never split)."""
        if self.kind == "rtd":
            raise ConfigError(f"{handle_location(self.handle)}: ELECTRA's discriminator scores whole texts, not cloze "
                              f"candidates; candidates are scored by its generator")
        items = filled_items(contexts, candidates)
        self.handle.stats["candidates"] += len(items)
        scorer = {"mlm": self._candidates_mlm, "causal": self._candidates_causal, "bilm": self._candidates_bilm,
                  "seq2seq": self._candidates_seq2seq}[self.kind]
        flat, methods, pieces = scorer(items, batch_size, answer_only)
        out = CandidateScores([], [], [])
        k = 0
        for cands in candidates:
            n = len(cands)
            out.scores.append([float(x) for x in flat[k: k + n]])
            out.method.append(list(methods[k: k + n]))
            out.n_pieces.append([int(x) for x in pieces[k: k + n]])
            k += n
        return out

    def _candidates_mlm(self, items, batch_size, answer_only=False):
        rows, scored, methods, pieces = self.mlm_candidate_rows(items, answer_only)
        self.handle.stats["candidates_by_pll"] += methods.count("pll") + methods.count("pll-answer")
        out = _masked_scores(self, rows, scored, batch_size, False, False)
        return [float(o[0].sum()) for o in out], methods, pieces

    def mlm_candidate_rows(self, items, answer_only: bool = False):
        """`LMInputs.mlm_candidate_rows`: (filled rows, positions to mask, method, pieces) per item."""
        return self.inputs.mlm_candidate_rows(items, answer_only)

    def _candidates_causal(self, items, batch_size, answer_only=False):
        rows, pieces, answer = self.causal_candidate_rows(items)
        out = self._causal_scores(rows, batch_size, False, False)  # o[0][t - 1] = log p(row[t] | row[<t])
        if answer_only:
            return [float(o[0][pos - 1].sum()) for o, pos in zip(out, answer)], ["causal-answer"] * len(items), pieces
        return [float(o[0].sum()) for o in out], ["causal"] * len(items), pieces

    def causal_candidate_rows(self, items):
        """`LMInputs.causal_candidate_rows`: (filled rows behind the start token, pieces, the
        candidate's positions in each row)."""
        return self.inputs.causal_candidate_rows(items)

    def _candidates_bilm(self, items, batch_size, answer_only=False):
        filled = [self.encode_filled(*it) for it in items]
        out = self._bilm_scores([ids for ids, _, _ in filled], batch_size, False, False)  # per token
        pieces = [len(p) for _, _, p in filled]
        if answer_only:
            return [float(o[0][pos].sum()) for o, (_, _, pos) in zip(out, filled)], ["bilm-answer"] * len(items), pieces
        return [float(o[0].sum()) for o in out], ["bilm"] * len(items), pieces

    def _candidates_seq2seq(self, items, batch_size, answer_only=False):
        src_rows, tgt_rows, first, pieces, method, answer = self.seq2seq_candidate_rows(items)
        if answer_only:  # every target token read, the candidate's summed
            out = self._seq2seq_scores(src_rows, tgt_rows, [0] * len(tgt_rows), batch_size, False, False)
            return [float(o[0][pos].sum()) for o, pos in zip(out, answer)], [f"{method}-answer"] * len(items), pieces
        out = self._seq2seq_scores(src_rows, tgt_rows, first, batch_size, False, False)
        return [float(o[0].sum()) for o in out], [method] * len(items), pieces

    def seq2seq_candidate_rows(self, items):
        """`LMInputs.seq2seq_candidate_rows`: (sources, targets, first scored, pieces, method, the
        candidate's positions in each target)."""
        return self.inputs.seq2seq_candidate_rows(items)

    @property
    def decoder_start_id(self) -> int:
        """The token a seq2seq decoder starts from (config.decoder_start_token_id, else pad)."""
        return self.inputs.decoder_start_id

    # ------------------------------------------------------------------ encoding

    def encode_filled(self, i: int, left: str, cand: str, right: str):
        """`LMInputs.encode_filled`: (ids, special mask, candidate positions) of left + cand + right."""
        return self.inputs.encode_filled(i, left, cand, right)

    def causal_row(self, ids: np.ndarray, special: np.ndarray, what: str) -> np.ndarray:
        """`LMInputs.causal_row`: the row behind the model's start token."""
        return self.inputs.causal_row(ids, special, what)

    def _text_score(self, ids, scored, method) -> TextScore:
        lp, mu, sigma, directions = scored
        self.handle.stats["lm_tokens_scored"] += len(lp)
        return TextScore(np.asarray(ids, dtype=np.int64), lp, method, directions, mu, sigma)

    def _need(self, kind: str, what: str) -> None:
        if self.kind != kind:
            raise ConfigError(f"{handle_location(self.handle)}: {what} need a {kind} head; this model's LM head is {self.kind!r}")

    # ------------------------------------------------------------------ forward passes

    def pad(self, rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs.pad(rows)

    def _causal_scores(self, rows, batch_size, moments, progress):
        """log p(row[t] | row[<t]) for t >= 1 of each row."""
        def run(idx):
            ids, att = self.pad([rows[i] for i in idx])
            logits = self.runner.run(ids, att, head=True).output.logits[:, :-1].float()
            return self._gather(torch.log_softmax(logits, -1), ids[:, 1:], [len(rows[i]) - 1 for i in idx], moments)
        return self._batched(rows, batch_size, run, progress, "causal LM")

    def _bilm_scores(self, rows, batch_size, moments, progress):
        """ELMo: per token, forward log p(w_t | w_<t) (0 for the first) + backward log p(w_t | w_>t)
        (0 for the last); both directions kept."""
        def run(idx):
            ids, att = self.pad([rows[i] for i in idx])
            out = self.runner.run(ids, att, head=True, return_logits=True).output
            lens = [len(rows[i]) for i in idx]
            fwd = self._gather(torch.log_softmax(out.forward_logits[:, :-1].float(), -1), ids[:, 1:],
                               [n - 1 for n in lens], moments)
            bwd = self._gather(torch.log_softmax(out.backward_logits[:, 1:].float(), -1), ids[:, :-1],
                               [n - 1 for n in lens], moments)
            res = []
            for (f, fm, fs, _), (b, bm, bs, _) in zip(fwd, bwd):
                pad = lambda x, front: np.concatenate([[0.0], x] if front else [x, [0.0]])  # noqa: E731
                F, B = pad(f, True), pad(b, False)
                mu = sd = None
                if moments:
                    mu = pad(fm, True) + pad(bm, False)
                    sd = np.sqrt(pad(fs, True) ** 2 + pad(bs, False) ** 2)
                res.append((F + B, mu, sd, {"forward": F, "backward": B}))
            return res
        return self._batched(rows, batch_size, run, progress, "biLM")

    def _rtd_scores(self, rows, positions, batch_size, moments, progress):
        """log P(original) = log sigmoid(-z) at positions[row] of each unmodified row (ELECTRA's
        discriminator logit z = "replaced"); moments of the two-way distribution when asked."""
        def run(idx):
            ids, att = self.pad([rows[i] for i in idx])
            z = self.runner.run(ids, att, head=True).output.logits.float()  # [B, T]
            lp_orig = torch.nn.functional.logsigmoid(-z).double().cpu().numpy()
            lp_repl = torch.nn.functional.logsigmoid(z).double().cpu().numpy()
            res = []
            for b, i in enumerate(idx):
                a, r = lp_orig[b, positions[i]], lp_repl[b, positions[i]]
                mu = sd = None
                if moments:
                    p, q = np.exp(a), np.exp(r)
                    mu = p * a + q * r
                    sd = np.sqrt(p * q) * np.abs(a - r)
                res.append((a, mu, sd, {}))
            return res
        return self._batched(rows, batch_size, run, progress, "discriminator")

    def _seq2seq_scores(self, src_rows, tgt_rows, first_scored, batch_size, moments, progress):
        """log p(target[t] | target[<t], source) for t >= first_scored[row]."""
        start = self.decoder_start_id

        def run(idx):
            src, src_att = self.pad([src_rows[i] for i in idx])
            tgt, _ = self.pad([tgt_rows[i] for i in idx])
            dec, dec_att = self.pad([np.concatenate([[start], tgt_rows[i][:-1]]).astype(np.int64) for i in idx])
            logits = self.runner.run(src, src_att, decoder_input_ids=dec, decoder_attention_mask=dec_att,
                                     head=True).output.logits.float()
            full = self._gather(torch.log_softmax(logits, -1), tgt, [len(tgt_rows[i]) for i in idx], moments)
            return [(lp[f], None if m is None else m[f], None if s is None else s[f], {})
                    for (lp, m, s, _), f in zip(full, (slice(first_scored[i], None) for i in idx))]
        return self._batched(tgt_rows, batch_size, run, progress, "seq2seq")

    @staticmethod
    def _gather(logp: torch.Tensor, targets: torch.Tensor, lengths: list[int], moments: bool):
        """Per row b: log p of targets[b, :lengths[b]] (and the moments at those positions)."""
        lp = logp.gather(-1, targets[..., None])[..., 0].double().cpu().numpy()
        m = s = None
        if moments:
            m, s = _moments(logp)
        return [(lp[b, :n], None if m is None else m[b, :n], None if s is None else s[b, :n], {})
                for b, n in enumerate(lengths)]

    def _batched(self, rows, batch_size, run, progress, desc):
        """Run `run(indices)` over length-sorted batches of rows; results back in input order."""
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        out: list = [None] * len(rows)
        bar = _bar(progress, len(rows), desc)
        self.model.eval()
        with torch.inference_mode():
            for b0 in range(0, len(order), batch_size):
                idx = order[b0: b0 + batch_size]
                for i, r in zip(idx, run(idx)):
                    out[i] = r
                _tick(bar, len(idx))
        _close(bar)
        return out


# ---------------------------------------------------------------------- the head on any layer


def mlm_head(model) -> Callable | None:
    """`head(model, h) -> logits` of a masked LM that can be applied to hidden states alone (the MLM
    transform + decoder), or None when the class is not known (`MLM_HEADS`)."""
    return MLM_HEADS.get(type(model).__name__)


def final_norm(model):
    """The final layer norm a pre-LN causal LM applies before its unembedding (GPT-2: `ln_f`)."""
    base = model.base_model
    for name in ("ln_f", "norm", "final_layer_norm"):
        mod = getattr(base, name, None)
        if mod is not None:
            return mod
    raise ConfigError(f"no final layer norm found on {type(base).__name__}")


def layer_head(model, kind: str) -> Callable[[torch.Tensor, bool], torch.Tensor]:
    """The model's own output head as a function of ONE layer's hidden states, `head(h, last)` ->
    logits (the logit lens, nostalgebraist 2020): the same computation the model does on its last
    layer, applied to an earlier one. `last` is True for the final layer's states, which the model
    has already passed through its final norm (so the lens at the last layer IS the model's output).

    - "mlm" (BERT-style, post-LN: every layer's output is already layer-normed): the MLM transform +
      decoder on any layer.
    - "causal" (GPT-2, pre-LN): the final layer norm `ln_f`, then the unembedding.
    - "seq2seq", decoder states only: T5 (pre-LN) the decoder's `final_layer_norm`, the d_model^-0.5
      rescaling of tied embeddings, then `lm_head`; BART (post-LN, its decoder has no final norm)
      `lm_head` + `final_logits_bias` on any decoder layer. The encoder's states never meet the head
      (the decoder reads them through cross-attention), so no lens is defined for the encoder.
    - "bilm" (ELMo): layer k = [forward_k; backward_k] (layer 0 = [x; x], the token encoder's output);
      the shared softmax applied to each half (Peters et al. 2018 apply it to the top layer's
      halves); logits [..., 2, V] (forward, backward). The residual connections between ELMo's
      LSTM layers keep the layers in one space, as the residual stream does for transformers."""
    if kind == "mlm":
        head = mlm_head(model)
        if head is None:
            raise ConfigError(f"logit lens: unknown masked-LM head of {type(model).__name__}")
        return lambda h, last: head(model, h)
    if kind == "causal":
        norm, unembed = final_norm(model), model.get_output_embeddings()
        return lambda h, last: unembed(h if last else norm(h))
    if kind == "seq2seq":
        dec = model.get_decoder()
        norm = getattr(dec, "final_layer_norm", None)
        if norm is None:
            norm = getattr(dec, "layer_norm", None)  # mBART-style decoders end in one; BART's does not
        scale = model.config.d_model ** -0.5 if getattr(model.config, "scale_decoder_outputs", False) else 1.0
        bias = getattr(model, "final_logits_bias", None)
        lm_head = model.get_output_embeddings()

        def seq2seq(h, last):
            if norm is not None and not last:
                h = norm(h)
            logits = lm_head(h * scale)
            return logits if bias is None else logits + bias.view(-1).to(logits.device)
        return seq2seq
    if kind == "bilm":
        H = model.config.projection_dim
        return lambda h, last: torch.stack([model.softmax(h[..., :H]), model.softmax(h[..., H:])], dim=-2)
    raise ConfigError(f"logit lens: no output head for a model of kind {kind!r}")


# ---------------------------------------------------------------------- finding the head


def handle_location(handle: ModelHandle) -> str:
    """Where a handle's model comes from, for messages: its folder, or "in-memory model"."""
    return str(handle.path) if handle.path is not None else "in-memory model"


def find_lm_head(handle: ModelHandle):
    """(kind, model with the LM head) for a handle; CheckpointError naming the folder if none."""
    model, config = handle.model, handle.config
    if _lm_head_of(config) == "bilm":
        return "bilm", _elmo_lm(handle)
    kind = lm_kind(model)
    if kind != "base" and handle.head_trained:
        return kind, model
    if _lm_head_of(config) == "generator":
        return "mlm", _electra_generator(handle)
    if handle.path is None:
        what = f"{type(model).__name__} has no LM head"
    else:
        archs = getattr(config, "architectures", None) or ["an unnamed architecture"]
        what = f"the checkpoint was saved as {', '.join(archs)}, without LM head weights"
    raise CheckpointError(
        f"{handle_location(handle)}: no trained LM head to score with: {what} (a bare model body, as sentence-embedding "
        f"models such as sentence-transformers/all-MiniLM-L6-v2 ship); LM scores need a checkpoint saved with its "
        f"masked-LM, causal-LM or seq2seq head")


def _elmo_lm(handle: ModelHandle):
    """ELMo's biLM (`ElmoForBiLM`: the encoder + the shared softmax). The handle opens the bare
    `ElmoModel`; the softmax is loaded from the same folder and put on top of the handle's own
    encoder (one copy of the weights)."""
    from workbench.families.elmo_modules import ElmoForBiLM

    if isinstance(handle.model, ElmoForBiLM):
        return handle.model
    if handle.path is None:
        raise CheckpointError("in-memory ELMo model has no LM softmax: wrap an ElmoForBiLM in the handle")
    lm, info = load_weights(ElmoForBiLM, handle.path, "ELMo's biLM", loading_info=True)
    if any(k.startswith("softmax") for k in info.get("missing_keys", [])):
        raise CheckpointError(f"{handle.path}: ELMo checkpoint without its LM softmax (saved from the bare "
                              f"ElmoModel): no forward/backward LM to score with")
    lm.elmo = handle.model
    return lm.to(handle.device).eval()


def _electra_generator(handle: ModelHandle):
    """ELECTRA's generator (a masked LM), saved in `generator/` beside the discriminator
    (`workbench.families.electra.GENERATOR_DIR`)."""
    from transformers import AutoModelForMaskedLM

    from workbench.families.electra import GENERATOR_DIR

    folder = handle.path / GENERATOR_DIR if handle.path is not None else None
    if folder is None or not (folder / "config.json").is_file():
        raise CheckpointError(f"{handle_location(handle)}: ELECTRA discriminator without its generator (no {GENERATOR_DIR}/ "
                              f"folder beside it): the discriminator has no LM head; ELECTRA is scored through "
                              f"its generator")
    gen, info = load_weights(AutoModelForMaskedLM, folder, "ELECTRA's generator", loading_info=True)
    if info.get("missing_keys"):
        raise CheckpointError(f"{folder}: generator weights missing: {list(info['missing_keys'])[:5]}")
    if gen.config.vocab_size < len(handle.tokenizer):
        raise CheckpointError(f"{folder}: generator vocabulary ({gen.config.vocab_size}) is smaller than the "
                              f"tokenizer's ({len(handle.tokenizer)})")
    return gen.to(handle.device).eval()


def _electra_discriminator(handle: ModelHandle):
    """ELECTRA's discriminator with its replaced-token-detection head (`ElectraForPreTraining`), the
    main folder of an ELECTRA checkpoint. The handle opens that folder as a masked LM without head
    weights; the RTD head is loaded from the same folder and put on the handle's own body (one
    copy of the body's weights). An in-memory `ElectraForPreTraining` is used as it is."""
    from transformers import ElectraForPreTraining

    if isinstance(handle.model, ElectraForPreTraining):
        return handle.model
    if handle.path is None:
        raise CheckpointError(f"{handle_location(handle)}: {type(handle.model).__name__} has no discriminator head "
                              f"(wrap an ElectraForPreTraining in the handle)")
    disc, info = load_weights(ElectraForPreTraining, handle.path, "ELECTRA's discriminator", loading_info=True)
    missing = [k for k in info.get("missing_keys", []) if k.startswith("discriminator_predictions")]
    if missing:
        raise CheckpointError(f"{handle.path}: no trained discriminator head (weights missing: {missing[:3]}); "
                              f"an ELECTRA checkpoint saves it in its main folder")
    disc.electra = handle.model.base_model
    return disc.to(handle.device).eval()


# ---------------------------------------------------------------------- small helpers


def _masked_scores(scorer: "LMScorer", rows, positions, batch_size, moments, progress):
    """For each row and each position p in positions[row]: log p(rows[row][p]) with p masked.

    A masked copy is made once even when several rows give the same one (a cloze context with
    one-piece candidates: one copy, every candidate read from it). Copies are packed into
    batches by row, all copies of a row in one batch, rows sorted by length so batches pad
    little. Returns per row (logprobs, mu, sigma, {})."""
    entries_row = np.repeat(np.arange(len(rows)), [len(p) for p in positions])
    entries_pos = np.concatenate([np.asarray(p, dtype=np.int64) for p in positions]) if rows else np.zeros(0, np.int64)
    unique: dict[bytes, int] = {}
    copy_row, copy_pos, entry_copy = [], [], np.empty(len(entries_row), dtype=np.int64)
    for e, (r, p) in enumerate(zip(entries_row.tolist(), entries_pos.tolist())):
        m = rows[r].copy()
        m[p] = scorer.mask_id
        key = m.tobytes()
        if key not in unique:
            unique[key] = len(copy_row)
            copy_row.append(r)
            copy_pos.append(p)
        entry_copy[e] = unique[key]
    copy_row_a, copy_pos_a = np.asarray(copy_row, dtype=np.int64), np.asarray(copy_pos, dtype=np.int64)
    # pack rows (with their copies) into batches of <= batch_size copies, longest rows first
    by_row = {}
    for c, r in enumerate(copy_row):
        by_row.setdefault(r, []).append(c)
    order = sorted(by_row, key=lambda r: -len(rows[r]))
    batches, cur, n = [], [], 0
    for r in order:
        k = len(by_row[r])
        if cur and n + k > batch_size:
            batches.append(cur)
            cur, n = [], 0
        cur += by_row[r]
        n += k
    if cur:
        batches.append(cur)
    C = len(copy_row)
    target_of_entry = np.array([rows[r][p] for r, p in zip(entries_row, entries_pos)], dtype=np.int64)
    lp = np.zeros(len(entries_row))
    mu = np.zeros(len(entries_row)) if moments else None
    sd = np.zeros(len(entries_row)) if moments else None
    # entries grouped by copy, to read every entry of a batch's copies at once
    entry_order = np.argsort(entry_copy, kind="stable")
    copy_start = np.searchsorted(entry_copy[entry_order], np.arange(C + 1))
    bar = _bar(progress, len(batches), "PLL batches")
    for batch in batches:
        cb = np.asarray(batch, dtype=np.int64)
        ids, att = scorer.pad([rows[r] for r in copy_row_a[cb]])
        rr = torch.arange(len(cb), device=ids.device)
        cols = torch.from_numpy(copy_pos_a[cb]).to(ids.device)
        ids[rr, cols] = scorer.mask_id
        logp = torch.log_softmax(_mlm_logits_at(scorer.runner, ids, att, rr, cols), dim=-1)  # [R, V]
        scorer.handle.stats["mlm_forward_rows"] += len(cb)
        ents = np.concatenate([entry_order[copy_start[c]: copy_start[c + 1]] for c in cb])
        local = np.repeat(np.arange(len(cb)), copy_start[cb + 1] - copy_start[cb])
        li = torch.from_numpy(local).to(logp.device)
        lp[ents] = logp[li, torch.from_numpy(target_of_entry[ents]).to(logp.device)].double().cpu().numpy()
        if moments:
            m, s = _moments(logp)
            mu[ents], sd[ents] = m[local], s[local]
        _tick(bar)
    _close(bar)
    return _split_per_row(lp, mu, sd, [len(p) for p in positions])


def _mlm_logits_at(runner: ModelRunner, ids, att, rows, cols) -> torch.Tensor:
    """Logits [R, V] of a masked LM at (rows[r], cols[r]): the head on those positions only when
    the class is known (`MLM_HEADS`), else the full logits read there."""
    with torch.inference_mode():
        model = runner.model
        head = mlm_head(model)
        if head is None:
            return runner.run(ids, att, head=True).output.logits[rows, cols].float()
        hidden = runner.run(ids, att).output.last_hidden_state
        return head(model, hidden[rows, cols]).float()


def _moments(logp: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of log p(z), z ~ p, over the last axis (Min-K%++, Zhang et al. 2024)."""
    p = logp.exp()
    mu = (p * logp).sum(-1)
    var = (p * (logp - mu[..., None]).square()).sum(-1)  # centred: E[x^2] - mu^2 cancels in float32
    return mu.double().cpu().numpy(), var.sqrt().double().cpu().numpy()


def _split_per_row(lp, mu, sd, counts):
    out, k = [], 0
    for n in counts:
        out.append((lp[k: k + n], None if mu is None else mu[k: k + n], None if sd is None else sd[k: k + n], {}))
        k += n
    return out


def _bar(on: bool, total: int, desc: str):
    if not on:
        return None
    from workbench.progress import progress

    return progress(total=total, desc=desc, unit="it")


def _tick(bar, n: int = 1) -> None:
    if bar is not None:
        bar.update(n)


def _close(bar) -> None:
    if bar is not None:
        bar.close()
