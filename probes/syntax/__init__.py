"""Syntax probes over every layer of a list of checkpoints: POS tags, dependency labels and arcs, trees.

`run_syntax_probes(checkpoints, tasks, treebank="en_ewt")` loads a UD treebank, extracts word
vectors of every layer once per checkpoint (`workbench.activations`, cached), fits probes for all
layers at once with the shared fitters (`probes.core.fitting`) and the structural probes
(`probes.syntax.structural`), and writes one run of tidy rows to the results store.

Tasks
- `upos`, `xpos`: one label per word.
- `deprel`: edge probing (Tenney et al. 2019): the relation label of an arc from the head word's
  and the dependent word's vectors, [h_head; h_dep] (`pair_features="concat_product"` adds
  h_head * h_dep). Deliberate difference: Tenney et al. pool spans with learned attention and use an
  MLP; our spans are single words and the probe is the shared linear (or MLP) probe. The root arc
  has no head word: root arcs are counted (`notes.pairs`) and left out.
- `arc`: "is (a, b) an arc?": positives are the gold (head, dependent) pairs (root arcs left out),
  negatives are ordered pairs of the same sentence that are not linked in either direction, sampled
  1:1 per sentence without replacement (seeded); a sentence with fewer unlinked pairs than arcs
  gives what it has and the shortfall is counted.
- `structural-distance`, `structural-depth`: Hewitt & Manning (2019) via `probes.syntax.structural`: UUAS,
  DSpr, root accuracy, NSpr, and the linear-chain (right-branching) UUAS baseline.

Baselines (`baselines=`)
- `control`: Hewitt & Liang (2019) control task through `baselines.control_labels`: each word type gets
  a label drawn from the task's train label distribution; the type is the word form for upos/xpos,
  the DEPENDENT's form for deprel, and the ordered pair (head form, dependent form) for arc (a
  binary control: a probe can pass it only by memorising type pairs; `arc_control="type_pairs"`, our
  analogue). Selectivity = accuracy - control accuracy, with a paired sentence-bootstrap CI.
  `arc_control="hewitt_liang"`: Hewitt & Liang's own edge control (`items.build_edge_control_items`:
  each word type attaches to itself, the first or the last word of its sentence), on control items of
  its own; selectivity is then the paired difference of the two accuracies (`paired_accuracy_difference`)
  and the control rows say `extra.control_task = "hewitt_liang_edges"`.
- `majority`: the most frequent train label, scored on the eval items.
- `random_init`: the same probes on `handle.derive("random_init", ...)` (same class and config, fresh
  weights, same tokenizer).

Splits. Probes are fitted on `train_split` and scored on `eval_split`; early stopping uses a
held-out fraction of the TRAIN sentences (`early_stopping_fraction`, seeded), never the eval split.
A treebank without the requested splits is resolved: es_gsd (dev + test only) trains on dev and
evaluates on test; PUD (test only) and any `train_split == eval_split` are split by sentence
(seeded, `holdout_fraction` for eval). What was used is in the manifest (`notes.splits`).

Rows (`workbench.store.results.RESULT_COLUMNS`): probe="syntax", task in TASKS, split = the eval split
(scalar-mix rows: "<train_split>:stop", the stopping set they are scored on), stack, layer (0 =
embeddings), model = checkpoint name ("<name> (random init)" for the twin, extra.baseline =
"random_init"), family/seed/step from the checkpoint's manifest.json (None without one), n = eval
items (words, arcs, pairs, gold edges or sentences), ci_low/ci_high = 95% percentile bootstrap over
sentences. Metrics:
- classification tasks: accuracy, train_accuracy, control_accuracy, selectivity, majority (and with
  `probe="mlp"` the same names prefixed "mlp_"); MDL tasks (Voita & Titov 2020): mdl_codelength
  (bits), compression (with `mdl_probe="mlp"`, the MLP probe of their headline numbers, prefixed
  "mlp_"); scalar-mix tasks (Peters et al. 2018; Tenney et al. 2019): per layer scalar_mix_weight
  and cumulative_accuracy (mix of layers 0..l), and with layer=None centre_of_gravity,
  expected_layer, scalar_mix_accuracy;
- structural-distance: uuas, dspr, right_branching_uuas; structural-depth: root_acc, nspr.
Data-only baselines (majority, right_branching_uuas) are written for each real checkpoint, not for
twins. Baseline rows say so in their data (`baselines.mark_baselines`): extra.baseline = "majority",
"control" or "right_branching" and extra.baseline_for = the metric they are a reference for. `extra` holds treebank, train split, pooling, probe seed, n_train and the classifier kind;
accuracy rows also the accuracy on each bootstrap resample (`boot`, the same resamples for every
layer), from which `probes.core.depth` gives CIs of the expected and peak layer.

The run manifest holds the config, seeds, the treebank files with checksums, the checkpoints with
hashes (twins: `notes.random_init_twins`), the extraction counts per model and split
(`notes.extraction`: windowed sentences, windows, words cut by a window, empty sentences, words
mapped to no subword), pair counts (`notes.pairs`) and per-stage timings (`notes.timings_s`).

Resuming: each finished (model, stack, task) is saved under `<runs root>/partials/` as it
completes (`workbench.store.results.FinishedUnits`); rerunning the same command after a crash or Ctrl-C
reuses those units (listed in `notes.reused_units`) and extracts nothing new (activation cache), so
only the missing work is done. The saved units are removed when the run is published.

The package, one concern per module: `settings` (tasks, baselines, `SyntaxSettings`), `prepare`
(the treebank splits, loaded once per run), `items` (per-word and per-pair task items), `features`
(lazy per-layer feature views), `tasks` (the classification and structural probes on one model),
`structural` (Hewitt & Manning's distance and depth probes), `summary` (the printed table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from probes.core import runner
from probes.syntax.features import FeatureView, sentence_rows
from probes.syntax.items import build_items
from probes.syntax.prepare import plan_splits, prepare
from probes.syntax.settings import BASELINES, NAME, STRUCTURAL_TASKS, TASKS, SyntaxSettings
from probes.syntax.summary import format_layer_table, summary_frame
from probes.syntax.tasks import fit_classification_task, make_context, length_averaged_ci, fit_structural_task
from workbench.errors import ConfigError

__all__ = ["NAME", "TASKS", "BASELINES", "SyntaxSettings", "prepare", "plan_splits", "run_task", "run_syntax_probes",
           "format_layer_table", "syntax_cli_main", "PROBE", "FeatureView", "sentence_rows", "build_items",
           "length_averaged_ci", "ConfigError"]


def run_task(unit, prepared: runner.Prepared, task: str, settings: SyntaxSettings) -> list[pd.DataFrame]:
    ctx = make_context(unit, prepared, settings)
    return fit_structural_task(ctx, task) if task in STRUCTURAL_TASKS else fit_classification_task(ctx, task)


# --------------------------------------------------------------------------- public entry point
def run_syntax_probes(checkpoints: Sequence[str | Path | Any], tasks: Sequence[str] = TASKS, store=None,
                      **settings: Any) -> tuple[str, pd.DataFrame]:
    """Fit the syntax probes on every layer of every checkpoint; one run in the results store.

    checkpoints: checkpoint folders, training folders (every saved step), Hub names in the local
    cache, or open model handles. `settings` are SyntaxSettings fields (`probe=` is accepted for
    `classifier=`, the probe kind). Returns (run_id, rows). See the module docstring.
    """
    if "probe" in settings:
        settings["classifier"] = settings.pop("probe")
    settings["tasks"] = tasks
    return runner.run_probe(PROBE, checkpoints, settings, store=store)



# --------------------------------------------------------------------------- CLI
def _cli_hook(parser):
    """The syntax CLI's two shorthands: `--probe` for `--classifier`, `--structural-epochs N`."""
    parser.add_argument("--probe", default=None, help="alias of --classifier (linear | mlp | linear,mlp)")
    parser.add_argument("--structural-epochs", type=int, default=None, help="structural probe epochs (default 30)")

    def apply(args, values: dict) -> None:
        if args.probe is not None:
            values["classifier"] = args.probe
        if args.structural_epochs is not None:
            values["structural"] = dict(values.get("structural") or {}, epochs=args.structural_epochs)

    return apply


PROBE = runner.ProbeSpec(
    name=NAME, tasks=TASKS, settings=SyntaxSettings, prepare=prepare, run_task=run_task,
    description="Syntax probes (UPOS, XPOS, deprel, arc, structural) on every layer.",
    summary=format_layer_table, summary_frame=summary_frame, cli_hook=_cli_hook, twin_once_per_run=True,
    # 3: structural lr_decay 0.1; 4: the default fit of issue 42 (optimizer auto: Adam above 2^21 words x
    # features, lr 5e-3, batch 128, early stopping on the dev loss), which moves large real-model fits;
    # 5: issue 49: L-BFGS runs to its tolerances (small fits, MDL blocks), the structural probe standardised;
    # 6: issue 49: the linear Adam fit ends with up to 300 L-BFGS iterations kept by dev accuracy (`polish`)
    version=6,
)


def syntax_cli_main(argv: Sequence[str] | None = None) -> int:
    """`bertology probe syntax ...` (0 on success, 2 with one line on stderr for bad input)."""
    from workbench.errors import cli_errors

    return cli_errors(lambda: runner.cli_main(NAME, argv), "bertology probe syntax")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(syntax_cli_main())
