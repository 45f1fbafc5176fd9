"""oLMpics-style cloze probes (Talmor et al. 2020): what the pretraining objective teaches, zero-shot
and layer by layer.

For each task of `probes.cloze.tasks` (age, always-never, antonym, objects, taxonomy, multihop) and
each model, on the test split:

- zero-shot multiple choice with the family's own head (`workbench.running.lm_scores`: MC-MLM at the mask
  for masked LMs, PLL when a candidate is several pieces, flagged in `extra.methods`; the filled
  sentence's log-likelihood for causal LMs and ELMo; sentinel / infilling targets for T5 / BART;
  ELECTRA through its generator): `zero_shot_acc` with a bootstrap CI over items, next to
  `majority_acc` (the train split's most frequent answer) and `random_acc` (1 / number of choices),
  and `nonsense_acc`, the same items with nonsense words in place of the content words (the
  language control: a model that reads the content falls to chance there); with `scoring`
  including a calibrated rule, the same by that rule (`probes.cloze.scoring`): "contextual"
  (`zero_shot_contextual_acc`, ..., `lens_contextual_acc` per layer), each candidate's score minus
  its score in the content-free template (Zhao et al. 2021; called "pmi" before issue 49), and
  "pmi_dc" (`zero_shot_pmi_dc_acc`, ...), domain-conditional PMI (Holtzman et al. 2021): the
  answer's tokens after the item and the task's domain premise, minus after the premise alone;
- the logit lens (nostalgebraist 2020; Geva et al. 2022 read the FFN updates the same way): the
  model's own output head applied to every layer's hidden states (`lm_scores.layer_head`), scored
  exactly like the zero-shot rule, so `lens_acc` at the last layer equals `zero_shot_acc` (tested
  for every family). Per family: BERT-style masked LMs the MLM transform + decoder (ELECTRA: its
  generator's layers); GPT the final layer norm + unembedding; T5 and BART the DECODER's layers at
  the answer positions (T5: the decoder's final layer norm + rescaled `lm_head`; BART, post-LN with
  no final norm: `lm_head` + `final_logits_bias`), rows with stack `decoder`; no lens on a
  seq2seq encoder, whose states never meet the head (the decoder reads them through
  cross-attention); ELMo the shared softmax on each layer's forward and backward halves (layer 0:
  the token encoder's output, the same vector for both directions); with the language control,
  the lens on the nonsense items as well (`lens_nonsense_acc`) and the paired per-item gap
  (`lens_nonsense_gap`, CI over items), so a layer that reads the content can be told from one that
  prefers a candidate word;
- a linear probe on the blank's vector at every layer (`probes.core.fitting.fit_probe`, batched over
  layers; the blank is written as the tokenizer's mask token, T5's first sentinel, or "_"; causal
  stacks read the last word, the only one that has seen the whole sentence): `probe_acc` with its
  CI, Hewitt & Liang (2019) `control_acc` (labels drawn per lexical item, `key`) and
  `selectivity`; tasks with fixed choices only (taxonomy's choices change per item);
- optionally (`curve_sizes`), learning curves (the paper's protocol): the MC head fine-tuned on 62,
  125, ... training items with several seeds; stored per size and seed (`curve_acc`) with each
  seed's weighted score (`weighted_score`, see `weighted_score`); the mean, standard deviation and
  maximum over seeds are computed when read (`summary.curve_stats`, `workbench.store.aggregate`).

Differences from the paper: see `probes.cloze.tasks` for the data; the paper's
MC-MLM fine-tunes RoBERTa/BERT-large for a fixed number of epochs with model selection on dev;
here every size gets the same number of updates (`curve_steps`, batches sampled with replacement
from the N items), evaluated at the end on test (no model selection), so curves of different
sizes compare the data, not the compute.

The random-init twin's LM head is random, so its zero-shot accuracy is the chance reference of the
architecture (an ELECTRA twin has no generator: zero-shot rows are skipped for it, with a note).

The package, one concern per module: `tasks` (the items of each task), `settings` (`Settings`),
`prepare` (the items, loaded once per run), `scoring` (zero-shot and the logit lens), `finetune`
(the MC head and its fine-tuning for the learning curves), `blank` (the blank probe's words),
`rows` (`run_task`: the rows of one model and task), `summary` (the printed table).
"""

from __future__ import annotations

from probes.cloze.blank import blank_word, probe_words
from probes.cloze.finetune import MCHead, finetune_mc, weighted_score
from probes.cloze.prepare import prepare
from probes.cloze.rows import run_task
from probes.cloze.scoring import (SCORING, accuracy_ci, calibrated, content_free_word, contexts_of, lens_correct,
                                  lens_scores, metric_name, reference_scores, zero_shot)
from probes.cloze.settings import FIXED_CHOICE_TASKS, PAPER_SIZES, TASKS, Settings
from probes.cloze.summary import lens_layer_table, summary
from probes.core import runner

__all__ = ["NAME", "TASKS", "FIXED_CHOICE_TASKS", "PAPER_SIZES", "Settings", "prepare", "run_task", "summary", "PROBE",
           "zero_shot", "accuracy_ci", "contexts_of", "lens_scores", "lens_correct", "lens_layer_table", "MCHead",
           "finetune_mc", "weighted_score", "blank_word", "probe_words", "SCORING", "calibrated", "reference_scores",
           "content_free_word", "metric_name"]

NAME = "cloze"


PROBE = runner.ProbeSpec(name=NAME, tasks=TASKS, settings=Settings, prepare=prepare, run_task=run_task,
                         description="oLMpics cloze (Talmor et al. 2020): zero-shot with the model's own head, "
                                     "logit lens, blank probe, learning curves",
                         summary=summary, twin_once_per_run=True,
                         version=4)  # 2: the blank probe's default fit of issue 42 (auto by words x features);
                                     # 3: issue 49's scoring rules (pmi -> contextual, pmi_dc; no [MASK]-slot PLL);
                                     # 4: the linear Adam fit's L-BFGS polish (issue 49, `ProbeConfig.polish`)
