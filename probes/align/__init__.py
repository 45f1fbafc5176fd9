"""Cross-lingual and cross-model alignment, layer by layer: where do two spaces line up?

Mikolov et al. (2013) mapped one language's word vectors onto another's with a linear map; with an
orthogonality constraint the map is orthogonal Procrustes (Xing et al. 2015), and Artetxe et al.
(2017) bootstrapped it from shared numerals alone. This probe asks that of every layer of contextual
models, and reuses the machinery to compare any two models. The maths is `workbench.geometry`;
where the vectors come from is `probes.align.reps`; corpora, dictionaries and seeds are data named
in the settings, so a new language pair is a config (`--src-corpus columns:nltk/conll2002/ned.train
--dictionary swadesh:en-nl` for English-Dutch).

Tasks (`bertology probe align --tasks ...`)
- `bli`: bilingual lexicon induction from type-level anchors (a word's contextual vectors averaged
  over its occurrences; Schuster et al. 2019) of `src_corpus` (through the checkpoint) and
  `tgt_corpus` (through `target_checkpoint`, or the same model when empty). Per layer: P@1/5/10 on
  the held-out part of `dictionary` after a Procrustes map fitted on the rest (CSLS retrieval,
  Conneau et al. 2018), P@1 by cosine, P@1 from the unsupervised seed (`seed_dictionary`, default the
  shared numerals) refined by self-learning, P@1 with no map (same model only) and after a random
  rotation (baseline). Layer 0 also gets the static input-embedding rows (`static_` metrics).
- `fake-language`: the same on a bilingual model trained on English plus Fake-English
  (`workbench.data.fake_language`, K et al. 2020): the target side is the source text shifted into
  the disjoint alphabet, so the dictionary is exact (word <-> shifted word). With
  `target_checkpoint` and `--no-shift-target` the target side is another model reading the same
  English: a separately trained model, the "two monolingual models" comparison.
- `parallel`: sentence retrieval between the `parallel_src`/`parallel_tgt` treebanks paired by
  `sent_id` (UD PUD English/Spanish), mean-pooled per layer, before a map (same model only), after a
  Procrustes map fitted on `parallel_train_fraction` of the pairs and after a random rotation, on
  the other pairs; plus word alignment inside test sentence pairs where the lemmas match a
  `dictionary` entry (a word map fitted on the train sentences' matches).
- `model-pair`: the same word tokens (`pair_corpus`) through every checkpoint (and twin); the `finish`
  hook writes, for every pair of models, the i x j matrices of linear CKA (Kornblith et al. 2019) and
  of retrieval accuracy after Procrustes (fitted on half of the tokens, tested on the other half) and
  after a random rotation. Each unit also writes CKA between each layer and its own layer 0.
- `diachronic`: type vectors from `old_corpus` (Brown, 1961) and `new_corpus` (WikiText-2 + EWT)
  through the same model, aligned on the `anchors` most frequent shared words (Hamilton et al. 2016
  align whole vocabularies; frequent words are the stable ones); displacement = 1 - cos. Controls:
  the split-half displacement of each word inside the old corpus (sampling noise of an average of
  few occurrences) between two seeded halves of its documents (whole documents on each side, the
  independent unit; sentences only for a corpus that records no documents), rescaled to the
  old-vs-new occurrence counts (`noise_floor`), and a regression
  on log frequency (Hamilton et al.'s law of conformity); the most-moved words rank by displacement
  minus that noise floor.

Baselines: `random_init` (the runner's twin; for `bli`/`parallel` with a `target_checkpoint`, the
target model's twin too, seed + 1; the target model is the runner's `target` role, loaded once per run) and `random_rotation` (a Haar-random orthogonal map in place of the
learned one). Rows: probe="align", n = test words/sentences/tokens, CI = 95% percentile bootstrap
over test items for P@1 and retrieval accuracy.

The package, one concern per module: `settings` (tasks, `Settings`, the corpus-spec check and the
small helpers the tasks share), `prepare` (corpora, dictionaries and parallel pairs, loaded once per
run), `tasks` (one function per task, and `model_pair_matrices`: the model x model matrices), `summary` (the
printed tables); where vectors come from in `reps`, the `split:` community corpora in `communities`.
Here: the task table, `run_task` and `PROBE`.
"""

from __future__ import annotations

import pandas as pd

from probes.align import communities, reps
from probes.align.prepare import parallel_pairs, prepare
from probes.align.settings import KS, NAME, TASKS, Settings
from probes.align.summary import summary
from probes.align.tasks import (bli_task, diachronic_task, fake_language_task, model_pair_matrices, model_pair_task,
                                parallel_task, permutation_displacements, split_half_mask, word_displacement)
from probes.core import runner

__all__ = ["NAME", "TASKS", "KS", "Settings", "prepare", "run_task", "summary", "PROBE", "communities", "reps",
           "parallel_pairs", "model_pair_matrices", "word_displacement", "permutation_displacements", "split_half_mask"]


# --------------------------------------------------------------------------- entry points


_TASK_FUNCS = {"bli": bli_task, "fake-language": fake_language_task, "parallel": parallel_task,
               "model-pair": model_pair_task, "diachronic": diachronic_task}


def run_task(unit: runner.Unit, prepared: runner.Prepared, task: str, settings: Settings) -> list[pd.DataFrame]:
    return _TASK_FUNCS[task](unit, prepared, settings)


PROBE = runner.ProbeSpec(
    name=NAME, tasks=TASKS, settings=Settings, prepare=prepare, run_task=run_task, finish=model_pair_matrices, summary=summary,
    default_tasks=("bli",), roles={"target": runner.Role("target_checkpoint")},
    description="Cross-lingual and cross-model alignment per layer: Procrustes, CSLS, BLI, CKA (Conneau et al. 2018; "
                "Kornblith et al. 2019).",
)
