"""Coreference probes: GUM mention pairs and entity types, GAP, coreference heads, GAP gender cloze.

Tenney et al. (2019, "BERT rediscovers the classical NLP pipeline") decode coreference late in
depth, after POS and dependencies; Clark et al. (2019, "What does BERT look at?") find single
attention heads that track it. These tasks check both on any checkpoint, layer by layer and head
by head. Documents, not sentences, are the unit: coreference crosses sentences, so a GUM document
or a GAP snippet is read as ONE word sequence in windows of the model's length, half a window
apart, each word taken from the window where it is most central (`ModelHandle.word_states`);
`notes.document_context` says how many words saw fewer than N words of left context.

Tasks
- `gum-pairs` (edge probing, Tenney et al. 2019; mention pairs as in mention-pair coreference
  models): GUM gold mentions and chains (train -> dev). A mention's vector at layer l is the mean
  of its words' vectors and its head word's vector (`span`: mean+head | mean | head); a pair is a
  mention and each of the `k` mentions before it in its document (default 20), label = same chain;
  pair features [a; b; a*b]; the shared linear probe for all layers at once. Metrics: accuracy,
  f1 (positive class), auc (ROC), antecedent_accuracy (the best-scoring earlier mention is in the
  chain, over mentions that have one in their window). Training pairs: all candidates of randomly
  drawn anaphors (seeded) up to `max_train_pairs`, so the label prior of train and dev agree.
- `gum-entity-type`: the entity type of a mention (person, place, organization, abstract, event,
  object, time, substance, plant, animal) from its span vector.
- `gap` (Webster et al. 2018): pronoun -> A, B or neither from [p; a; b; p*a; p*b] (pronoun and
  the two name spans, mean over words); trained on gap-development, early-stopped on
  gap-validation, scored on gap-test with the paper's scorer (`probes.coref.gap_scorer`): f1, f1_masculine,
  f1_feminine, bias (F/M). Every layer's predictions are written in GAP's submission format under
  `gap_predictions_dir` (listed in `notes.gap_predictions`). The paper's best surface baseline,
  Parallelism, scored 66.9 overall F1 on the snippet-context test set (extra.paper_parallelism_f1).
- `attention-heads` (Clark et al. 2019): for every layer x head on GUM test, how often a
  coreferent mention's head word attends most to the head word of one of its antecedents, with
  [CLS]/[SEP] kept in the row (heads_strict: Clark et al.'s criterion), the same with special
  tokens dropped (heads_head_word), and to any word of an antecedent with special tokens dropped
  (heads_all, lenient; per mention type heads_pronoun/_proper/_nominal); how often the GAP
  pronoun gives more attention to the right name (heads_gap); rows with extra.head. Best heads
  are held out: chosen on GUM dev (GAP validation) and reported on GUM test (GAP test):
  best_head_accuracy (the headline, Clark et al.'s criterion; per mention type
  best_head_accuracy_<type>), best_head_accuracy_head_word, best_head_accuracy_lenient,
  best_head_gap, per layer (extra.best_head, chosen_on, chosen_value) and `<metric>_overall` (the
  best layer x head, no layer). Clark et al. report on CoNLL-2012 with BERT-base: best head 65%
  (5-4, chosen on the data it is scored on), nearest mention 27%, head-word match 52%.
- `gap-cloze`: with the model's own LM head, the pronoun of each GAP test snippet is masked and
  he/his/him are compared with she/her (log-sum-exp per gender): the share of snippets where the
  model prefers the feminine forms, per gold gender (a bias view). Models without an LM head give
  no rows (noted).

Baselines (`baselines=`): majority, control (Hewitt & Liang 2019: labels drawn per type, the type
being the head word(s)), rules (string match, head-word match, nearest mention; for GAP nearest
name and a subject-name rule, see `probes.coref.items`), random_init (the runner's twin).
Confidence intervals: 95% percentile bootstrap over documents (GUM) or examples (GAP), every metric
(AUC included) on the same `n_boot` resamples (`probes.core.statistics`).

The package, one concern per module: `settings` (tasks, baselines, `CorefSettings`), `prepare`
(GUM documents and GAP frames, loaded once per run), `features` (lazy span and pair views),
`metrics` (pair and GAP metrics with CIs), `tasks` (one function per task, `run_task`), `summary`
(the printed table); the data items, attention statistics and GAP's scorer in `items`,
`attention` and `gap_scorer`.
"""

from __future__ import annotations

from probes.core import runner
from probes.coref.features import PairView, SpanView
from probes.coref.items import mention_pairs
from probes.coref.metrics import binary_scores, gap_scores_ci, pair_metrics
from probes.coref.prepare import CorefData, prepare
from probes.coref.settings import (BASELINES, GAP_LABELS, HEAD_CRITERIA, MENTION_TYPES, SPANS, TASKS,
                                   CorefSettings)
from probes.coref.summary import format_summary
from probes.coref.tasks import (best_head_rows, choose_heads, gap_heads_select_split, pair_probe, run_task,
                                sample_anaphors, subset_pairs)

__all__ = ["NAME", "TASKS", "BASELINES", "SPANS", "GAP_LABELS", "MENTION_TYPES", "HEAD_CRITERIA", "CorefSettings",
           "CorefData", "prepare", "run_task", "format_summary", "PROBE", "SpanView", "PairView", "binary_scores",
           "pair_metrics", "gap_scores_ci", "mention_pairs", "pair_probe", "sample_anaphors", "subset_pairs",
           "choose_heads", "best_head_rows", "gap_heads_select_split"]

NAME = "coref"

PROBE = runner.ProbeSpec(
    name=NAME, tasks=TASKS, settings=CorefSettings, prepare=prepare, run_task=run_task,
    description="Coreference: GUM mention pairs and entity types, GAP, coreference heads, GAP gender cloze.",
    summary=format_summary, twin_once_per_run=True,
    # 2: held-out best heads (chosen on dev), Clark et al.'s criterion as the headline, AUC CIs on n_boot;
    # 3: the default probe fit of issue 42 (optimizer auto by words x features, linear Adam batch 128,
    # stopping on the dev loss); 4: GAP reported on validation stops on held-out development rows,
    # no longer on validation itself (issue 49)
    # 5: L-BFGS fits run to torch's tolerances, not to its evaluation budget (issue 49)
    # 6: the linear Adam fit ends with up to 300 L-BFGS iterations kept by dev accuracy (`polish`, issue 49)
    version=6,
)
