"""Loading and running models, one way.

- `models` (`ModelHandle`, the facade), `model_loading` (the one loader: `load_weights` is the only
  read of model weights in the workbench; every head type, lineage, PEFT re-attachment through
  `peft_methods`, each family's pretraining module), `classifier_loading` (fine-tuning's
  classifiers, fresh head or saved) over `classifier_heads`, `handle_running`.
- `runner` (`ModelRunner`: TransformerLens-style named activation points, the activation cache and
  edits) and `sites` (where each family's heads and MLPs live).
- What reads through the runner: `word_alignment` and `word_pooling` (subwords to words),
  `lm_inputs` and `lm_scores` (LM scoring), `logit_lens`, `generate`.
"""

from workbench.running.runner import ActivationCache, ModelRunner, Run, stack_names  # noqa: F401
