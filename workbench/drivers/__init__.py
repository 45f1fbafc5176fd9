"""Drivers: what trains or changes models and writes rows, above the library and below the probes.

- `spec`: the driver contract (`DriverSpec`, identity by field metadata, one YAML loader) and the
  registry; `executor`: the one executor (in-process, `--jobs N`, submitit, Slurm) every driver's
  independent units go through.
- `train` (pretraining, every family's objective), `finetune`, `distill` (task distillation),
  `distill_pretraining` (DistilBERT-style), `shadows` (shadow-model sets for membership inference).
- `prune_sweep` (`bertology prune`: method x amount x seed over a fine-tuned classifier),
  `head_pruning` (head and MLP importance curves), `pretraining_ticket` (lottery tickets found with
  the MLM objective); `peft_sweep` (`bertology peft`: every fine-tuning method of one checkpoint,
  then each layer's CKA to the start).

The library they use (models and running, the store, data, families, objectives, compression
primitives) never imports them (tests/test_import_graph.py).
"""
