"""Ground truth from manifests: members and non-members of a checkpoint, length-matched (`Sample`)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from probes.membership import attacks as ma
from workbench.errors import CheckpointError, ConfigError


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
    from workbench.store.checkpoints import read_manifest
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
    from workbench.store.checkpoints import read_manifest
    from workbench.drivers.finetune import load_finetune_config, load_task, members

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
