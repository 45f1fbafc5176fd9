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
  non-members every other example of the task (`workbench.drivers.finetune.members`).
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

Per-example likelihood with each family's own head (`workbench.running.lm_scores`): causal NLL (GPT), forward +
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
`lira` needs a shadow set (`workbench.drivers.shadows`): the target's examples are looked up in each
shadow model's own manifest (IN = its train split, OUT = its held-out split; fine-tuned shadows:
IN = the examples it trained on, OUT = the rest of its splits.json); shadows from the target's own
training run are left out (per unit); the shadows are the runner's lazy `shadows` role
(`shadow_checkpoints`: every checkpoint LiRA may read, hashed into each unit's resume key, so a
retrained shadow re-runs the unit; loaded one at a time when read); a fine-tuned target is compared with each shadow at the target's epoch
(its step folder of that epoch, where kept). Fine-tuning setting: members and non-members are drawn from the shadow
set's pool only (dev/test and unsampled examples have no IN shadow); phi = Carlini et al.'s
logit-scaled confidence on the true label, z_y - logsumexp(z_other).

The package, one concern per module: `settings` (attacks, `Settings`), `samples` (ground truth and
the length-matched sample), `scores` (per-example likelihoods and confidences), `attacks` (the
attacks' scores and ROC metrics), `tasks` (`run_task`: the attacks with their reference model and
shadows, the layer probe, their rows; the registry's `PROBE`), `summary` (the printed table).
"""

from __future__ import annotations

from probes.membership.samples import (Sample, check_disjoint, corpus_of, finetune_sample, passages,
                                       pretrain_sample)
from probes.membership.scores import Stats, classifier_stats, lm_stats, scored_by
from probes.membership.settings import ATTACKS, CONTROL_TASK, LM_ONLY, REFERENCE_ATTACKS, SETTINGS_KINDS, Settings
from probes.membership.summary import summary
from probes.membership.tasks import (NAME, PROBE, TASKS, attack_scores, documents_per_group, fits_window,
                                     layer_probe_rows, loaded_shadow_set, metric_rows, prepare, reference_stats,
                                     run_task, shadow_checkpoints, shadow_matrix, target_in_shadow_set)

__all__ = ["NAME", "TASKS", "SETTINGS_KINDS", "ATTACKS", "CONTROL_TASK", "REFERENCE_ATTACKS", "LM_ONLY", "Settings",
           "prepare", "run_task", "summary", "PROBE", "Sample", "check_disjoint", "passages", "corpus_of",
           "pretrain_sample", "finetune_sample", "Stats", "scored_by", "lm_stats", "classifier_stats", "fits_window",
           "shadow_checkpoints", "shadow_matrix", "target_in_shadow_set", "attack_scores", "metric_rows",
           "documents_per_group", "layer_probe_rows", "reference_stats", "loaded_shadow_set"]
