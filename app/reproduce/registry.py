"""The registry of reproduction rows: every row the command knows, by key, and the findings listed as
not comparable here with their reasons. The rows live by what they run on: `rows` (encoders, the
cost row, and what the rows share: the context, citations, model names), `rows_lm` (causal LMs),
`rows_full` (the long `--full` rows); this module only gathers them, so none of them imports another's
registry.
"""

from __future__ import annotations

from functools import lru_cache

from app.reproduce import rows, rows_full, rows_lm
from app.reproduce.spec import NotComparable, Row, build_registry

NOT_COMPARABLE_HERE = [
    NotComparable("srl", "SRL is decoded late (Tenney et al. 2019)", "Tenney et al. 2019",
                  "no semantic role labelling data in the data root"),
    NotComparable("ner_en", "English NER edge probing (Tenney et al. 2019)", "Tenney et al. 2019",
                  "no English NER corpus here (CoNLL-2002 is Spanish and Dutch)"),
    NotComparable("ptb_full", "structural probe on the full PTB (Hewitt & Manning 2019)", "Hewitt & Manning 2019",
                  "the Penn Treebank is licensed and not in the data root; EWT stands in"),
    NotComparable("glue", "GLUE dev scores of the pruned and distilled models", "Michel et al. 2019; Sanh et al. 2019",
                  "no GLUE data here; sentence polarity stands in for SST-2"),
    NotComparable("muse_p1", "MUSE bilingual lexicon induction P@1 (Conneau et al. 2018)", "Conneau et al. 2018",
                  "no multilingual pretrained model and no MUSE dictionary here"),
]


def all_rows() -> list[Row]:
    """The rows in the table's order: the encoder and cost rows, the causal-LM rows, the --full rows."""
    return rows.rows() + rows_lm.lm_rows() + rows_full.full_rows()


@lru_cache(maxsize=1)
def registry() -> dict[str, Row]:
    return build_registry(all_rows())
