"""What the coreference probes load once per run: GUM documents and GAP frames (`prepare`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from probes.core import runner
from probes.coref.items import Document, gum_documents
from probes.coref.settings import CorefSettings, HEADS_REPORT_SPLIT, HEADS_SELECT_SPLIT, gap_split_roles


@dataclass
class CorefData:
    fit: list[Document] = field(default_factory=list)  # GUM train documents the probes are fitted on
    stop: list[Document] = field(default_factory=list)  # GUM train documents for early stopping
    eval: list[Document] = field(default_factory=list)  # GUM eval-split documents
    heads: dict[str, list[Document]] = field(default_factory=dict)  # attention-heads: GUM dev (select), test (report)
    gap: dict[str, pd.DataFrame] = field(default_factory=dict)  # development / validation / <eval>
    keys: dict[str, str] = field(default_factory=dict)  # activation-cache keys


GUM_TASKS = ("gum-pairs", "gum-entity-type", "attention-heads")
GAP_TASKS = ("gap", "attention-heads", "gap-cloze")


def prepare(settings: CorefSettings) -> runner.Prepared:
    from workbench.data.conllu import load_treebank, read_gum_coref, treebank_path
    from workbench.data.gap import gap_path, read_gap

    s = settings
    data, files, notes = CorefData(), [], {"document_context": {}, "extraction": {}, "items": {}}
    if set(s.tasks) & set(GUM_TASKS):
        needs_train = bool(set(s.tasks) & {"gum-pairs", "gum-entity-type"})
        heads_splits = (HEADS_SELECT_SPLIT, HEADS_REPORT_SPLIT) if "attention-heads" in s.tasks else ()
        splits = list(dict.fromkeys((["train"] if needs_train else []) + [s.eval_split, *heads_splits]))
        docs = {}
        for split in splits:
            sents = load_treebank("en_gum", split)
            mentions, _ = read_gum_coref(sents)
            docs[split] = gum_documents(sents, mentions)
            files.append(treebank_path("en_gum", split))
        data.eval = docs[s.eval_split][: s.max_eval_documents]
        data.heads = {split: docs[split][: s.max_eval_documents] for split in heads_splits}
        data.keys["eval"] = f"en_gum-{s.eval_split}-documents" + (
            f"-first{s.max_eval_documents}" if s.max_eval_documents else "")
        if needs_train:
            train = docs["train"]
            rng = np.random.default_rng([s.seed, 11])
            order = rng.permutation(len(train))
            if s.max_train_documents is not None:
                order = order[: s.max_train_documents]
            n_stop = max(1, int(round(len(order) * s.early_stopping_fraction)))
            data.stop = [train[i] for i in sorted(order[:n_stop])]
            data.fit = [train[i] for i in sorted(order[n_stop:])]
            tag = "" if s.max_train_documents is None else f"-n{len(order)}"
            data.keys["fit"] = f"en_gum-train-documents-fit{tag}-seed{s.seed}-f{s.early_stopping_fraction}"
            data.keys["stop"] = f"en_gum-train-documents-stop{tag}-seed{s.seed}-f{s.early_stopping_fraction}"
        notes["splits"] = {"gum_fit_documents": len(data.fit), "gum_stop_documents": len(data.stop),
                           "gum_eval": s.eval_split, "gum_eval_documents": len(data.eval),
                           **({"attention_heads": {"select": HEADS_SELECT_SPLIT, "report": HEADS_REPORT_SPLIT,
                                                   "documents": {k: len(v) for k, v in data.heads.items()}}}
                              if data.heads else {})}
    if set(s.tasks) & set(GAP_TASKS):
        for split in ("development", "validation", s.gap_eval_split):
            if split not in data.gap:
                frame = read_gap(split)
                data.gap[split] = frame.iloc[: s.max_gap_examples].reset_index(drop=True) if s.max_gap_examples else frame
                files.append(gap_path(split))
        notes.setdefault("splits", {})["gap"] = gap_split_roles(s)
    return runner.Prepared(data=data, files=files, notes=notes)
