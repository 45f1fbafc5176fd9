"""Membership inference: which texts did a model, and each of its layers, see in training?

Ground truth comes from manifests only, never guessed (what no web-scale study has):
- `pretrain`: the checkpoint's manifest names its corpus (`workbench.data.corpus.resolve_corpus_manifest`);
  members are passages of the documents of its recorded `train` split, non-members passages of the
  `heldout` split. A passage is `passage_words` consecutive words of a document (the original
  text between them, newlines included), the last shorter one kept when it has >= `min_words`;
  passages longer than the model's window (its training `max_len`) are left out, counted in the
  sample's notes (`passages_too_long_for_the_model`): it has no trained positions past it.
  `corpus` evaluates against another corpus folder instead (the null experiment: a model trained
  on neither split must sit at AUC 0.5).
- `finetune`: a checkpoint of `bertology finetune`; members are the training examples it saw,
  non-members every other example of the task (`workbench.finetune.members`).
A document id in both splits is an error (a planted overlap is caught); a text that occurs in both
splits under different ids is dropped from both (its label is ambiguous) and counted.
Members and non-members are then drawn in equal numbers (`n_examples` each) with identical
histograms of (source, length in words) (fine-tuning: (label, length)), so that neither the source
mix nor length can separate them (`membership_attacks.length_matched`); both length
distributions are reported in the run's notes.
Pretraining: passages are drawn across as many documents as possible and the same way in both
groups: at most c passages of any document, c the smallest cap that fills the sample
(`membership_attacks.capped_length_matched`; the notes say c); the rows' extra and the summary give
the distinct documents per group (`documents`). Passages of one document are not independent: every CI resamples documents (`probes.core.statistics.auc_bootstrap`
with the documents as units; fine-tuning: an example is its own unit).

Per-example likelihood with each family's own head (`workbench.lm_scores`): causal NLL (GPT), forward +
backward LM (ELMo), masked LMs by their full pseudo-log-likelihood (batched, Salazar et al. 2020),
ELECTRA through its generator (PLL, default) or, with `electra_head="discriminator"`, through its
discriminator's replaced-token probabilities: per content token of the UNMODIFIED text,
log P(original) = log sigmoid(-z_t) from the RTD logit z_t, and the text's "NLL" is minus their mean
(so LOSS = mean log P(original): how confidently the discriminator calls every real token original;
Min-K% reads the tokens it suspects most); seq2seq (T5/BART) as log p(text | source = the same text) (the
denoising objective at zero noise; a documented choice, not either model's pretraining input).
The head used per model is in the run's notes (`lm_score`) and each attack row's extra (`scored_by`).
Fine-tuned classifiers: cross-entropy on the true label and the logit-scaled confidence.
Attacks and their sign (higher = member): see `probes.membership.attacks`. Task `attacks` gives,
per attack, `auc` (bootstrap CI), `tpr_fpr_1pct`, `tpr_fpr_0.1pct` (extra: how many non-members
that FPR allows), `balanced_acc`, and the ROC points in the auc row's extra; the row's `task` is
the attack (loss, zlib, reference_diff, reference_ratio, mink_K, minkpp_K, lira_online, lira_offline).
Task `layers`: a linear probe (`probes.core.fitting.fit_probe`) on each layer's mean-pooled passage vector
(mean over words of mean-pooled subwords), trained on half of the members and non-members and
tested on the other half, split BY DOCUMENT (`membership_attacks.grouped_split`: passages of one
document share topic, and a random split lets a probe recognise a test passage's document from its
training passages): per-layer `auc` (CI over documents) and `accuracy`; the random-init twin is its
baseline, and a model-free control on the same split (TF-IDF + logistic regression on the texts,
`membership_attacks.tfidf_control_scores`; a whole-model row of task `tfidf_control`, extra
`baseline: model_free_tfidf`) shows what the sample's composition alone gives away.

`reference_diff` (Watson et al. 2022) and `reference_ratio` (Carlini et al. 2021) need a reference
checkpoint trained on disjoint data (`reference` is reference_diff's old name);
`lira` needs a shadow set (`workbench.shadows`): the target's examples are looked up in each
shadow model's own manifest (IN = its train split, OUT = its held-out split; fine-tuned shadows:
IN = the examples it trained on, OUT = the rest of its splits.json); shadows from the target's own
training run are left out (per unit); the shadows are the runner's lazy `shadows` role
(`shadow_checkpoints`: every checkpoint LiRA may read, hashed into each unit's resume key, so a
retrained shadow re-runs the unit; loaded one at a time when read); a fine-tuned target is compared with each shadow at the target's epoch
(its step folder of that epoch, where kept). Fine-tuning setting: members and non-members are drawn from the shadow
set's pool only (dev/test and unsampled examples have no IN shadow); phi = Carlini et al.'s
logit-scaled confidence on the true label, z_y - logsumexp(z_other).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from probes.membership import attacks as ma
from probes.core import runner
from workbench.errors import CheckpointError, ConfigError

NAME = "membership"
TASKS = ("attacks", "layers")
SETTINGS_KINDS = ("pretrain", "finetune")
ATTACKS = ("loss", "zlib", "reference_diff", "reference_ratio", "reference", "mink", "minkpp", "lira")
CONTROL_TASK = "tfidf_control"  # the `layers` task's model-free control row (no layer)
REFERENCE_ATTACKS = ("reference_diff", "reference_ratio", "reference")  # `reference`: old name of reference_diff
LM_ONLY = ("zlib", "mink", "minkpp")


# --------------------------------------------------------------------------- ground truth
@dataclass
class Sample:
    """Members and non-members of one checkpoint (equal numbers, length-matched)."""

    ids: list[str]
    doc_ids: list[str]
    texts: list[str]
    is_member: np.ndarray
    lengths: np.ndarray  # words
    labels: np.ndarray | None = None  # finetune: class index per example
    task_index: np.ndarray | None = None  # finetune: index into the task's examples
    info: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.ids, self.is_member.tolist()]).encode()).hexdigest()[:16]


def check_disjoint(members, nonmembers, where: str) -> None:
    """A document id in both the training and the held-out list is a broken ground truth: error."""
    both = sorted(set(members) & set(nonmembers))
    if both:
        raise ConfigError(f"{where}: {len(both)} id(s) are both members and non-members, e.g. {both[:3]}: "
                          f"the recorded split is not a split")


_WORD = re.compile(r"\S+")


def passages(text: str, n_words: int, min_words: int) -> list[tuple[str, int]]:
    """Consecutive `n_words`-word passages of a text (original spacing kept), with their word counts;
    a shorter last passage is kept when it has >= min_words words."""
    spans = [m.span() for m in _WORD.finditer(text)]
    out = []
    for i in range(0, len(spans), n_words):
        chunk = spans[i: i + n_words]
        if len(chunk) >= min(n_words, min_words):
            out.append((text[chunk[0][0]: chunk[-1][1]], len(chunk)))
    return out


def _draw(mem: list, non: list, n: int, seed: int, where: str, extra: dict, length_bin: int = 1,
          cap_per_document: bool = False) -> tuple[list, list, dict]:
    """Drop texts in both groups, then equal-size samples matched on (stratum, length); returns the
    chosen lists + info. mem/non: lists of (id, doc_id, text, n_words, payload, stratum).
    `cap_per_document`: at most c passages of any document in either group, c the smallest cap that
    fills the sample (`ma.capped_length_matched`)."""
    shared = {r[2] for r in mem} & {r[2] for r in non}
    mem = [r for r in mem if r[2] not in shared]
    non = [r for r in non if r[2] not in shared]
    key = lambda r: f"{r[5]}|{r[3] // length_bin}"
    cap = None
    if cap_per_document:
        im, inn, cap = ma.capped_length_matched([key(r) for r in mem], [key(r) for r in non], [r[1] for r in mem],
                                                [r[1] for r in non], n, seed)
    else:
        im, inn = ma.length_matched([key(r) for r in mem], [key(r) for r in non], n, seed)
    if len(im) < 10:
        raise ConfigError(f"{where}: only {len(im)} length-matched member/non-member pairs")
    chosen_m, chosen_n = [mem[i] for i in im], [non[i] for i in inn]
    info = {"ground_truth": where, **extra,
            "matched_on": f"stratum (pretrain: source; finetune: label) and words // {length_bin}",
            "candidates": {"members": len(mem), "nonmembers": len(non)},
            "dropped_shared_texts": len(shared), "n_per_group": len(im),
            **({"passages_per_document_cap": cap} if cap_per_document else {}),
            "documents_per_group": {"members": len({r[1] for r in chosen_m}),
                                    "nonmembers": len({r[1] for r in chosen_n})},
            "lengths": {"members": ma.length_summary([r[3] for r in chosen_m]),
                        "nonmembers": ma.length_summary([r[3] for r in chosen_n])}}
    return chosen_m, chosen_n, info


def _sample(chosen_m, chosen_n, info, labelled: bool) -> Sample:
    rows = chosen_m + chosen_n
    return Sample(ids=[r[0] for r in rows], doc_ids=[r[1] for r in rows], texts=[r[2] for r in rows],
                  is_member=np.r_[np.ones(len(chosen_m), bool), np.zeros(len(chosen_n), bool)],
                  lengths=np.array([r[3] for r in rows]),
                  labels=np.array([r[4][0] for r in rows]) if labelled else None,
                  task_index=np.array([r[4][1] for r in rows]) if labelled else None, info=info)


def corpus_of(checkpoint: str | Path):
    """(CorpusSplit, manifest path) the checkpoint's manifest names as its training corpus; rebuilt
    from the data root by its recorded recipe when the folder is not found (`checkpoint_corpus`)."""
    from workbench.checkpoints import read_manifest
    from workbench.data.corpus import checkpoint_corpus

    m = read_manifest(checkpoint)
    if not m or not isinstance(m.get("corpus"), dict):
        raise CheckpointError(f"{checkpoint}: its manifest.json records no training corpus (not trained by the "
                              f"backend?); pass corpus=<corpus folder> to evaluate against one")
    if m["corpus"].get("split", "train") != "train":
        raise CheckpointError(f"{checkpoint}: trained on split {m['corpus'].get('split')!r}, expected 'train'")
    return checkpoint_corpus(checkpoint, m)


def pretrain_sample(checkpoint, passage_words: int = 32, min_words: int = 8, n_examples: int | None = 1000,
                    seed: int = 0, corpus_dir: str | Path | None = None, length_bin: int = 1,
                    fits=None) -> Sample:
    """Members = passages of the recorded train split's documents, non-members = of the held-out split's.

    `fits(texts) -> bool array`: keep only passages the model can score whole (a model trained on
    `max_len`-token blocks has no trained positions past them); the drops per split are in `info`."""
    from workbench.data.corpus import CorpusSplit

    if corpus_dir is not None:
        corpus, where = CorpusSplit.load(corpus_dir), Path(corpus_dir) / "manifest.json"
    else:
        corpus, where = corpus_of(checkpoint)
    check_disjoint(corpus.doc_ids("train"), corpus.doc_ids("heldout"), str(where))
    groups, too_long = {}, {}
    for split in ("train", "heldout"):
        rows = [(f"{d.doc_id}#{k}", d.doc_id, t, n, None, d.source) for d in corpus.documents(split)
                for k, (t, n) in enumerate(passages(d.text, passage_words, min_words))]
        keep = np.asarray(fits([r[2] for r in rows]), dtype=bool) if fits is not None and rows else None
        groups[split] = rows if keep is None else [r for r, k in zip(rows, keep) if k]
        too_long[split] = len(rows) - len(groups[split])
    m, n, info = _draw(groups["train"], groups["heldout"], n_examples, seed, str(where),
                       {"setting": "pretrain", "passage_words": passage_words, "corpus_override": corpus_dir is not None,
                        "documents": {"train": len(corpus.doc_ids("train")), "heldout": len(corpus.doc_ids("heldout"))},
                        "passages_too_long_for_the_model": too_long},
                       length_bin, cap_per_document=True)
    return _sample(m, n, info, labelled=False)


def finetune_sample(checkpoint, n_examples: int | None = 1000, seed: int = 0, length_bin: int = 1,
                    within: list[str] | None = None) -> tuple[Sample, object]:
    """Members = the examples the fine-tuned checkpoint trained on, non-members the task's others;
    `within`: only these example ids (LiRA: a shadow set's pool, the examples its shadows cover)."""
    from workbench.checkpoints import read_manifest
    from workbench.finetune import load_finetune_config, load_task, members

    mem_ids, non_ids = members(checkpoint)
    check_disjoint(mem_ids, non_ids, f"{checkpoint} (fine-tuning splits)")
    m = read_manifest(checkpoint)
    data = load_task(load_finetune_config(m["finetune"]["config"]))
    if data.kind != "sentence":
        raise ConfigError(f"{checkpoint}: membership on fine-tuning supports sentence tasks, not {data.kind}")
    index = {i: k for k, i in enumerate(data.ids)}
    unknown = [i for i in mem_ids + non_ids if i not in index]
    if unknown:
        raise CheckpointError(f"{checkpoint}: {len(unknown)} split id(s) not in task {data.task}, e.g. {unknown[:3]}")
    extra = {"setting": "finetune", "task": data.task}
    if within is not None:
        keep = set(within)
        mem_ids, non_ids = [i for i in mem_ids if i in keep], [i for i in non_ids if i in keep]
        extra["within"] = f"{len(keep)} example ids (the LiRA shadow pool)"
    rows = lambda ids: [(i, i, " ".join(data.words[index[i]]), len(data.words[index[i]]),
                         (int(data.labels[index[i]]), index[i]), int(data.labels[index[i]])) for i in ids]
    chosen_m, chosen_n, info = _draw(rows(mem_ids), rows(non_ids), n_examples, seed, m["finetune"]["splits"],
                                     extra, length_bin)
    return _sample(chosen_m, chosen_n, info, labelled=True), data


# --------------------------------------------------------------------------- per-example statistics
@dataclass
class Stats:
    """Per example: mean NLL, and (language models) token log-probs and Min-K%++ moments; phi is
    LiRA's logit-scaled confidence."""

    nll: np.ndarray
    phi: np.ndarray
    logprobs: list | None = None
    mu: list | None = None
    sigma: list | None = None


def scored_by(handle, electra_head: str = "generator") -> str:
    """What scores a model's texts: the LM kind, and for ELECTRA which of its two heads."""
    from workbench.lm_scores import is_electra, lm_scorer

    kind = lm_scorer(handle, electra_head if is_electra(handle) else "generator").kind
    return f"{kind} ({electra_head})" if is_electra(handle) else kind


def lm_stats(handle, texts: list[str], batch_size: int, moments: bool = True, progress: bool = False,
             electra_head: str = "generator") -> Stats:
    """The family's own likelihood of each text (see the module docstring); `electra_head` picks
    ELECTRA's generator or discriminator and is ignored for other families (`scored_by` says which)."""
    from workbench.lm_scores import is_electra, lm_scorer

    scorer = lm_scorer(handle, electra_head if is_electra(handle) else "generator")
    if scorer.kind == "seq2seq":
        scores = scorer.seq2seq_logprobs(texts, texts, batch_size=batch_size, moments=moments, progress=progress)
    else:
        scores = scorer.text_logprobs(texts, batch_size=batch_size * (2 if scorer.kind == "mlm" else 1),
                                      moments=moments, progress=progress)
    nll = np.array([ma.mean_nll(s.logprobs) for s in scores])
    return Stats(nll, ma.scaled_logit_from_mean_logprob(-nll), [s.logprobs for s in scores],
                 [s.mu for s in scores] if moments else None, [s.sigma for s in scores] if moments else None)


def classifier_stats(checkpoint, handle, data, sample: Sample, batch_size: int) -> Stats:
    """Cross-entropy on the true label and Carlini et al.'s logit-scaled confidence of a fine-tuned classifier."""
    from workbench.checkpoints import read_manifest
    from workbench.finetune import (
        collate,
        encode,
        load_classifier,
        load_finetune_config,
    )

    cfg = load_finetune_config(read_manifest(checkpoint)["finetune"]["config"])
    model = load_classifier(checkpoint)
    enc = encode(handle, data, [int(i) for i in sample.task_index], min(cfg.max_len, handle.max_length))
    logits = []
    with torch.inference_mode():
        for b0 in range(0, len(enc.ids), batch_size):
            batch = collate(enc, list(range(b0, min(b0 + batch_size, len(enc.ids)))), handle.pad_id)
            batch.pop("labels")
            logits.append(model(**batch).logits.float().cpu().numpy())
    z = np.concatenate(logits).astype(np.float64)
    y = sample.labels
    logp = z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - z.max(1, keepdims=True)
    return Stats(-logp[np.arange(len(y)), y], ma.scaled_logit_from_logits(z, y))


# --------------------------------------------------------------------------- the probe module
@dataclass
class Settings(runner.Settings):
    setting: str = field(default="pretrain", metadata={"help": "pretrain | finetune (where membership comes from)"})
    attacks: tuple[str, ...] = field(default=("loss", "zlib", "mink", "minkpp"), metadata={
        "help": "comma-separated: loss,zlib,reference_diff,reference_ratio,mink,minkpp,lira (reference_* need "
                "--reference, lira --shadows; `reference` is the old name of reference_diff)"})
    n_examples: int = field(default=1000, metadata={"help": "members and non-members each (length-matched)"})
    passage_words: int = field(default=32, metadata={"help": "pretrain: words per passage"})
    min_words: int = field(default=8, metadata={"help": "pretrain: shortest last passage of a document kept"})
    length_bin: int = field(default=1, metadata={"help": "match lengths within bins of this many words"})
    corpus: str | None = field(default=None, metadata={
        "help": "pretrain: corpus folder to take members/non-members from instead of the checkpoint's own"})
    mink_ratios: tuple[float, ...] = field(default=ma.MINK_RATIOS, metadata={"help": "Min-K and Min-K++ fractions of the lowest-scored tokens"})
    reference: str | None = field(default=None, metadata={
        "help": "reference checkpoint trained on data disjoint from the target's (reference attack)"})
    shadows: str | None = field(default=None, metadata={"help": "shadow-set folder (workbench.shadows) for LiRA"})
    fix_variance: bool = field(default=False, metadata={"help": "LiRA: one global deviation instead of per example"})
    equal_counts: bool | None = field(default=None, metadata={
        "help": "LiRA: thin shadows to equal IN and OUT counts per example (see docs/membership.md: a target "
                "from its own balanced shadow set biases online LiRA below 0.5 otherwise); default: on exactly "
                "when the target is one of the shadow set's models"})
    max_roc_points: int = field(default=200, metadata={"help": "ROC points stored per attack"})
    electra_head: str = field(default="generator", metadata={
        "help": "ELECTRA: score with its generator (PLL) or its discriminator (log P(original) per token of the "
                "unmodified text); other families ignore it"})

    def validate(self, spec) -> None:
        super().validate(spec)
        if self.electra_head not in ("generator", "discriminator"):
            raise ConfigError(f"membership: electra_head must be generator or discriminator, got {self.electra_head!r}")
        if self.setting not in SETTINGS_KINDS:
            raise ConfigError(f"membership: setting must be one of {list(SETTINGS_KINDS)}, got {self.setting!r}")
        bad = [a for a in self.attacks if a not in ATTACKS]
        if bad:
            raise ConfigError(f"membership: unknown attack(s) {bad}; known: {list(ATTACKS)}")
        if self.setting == "finetune" and set(self.attacks) & set(LM_ONLY):
            raise ConfigError(f"membership: {sorted(set(self.attacks) & set(LM_ONLY))} need a language model's "
                              f"token log-probs; the finetune setting offers loss, reference_diff, reference_ratio, lira")
        if set(self.attacks) & set(REFERENCE_ATTACKS) and not self.reference:
            raise ConfigError("membership: the reference attack needs --reference CHECKPOINT")
        if "lira" in self.attacks and not self.shadows:
            raise ConfigError("membership: the lira attack needs --shadows SHADOW_SET_FOLDER")
        if self.n_examples < 10 or self.passage_words < 2 or self.min_words < 1 or self.length_bin < 1:
            raise ConfigError("membership: n_examples must be >= 10, passage_words >= 2, min_words and length_bin >= 1")
        if any(not 0 < k <= 1 for k in self.mink_ratios) or not self.mink_ratios:
            raise ConfigError(f"membership: mink_ratios must lie in (0, 1], got {list(self.mink_ratios)}")
        if self.corpus is not None and not (Path(self.corpus) / "manifest.json").is_file():
            raise ConfigError(f"{self.corpus}: not a corpus folder (no manifest.json)")
        if self.shadows is not None and not (Path(self.shadows) / "shadows.json").is_file():
            raise ConfigError(f"{self.shadows}: not a shadow set (no shadows.json)")


def prepare(settings: Settings) -> runner.Prepared:
    """Samples depend on each checkpoint's manifest: built per checkpoint in `run_task`, memoised here."""
    return runner.Prepared(data={"samples": {}, "stats": {}}, notes={"membership_samples": {}})


def _sample_for(unit, prepared, settings: Settings) -> Sample:
    path = unit.checkpoint.path
    if path is None:
        raise CheckpointError(f"{unit.checkpoint.name}: membership needs a checkpoint folder with a manifest")
    memo = prepared.data["samples"]
    if settings.setting == "finetune":
        key = _finetune_key(path)
        if key not in memo:
            pool = _shadow_set(prepared, settings).record["pool"]["ids"] if "lira" in settings.attacks else None
            memo[key] = finetune_sample(path, settings.n_examples, settings.seed, settings.length_bin, within=pool)
        sample, _ = memo[key]
    else:
        from workbench.checkpoints import read_manifest

        m = read_manifest(path) or {}
        window = unit.handle.max_length
        key = ("pretrain", settings.corpus or json.dumps(m.get("corpus"), sort_keys=True), window)
        if key not in memo:
            memo[key] = (pretrain_sample(path, settings.passage_words, settings.min_words, settings.n_examples,
                                         settings.seed, settings.corpus, settings.length_bin,
                                         fits=lambda texts: fits_window(unit.handle, texts)), None)
        sample = memo[key][0]
    info = dict(sample.info)  # the sample is shared by the steps of a run; the epochs are per checkpoint
    if settings.setting == "pretrain":
        info["epochs_seen"] = _epochs(m)
    prepared.notes["membership_samples"][unit.checkpoint.name] = info
    return sample


def fits_window(handle, texts: list[str]) -> np.ndarray:
    """Which texts the LM scorer takes whole: special tokens included, plus one for the start token
    a causal scorer may prepend (`lm_scores`)."""
    enc = handle.tokenizer(texts, add_special_tokens=True)["input_ids"]
    return np.array([len(ids) + 1 <= handle.max_length for ids in enc], dtype=bool)


def _finetune_key(checkpoint) -> tuple[str, str]:
    """The memo key of a fine-tuned checkpoint's (sample, task data) in `prepared.data["samples"]`."""
    return ("finetune", str(checkpoint))


def _shadow_set(prepared, settings: Settings):
    """LiRA's shadow set (`settings.shadows`), loaded once per run and set (finetune: its pool bounds
    the sample; its models give the shadow matrix); its kind must match the setting."""
    from workbench.shadows import ShadowSet

    sets = prepared.data.setdefault("shadow_sets", {})
    if settings.shadows not in sets:
        sets[settings.shadows] = ShadowSet.load(settings.shadows)
    return _of_the_setting(sets[settings.shadows], settings)


def _of_the_setting(sset, settings: Settings):
    """The shadow set, refused when its kind is not the setting's."""
    if sset.kind != settings.setting:
        raise ConfigError(f"{settings.shadows}: a {sset.kind} shadow set; the {settings.setting} setting needs a "
                          f"{settings.setting} one")
    return sset


def shadow_checkpoints(settings: Settings) -> list[Path]:
    """Every checkpoint LiRA may read from the shadow set (the runner's lazy `shadows` role: it
    resolves and hashes them into each unit's resume key, `shadow_matrix` loads them one at a time):
    each model's recorded checkpoint and, for fine-tuned shadows, every step folder of its run
    (`_at_epoch` picks the one at the target's epoch, which depends on the unit)."""
    from workbench.checkpoints import list_steps
    from workbench.shadows import ShadowSet

    sset = _of_the_setting(ShadowSet.load(settings.shadows), settings)
    out = []
    for ck in sset.checkpoints:
        out.append(ck)
        if sset.kind == "finetune":
            out += [step for _, step in list_steps(ck.parent)]
    return out


def _epochs(manifest: dict) -> float | None:
    """Passes over the training split when the checkpoint was saved (tokens seen / train tokens)."""
    seen, total = manifest.get("tokens_seen"), (manifest.get("corpus") or {}).get("train_tokens")
    return round(seen / total, 4) if seen is not None and total else None


def _stats(handle, checkpoint, sample: Sample, prepared, settings: Settings) -> Stats:
    if settings.setting == "finetune":
        _, data = prepared.data["samples"][_finetune_key(checkpoint)]
        return classifier_stats(checkpoint, handle, data, sample, settings.batch_size)
    return lm_stats(handle, sample.texts, settings.batch_size, moments="minkpp" in settings.attacks,
                    progress=settings.progress, electra_head=settings.electra_head)


def _reference_stats(unit, sample: Sample, prepared, settings: Settings) -> Stats:
    """The reference model's statistics on the sample; the model is the runner's `reference` role
    (`settings.reference`, loaded once per run)."""
    h = unit.roles["reference"]
    key = ("reference", h.checkpoint_hash, sample.key)
    if key not in prepared.data["stats"]:
        path = h.path
        if settings.setting == "finetune":
            _, data = finetune_sample(path, settings.n_examples, settings.seed, settings.length_bin)
            prepared.data["stats"][key] = classifier_stats(path, h, data, sample, settings.batch_size)
        else:
            prepared.data["stats"][key] = lm_stats(h, sample.texts, settings.batch_size, moments=False,
                                                   electra_head=settings.electra_head)
    return prepared.data["stats"][key]


def shadow_matrix(sample: Sample, target_path: Path, prepared, settings: Settings, data=None, shadows=None):
    """[n, S] shadow statistics phi and IN/OUT masks from each shadow's own manifest (pretrain: its
    corpus split; finetune: its splits.json, `workbench.finetune.members`); shadows from the
    target's training run are left out. `data`: the task (finetune). `shadows`: the runner's
    `shadows` role (`runner.RoleCheckpoint`s, hashed into the resume key), from which each shadow
    is loaded when it is read and let go after (resolved here the runner's way when not given).
    Returns (phi, in_mask, out_mask, shadow names)."""
    key = ("shadows", settings.shadows, sample.key, str(target_path))
    if key in prepared.data["stats"]:
        return prepared.data["stats"][key]
    if shadows is None:
        shadows = runner.load_roles(PROBE, {"shadows": runner.resolve_roles(PROBE, settings)["shadows"]})["shadows"]
    resolved = {Path(c.path).resolve(): c for c in shadows}
    sset = _shadow_set(prepared, settings)
    target_run = Path(target_path).resolve().parent
    epoch = _finetune_epoch(target_path) if settings.setting == "finetune" else None
    phis, ins, outs, names = [], [], [], []
    for ck in sset.checkpoints:
        if ck.resolve().parent == target_run:
            continue
        if epoch is not None:
            ck = _at_epoch(ck, epoch)
        if ck.resolve() not in resolved:  # the role lists every checkpoint this loop may pick
            raise RuntimeError(f"{ck}: a shadow the runner's shadows role did not resolve (so not in the resume key)")
        h = resolved[ck.resolve()].load()
        if settings.setting == "finetune":
            from workbench.finetune import members

            mem_ids, non_ids = (set(x) for x in members(ck))
            st = classifier_stats(ck, h, data, sample, settings.batch_size)
            phis.append(st.phi)
            ins.append([d in mem_ids for d in sample.doc_ids])
            outs.append([d in non_ids for d in sample.doc_ids])
            names.append(str(ck.relative_to(sset.folder)))
            continue
        corpus, _ = corpus_of(ck)
        train, held = set(corpus.doc_ids("train")), set(corpus.doc_ids("heldout"))
        st = lm_stats(h, sample.texts, settings.batch_size, moments=False, electra_head=settings.electra_head)
        phis.append(st.phi)
        ins.append([d in train for d in sample.doc_ids])
        outs.append([d in held for d in sample.doc_ids])
        names.append(str(ck.relative_to(sset.folder)))
    if len(names) < 2:
        raise ConfigError(f"{settings.shadows}: {len(names)} shadow model(s) besides the target; LiRA needs more")
    out = (np.array(phis).T, np.array(ins).T, np.array(outs).T, names)
    prepared.data["stats"][key] = out
    return out


def target_in_shadow_set(target_path, sset) -> bool:
    """True when the target checkpoint comes from one of the set's own training runs (its folder,
    or an earlier step of it): then every example's IN/OUT shadow counts are tied to its membership."""
    run = Path(target_path).resolve().parent
    return any(ck.resolve().parent == run for ck in sset.checkpoints)


def _finetune_epoch(checkpoint) -> int | None:
    from workbench.checkpoints import read_manifest

    return (read_manifest(checkpoint) or {}).get("epoch")


def _at_epoch(checkpoint: Path, epoch: int) -> Path:
    """A fine-tuned shadow at the target's epoch: the step folder of its seed run saved at that epoch
    (`keep_epoch_checkpoints`, which `use: last` sets), so that a sweep over the target's epochs
    compares it with shadows trained as long; the recorded checkpoint when the run kept none."""
    from workbench.checkpoints import list_steps

    if _finetune_epoch(checkpoint) == epoch:
        return checkpoint
    for _, step in list_steps(Path(checkpoint).parent):
        if _finetune_epoch(step) == epoch:
            return step
    return checkpoint


def attack_scores(sample: Sample, st: Stats, settings: Settings, ref: Stats | None = None,
                  shadows=None) -> dict[str, np.ndarray]:
    """Every requested attack's membership score per example (higher = member)."""
    out: dict[str, np.ndarray] = {}
    for attack in settings.attacks:
        if attack == "loss":
            out["loss"] = ma.loss_score(st.nll)
        elif attack == "zlib":
            out["zlib"] = ma.zlib_score(st.nll, sample.texts)
        elif attack in ("reference_diff", "reference"):  # `reference`: the old name (same score; rows reference_diff)
            out["reference_diff"] = ma.reference_diff_score(st.nll, ref.nll)
        elif attack == "reference_ratio":
            out["reference_ratio"] = ma.reference_ratio_score(st.nll, ref.nll)
        elif attack == "mink":
            for k in settings.mink_ratios:
                out[f"mink_{round(k * 100):d}"] = np.array([ma.mink_score(lp, k) for lp in st.logprobs])
        elif attack == "minkpp":
            for k in settings.mink_ratios:
                out[f"minkpp_{round(k * 100):d}"] = np.array(
                    [ma.minkpp_score(lp, m, s, k) for lp, m, s in zip(st.logprobs, st.mu, st.sigma)])
        elif attack == "lira":
            phi, ins, outs, _ = shadows
            usable = (ins.sum(1) >= 1) & (outs.sum(1) >= 1)
            if not usable.all():
                raise ConfigError(f"{settings.shadows}: {int((~usable).sum())} examples lack an IN or OUT shadow "
                                  f"(the shadow pool must cover the target's examples)")
            if settings.equal_counts:
                ins, outs = ma.equal_shadow_counts(ins, outs, settings.seed)
            out["lira_online"] = ma.lira_online(st.phi, phi, ins, outs, fix_variance=settings.fix_variance)
            out["lira_offline"] = ma.lira_offline(st.phi, phi, ins, outs, fix_variance=settings.fix_variance)
    return out


def _model_rows(unit, task: str, metrics: dict, n: int, ci=None, extra=None) -> pd.DataFrame:
    """A whole-model score (layer NA): `Unit.rows` with one scalar per metric."""
    one = lambda v: np.asarray(v).item()  # noqa: E731
    return unit.rows(task, {k: one(v) for k, v in metrics.items()}, split="test", n=n, extra=extra,
                     ci={k: (one(lo), one(hi)) for k, (lo, hi) in (ci or {}).items()} or None)


def metric_rows(unit, scores: dict[str, np.ndarray], sample: Sample, settings: Settings,
                how: str | None = None) -> list[pd.DataFrame]:
    frames = []
    for attack, s in scores.items():
        r = ma.roc_metrics(s, sample.is_member, n_boot=settings.n_boot, seed=settings.seed, units=sample.doc_ids)
        pts = ma.roc_points(r, settings.max_roc_points)
        base = {"attack": attack, "setting": settings.setting, "n_members": r.n_members, "n_nonmembers": r.n_nonmembers,
                "documents": documents_per_group(sample.doc_ids, sample.is_member), "ci_units": "documents",
                "scored_by": how}
        frames.append(_model_rows(unit, attack, {"auc": [r.auc]}, len(s), ci={"auc": ([r.auc_ci[0]], [r.auc_ci[1]])},
                                  extra={**base, "roc_fpr": [p[0] for p in pts], "roc_tpr": [p[1] for p in pts],
                                         "sign": "higher score = member"}))
        for x, name in ((0.01, "tpr_fpr_1pct"), (0.001, "tpr_fpr_0.1pct")):
            frames.append(_model_rows(unit, attack, {name: [r.tpr_at[x]]}, len(s),
                                      extra={**base, "fpr": x, "fp_allowed": r.fp_allowed[x], "note": r.fpr_note(x)}))
        frames.append(_model_rows(unit, attack, {"balanced_acc": [r.balanced_accuracy]}, len(s),
                                  extra={**base, "threshold": "best on these scores (optimistic)"}))
    return frames


def documents_per_group(doc_ids, is_member) -> dict[str, int]:
    """Distinct documents among the members and among the non-members (what the CIs resample)."""
    docs, y = np.asarray(doc_ids), np.asarray(is_member, dtype=bool)
    return {"members": len(set(docs[y])), "nonmembers": len(set(docs[~y]))}


def layer_probe_rows(unit, sample: Sample, settings: Settings) -> list[pd.DataFrame]:
    """Linear probe per layer on mean-pooled passage vectors, half the documents train, half test
    (`ma.grouped_split`); AUC CIs resample the test documents, with the same resamples for every
    layer (paired); plus the model-free TF-IDF control on the same split (not for the twin: it reads
    no model, so it would repeat the checkpoint's row)."""
    from probes.core.statistics import auc_bootstrap
    from probes.core.fitting import fit_probe

    words = [t.split() for t in sample.texts]
    acts = unit.activations(words, dataset_key=f"membership-{sample.key}", pooling="mean")
    off = np.asarray(acts.sentence_offsets)
    X = np.stack([np.add.reduceat(np.asarray(acts.layers[li]), off[:-1], axis=0) / np.diff(off)[:, None]
                  for li in range(acts.layers.shape[0])]).astype(np.float32)
    y = sample.is_member.astype(np.int64)
    train = ma.grouped_split(sample.doc_ids, y, settings.seed)
    test_docs = np.asarray(sample.doc_ids)[~train]
    res = fit_probe(X[:, train], y[train], num_classes=2, seed=settings.seed, early_stopping=False)
    logp = res.log_proba(X[:, ~train])  # [L, N_test, 2]
    aucs, lo, hi, acc = [], [], [], []
    for li in range(X.shape[0]):
        a, low, high = auc_bootstrap(logp[li, :, 1] - logp[li, :, 0], y[~train], units=test_docs,
                                     n_boot=settings.n_boot, seed=settings.seed)
        aucs.append(a)
        lo.append(low)
        hi.append(high)
        acc.append(float((logp[li].argmax(-1) == y[~train]).mean()))
    extra = {"n_train": int(train.sum()), "pooling": "mean of word means", "split": "by document",
             "documents_train": documents_per_group(np.asarray(sample.doc_ids)[train], y[train] == 1),
             "documents": documents_per_group(test_docs, y[~train] == 1), "ci_units": "documents"}
    frames = [unit.rows("layer_probe", {"auc": aucs, "accuracy": acc}, split="test", n=int((~train).sum()),
                        ci={"auc": (lo, hi)}, extra=extra)]
    if not unit.is_twin:
        scores = ma.tfidf_control_scores(sample.texts, y == 1, train, seed=settings.seed)
        a, low, high = auc_bootstrap(scores, y[~train], units=test_docs, n_boot=settings.n_boot, seed=settings.seed)
        frames.append(_model_rows(unit, CONTROL_TASK, {"auc": [a]}, int((~train).sum()), ci={"auc": ([low], [high])},
                                  extra={**extra, "baseline": "model_free_tfidf",
                                         "what": "TF-IDF + logistic regression on the texts alone (no model)"}))
    return frames


def run_task(unit: runner.Unit, prepared: runner.Prepared, task: str, settings: Settings) -> list[pd.DataFrame]:
    sample = _sample_for(unit, prepared, settings)
    if task == "layers":
        return layer_probe_rows(unit, sample, settings)
    if unit.is_twin and settings.setting == "finetune":
        # the classifier (body + head) is read from the checkpoint folder; a random body under a
        # trained head is no model anyone trained, so the twin is the layer probe's baseline only
        unit.notes["twin_attacks"] = "finetune: attacks not run for random-init twins (layer probe only)"
        unit.log("finetune setting: attacks are not run for the random-init twin")
        return []
    try:
        st = _stats(unit.handle, unit.checkpoint.path, sample, prepared, settings)
    except CheckpointError as e:
        if not unit.is_twin:
            raise
        unit.notes.setdefault("no_lm_head", []).append({"model": unit.model, "why": str(e)})
        unit.log(f"no LM head, attacks skipped for the twin ({e})")
        return []
    ref = _reference_stats(unit, sample, prepared, settings) if set(settings.attacks) & set(REFERENCE_ATTACKS) else None
    shadows = None
    if "lira" in settings.attacks:
        if unit.is_twin:
            settings_twin = [a for a in settings.attacks if a != "lira"]
            unit.log("LiRA is not run for the random-init twin (its shadows would be random models too)")
            import dataclasses

            settings = dataclasses.replace(settings, attacks=tuple(settings_twin))
        else:
            data = (prepared.data["samples"][_finetune_key(unit.checkpoint.path)][1]
                    if settings.setting == "finetune" else None)
            shadows = shadow_matrix(sample, unit.checkpoint.path, prepared, settings, data, unit.roles["shadows"])
            unit.notes.setdefault("lira_shadows", {})[unit.checkpoint.name] = shadows[3]
            if settings.equal_counts is None:  # auto: thin the counts exactly when the design ties them
                import dataclasses

                in_set = target_in_shadow_set(unit.checkpoint.path, _shadow_set(prepared, settings))
                settings = dataclasses.replace(settings, equal_counts=in_set)
                unit.notes.setdefault("lira_equal_counts", {})[unit.checkpoint.name] = in_set
    how = "classifier" if settings.setting == "finetune" else scored_by(unit.handle, settings.electra_head)
    unit.notes.setdefault("lm_score", {})[unit.model] = how
    scores = attack_scores(sample, st, settings, ref, shadows)
    return metric_rows(unit, scores, sample, settings, how)


def _extra(row) -> dict:
    e = row.get("extra")
    return json.loads(e) if isinstance(e, str) else (e if isinstance(e, dict) else {})


def summary(rows: pd.DataFrame) -> str:
    """Per model: the documents behind each group, each attack's AUC [CI over documents] and TPR at
    1% FPR; the layer probe's best layer and the model-free TF-IDF control on the same split."""
    if rows is None or rows.empty:
        return "(no rows)"
    lines = []
    for model, sub in rows.groupby("model", sort=False):
        step = sub["step"].dropna()
        lines.append(f"== {model}" + (f" (step {int(step.iloc[0])})" if len(step) else ""))
        att = sub[sub["layer"].isna() & (sub["task"] != CONTROL_TASK)]
        docs = [_extra(r).get("documents") for _, r in att[att["metric"] == "auc"].iterrows()]
        if docs and docs[0]:
            lines.append(f"attack sample: members from {docs[0]['members']} documents, non-members from "
                         f"{docs[0]['nonmembers']} documents (CIs resample documents)")
        table = [["attack", "AUC", "95% CI", "TPR@1%FPR", "TPR@0.1%FPR", "bal.acc"]]
        for attack, a in att.groupby("task", sort=False):
            get = lambda m, a=a: a[a["metric"] == m]
            auc = get("auc")
            if auc.empty:
                continue
            table.append([attack, f"{auc['value'].iloc[0]:.3f}",
                          f"[{auc['ci_low'].iloc[0]:.3f}, {auc['ci_high'].iloc[0]:.3f}]",
                          f"{get('tpr_fpr_1pct')['value'].iloc[0]:.3f}", f"{get('tpr_fpr_0.1pct')['value'].iloc[0]:.3f}",
                          f"{get('balanced_acc')['value'].iloc[0]:.3f}"])
        if len(table) > 1:
            lines.append(runner.aligned(table))
        lp = sub[(sub["task"] == "layer_probe") & (sub["metric"] == "auc")]
        control = sub[(sub["task"] == CONTROL_TASK) & (sub["metric"] == "auc")]
        if not lp.empty:
            best = lp.loc[lp["value"].idxmax()]
            d = _extra(lp.iloc[0]).get("documents")
            lines.append("layer probe AUC by layer: " + " ".join(f"{v:.3f}" for v in lp.sort_values("layer")["value"])
                         + f" (best layer {int(best['layer'])}; split by document"
                         + (f", test: {d['members']} member / {d['nonmembers']} non-member documents)" if d else ")"))
        for _, c in control.iterrows():
            lines.append(f"model-free TF-IDF control (same split): AUC {c['value']:.3f} "
                         f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}] (a leak of the sample's composition shows here first)")
    return "\n".join(lines)


def _twin_same_for_every_step(settings: Settings) -> bool:
    """Pretraining: the steps of a run share the sample (one corpus split) and the twin runs no LiRA,
    so its rows are the same beside every step. Fine-tuning: kept per epoch (conservative)."""
    return settings.setting == "pretrain"


PROBE = runner.ProbeSpec(name=NAME, tasks=TASKS, settings=Settings, prepare=prepare, run_task=run_task,
                         description="membership inference from manifests: LOSS, zlib, reference, Min-K%, Min-K%++, "
                                     "LiRA; layer-wise membership probe",
                         summary=summary, twin_once_per_run=_twin_same_for_every_step,
                         roles={"reference": runner.Role("reference", used=lambda s: bool(set(s.attacks) & set(REFERENCE_ATTACKS))),
                                "shadows": runner.Role("shadows", many=True, lazy=True, checkpoints=shadow_checkpoints,
                                                       used=lambda s: "lira" in s.attacks)})
