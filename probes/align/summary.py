"""The alignment run's printed summary (`summary`): layer tables, model x model matrices, most-moved words."""

from __future__ import annotations

import numpy as np
import pandas as pd

from probes.core import runner
from probes.core.rows import probe_schema
from workbench.store.results import decode_extra

# The `extra` of the align probe's rows (`probes.align.tasks`; checked when written, `workbench.store.rowschema`).
EXTRA_SCHEMA = probe_schema("align", optional={
    "target_model": str, "target_layers": list, "dictionary_pairs": int, "src_vocab": int, "tgt_vocab": int,
    "retrieval": str, "train_pairs": int, "test_words": int, "seed_pairs": int, "induced_pairs": list,
    "representation": str, "chance": float, "word_train_pairs": int, "corpus": str, "other_model": str,
    "other_stack": str | None, "other_layer": int, "old_corpus": str, "new_corpus": str, "words": int, "anchors": int,
    "split_half_words": int, "split_half_unit": str, "split_half_sizes": list, "permutations": int, "documents": list,
    "top_moved": list})


def summary(rows: pd.DataFrame) -> str:
    """Per-layer tables for bli/fake-language/parallel/diachronic, i x j matrices for model pairs,
    and the most-moved words."""
    if rows is None or len(rows) == 0:
        return "(no rows)"
    extra = [decode_extra(e) for e in rows["extra"]]
    is_matrix = np.array(["other_model" in e for e in extra], dtype=bool)
    out = [runner.format_layer_table(rows[~is_matrix], max_metrics=10)] if (~is_matrix).any() else []
    mat = pd.DataFrame([(str(m), str(e["other_model"]), str(met), int(l), int(e["other_layer"]), float(v))
                        for m, e, met, l, v in zip(rows["model"], extra, rows["metric"], rows["layer"], rows["value"])
                        if "other_model" in e], columns=["model", "other", "metric", "i", "j", "value"])
    for (a, b, metric), sub in mat.groupby(["model", "other", "metric"], sort=False):
        M = sub.pivot_table(index="i", columns="j", values="value")
        table = [[f"{metric}: {a} (rows) x {b}"] + [str(j) for j in M.columns]]
        table += [[str(int(i))] + [f"{v:.2f}" for v in M.loc[i]] for i in M.index]
        out.append(runner.aligned(table))
    for e, (_, r) in zip(extra, rows.iterrows()):
        if "top_moved" in e:
            if "permutations" in e:  # ranked by z against random document splits
                words = ", ".join(f"{w['word']} (z {w['z']:.1f}, p {w['p_perm']:.3f}, n {w['count_old']}/{w['count_new']})"
                                  for w in e["top_moved"])
                out.append(f"most moved, {r['model']} layer {int(r['layer'])} (z against {e['permutations']} document "
                           f"permutations, counts old/new): {words}")
                continue
            words = ", ".join(f"{w['word']} ({w['displacement']:.2f}/{w['noise_floor']:.2f})" for w in e["top_moved"])
            out.append(f"most moved, {r['model']} layer {int(r['layer'])} (displacement/noise floor): {words}")
    return "\n\n".join(out)
