"""The reproduction rows: each a paper's headline finding, its source quoted (`citations.yaml`
beside this file), our nearest measurement, and the test that decides the verdict.

Models. A real row names the Hub models it needs (in the local Hugging Face cache:
`shared/tools/install-pretrained`): all-mpnet-base-v2 has BERT-base's shape (12 layers x 12 heads x
768), SmolLM2-135M-Instruct is a causal LM (30 layers). `--quick` runs every row's code path on tiny
models trained here in a minute (`quick_models`), so a verdict there says nothing about the paper: it
checks the machinery.

Each measure function reads the results store through the probes' own runs (`run_probe`, cached:
a second call re-reads), so a row's numbers are the rows any `bertology probe` command writes.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from app.reproduce.spec import (AllOf, Citation, InRange, IntervalsAbove, Measurement, NotComparable, PaperValue, Row,
                                WithinTolerance, build_registry)
from workbench.errors import ConfigError

CITATIONS_FILE = Path(__file__).with_name("citations.yaml")
MPNET = "sentence-transformers/all-mpnet-base-v2"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"


@lru_cache(maxsize=1)
def citations() -> dict[str, dict]:
    """The quoted sources, by key (`citations.yaml`: paper, where, value, quote, verified, source, note)."""
    entries = yaml.safe_load(CITATIONS_FILE.read_text()) or []
    return {e["key"]: e for e in entries}


def cited_value(key: str, field: str | None = None, scale: float = 1.0) -> float | None:
    """A citations.yaml entry's number (`field` of a table row recorded as a mapping), times `scale`
    (e.g. 0.01 for a percentage our rows keep as a fraction); None for a finding without a number."""
    try:
        value = citations()[key].get("value")
    except KeyError:
        raise ConfigError(f"{CITATIONS_FILE}: no citation {key!r}") from None
    if field is not None:
        value = value[field]
    return None if value is None else float(value) * scale


def cited(key: str, field: str | None = None, scale: float = 1.0, label: str = "") -> PaperValue:
    """The PaperValue of a citations.yaml entry (module docstring)."""
    e = citations().get(key) or {}
    value = cited_value(key, field, scale)
    c = Citation(paper=e["paper"], where=e["where"] + (f", {field}" if field else ""), quote=e.get("quote") or "",
                 verified=bool(e.get("verified")), source=e.get("source_url") or "", note=e.get("note") or "")
    return PaperValue(c, value, label or e.get("unit") or "")


# --------------------------------------------------------------------------- context
@dataclass
class Context:
    """What a measure function needs: where rows go, the models for this mode, threads, progress."""

    store: Any
    quick: bool
    models: dict[str, str]  # role -> checkpoint path or Hub name ("encoder", "causal")
    threads: int | None = None
    progress: bool = True

    def probe(self, probe: str, checkpoint: str | list[str], settings: dict) -> tuple[str, pd.DataFrame]:
        """One probe run through the runner over one checkpoint or several, named by its key
        (`probes.core.runner.run_key`: the probe, the checkpoints, the settings that decide its rows and
        the probe's code version), so that asking again re-reads the finished run instead of
        recomputing it; a run of another probe version has another key and is never reused."""
        import dataclasses

        from probes import get_probe
        from probes.core.runner import resolve_settings, run_key, run_probe

        checkpoints = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
        spec = get_probe(probe)
        resolved = resolve_settings(spec, self.probe_settings(probe, settings), f"probe {probe}")
        name = f"reproduce-{probe}:{run_key(probe, checkpoints, resolved.resume_key())}"
        found = self.store.runs(name=name, status="finished")
        if not found.empty:
            run_id = str(found["run_id"].iloc[-1])
            return run_id, self.store.read(run_id)
        return run_probe(spec, checkpoints, dataclasses.replace(resolved, name=name), store=self.store)

    def probe_settings(self, probe: str, settings: dict) -> dict:
        """A row's settings as `probe` runs them: progress and threads of this call, and in `--quick`
        mode the small data of `QUICK_PROBE_SETTINGS`."""
        settings = dict(settings, progress=self.progress, threads=self.threads)
        if self.quick:
            settings.update(QUICK_PROBE_SETTINGS.get(probe, {}))
        return settings


# The EWT training sentences the encoder rows extract: one seeded sample, so that the Tenney, Hewitt &
# Manning and Hewitt & Liang rows share one activation cache per model.
TRAIN_SENTENCES = 4000
QUICK_PROBE_SETTINGS = {
    "syntax": {"max_train_sentences": 200, "max_eval_sentences": 100, "structural_max_train_sentences": 200,
               "mdl_max_examples": 2000},
    "coref": {"max_train_documents": 6, "max_eval_documents": 4, "max_train_pairs": 500, "max_gap_examples": 150},
    "align": {"pair_words": 400},
}


def quick_models(runs_root: Path, progress: bool = True) -> dict[str, str]:
    """Tiny models trained here in about a minute (a masked-LM encoder and a causal LM; trained once,
    then reused from their training folders)."""
    from workbench.drivers.train import train_from_config

    experiments = Path(__file__).resolve().parents[2] / "experiments" / "train"
    tiny = {"preset": "tiny", "steps": 30, "corpus.max_documents": 60, "tokenizer.vocab_size": 1000,
            "progress": progress}
    encoder = train_from_config(str(experiments / "bert_small.yaml"), dict(tiny, name="reproduce-quick-encoder"))
    causal = train_from_config(str(experiments / "gpt_tiny.yaml"), dict(tiny, name="reproduce-quick-causal"))
    return {"encoder": str(encoder[0]), "causal": str(causal[0])}


REAL_MODELS = {"encoder": MPNET, "causal": SMOLLM}


# --------------------------------------------------------------------------- helpers
def model_name(checkpoint: str) -> str:
    """A Hub name as it is; a local checkpoint by its run, seed and step (not its whole path)."""
    from workbench.store.checkpoints import checkpoint_name

    path = Path(checkpoint)
    return checkpoint_name(path) if path.exists() else checkpoint


def model_rows(rows: pd.DataFrame, task: str, metric: str, baseline: str | None = None) -> pd.DataFrame:
    """Per-layer rows of one task and metric of the probed model itself (not a twin or a baseline
    unless `baseline` names it)."""
    from app.fields import row_field

    sel = rows[(rows["task"] == task) & (rows["metric"] == metric) & rows["layer"].notna()]
    marks = row_field(sel, "baseline")
    return sel[marks == baseline] if baseline else sel[marks.isna() | (marks == "")]


def curve(rows: pd.DataFrame, task: str, metric: str):
    """(layers, scores, bootstrap replicates [B, L]) of one task's per-layer metric."""
    from probes.core.depth import curve_with_replicates

    sel = model_rows(rows, task, metric)
    if sel.empty:
        raise ConfigError(f"no {task} {metric} rows to read")
    return curve_with_replicates(sel)


# --------------------------------------------------------------------------- row 1: Tenney et al. 2019
def measure_tenney(ctx: Context) -> Measurement:
    """Expected layer (Tenney et al.'s differential score, per-layer probes) of POS, dependency labels
    and coreference on one encoder; the two differences with two-sample bootstrap CIs."""
    from probes.core import depth

    model = ctx.models["encoder"]
    run_s, syn = ctx.probe("syntax", model, {"tasks": ["upos", "deprel"], "treebank": "en_ewt",
                                             "baselines": [], "mdl_tasks": [], "scalar_mix_tasks": [],
                                             "max_train_sentences": TRAIN_SENTENCES})
    run_c, cor = ctx.probe("coref", model, {"tasks": ["gum-pairs"], "baselines": []})
    curves = {"POS": curve(syn, "upos", "accuracy"), "Deps": curve(syn, "deprel", "accuracy"),
              "Coref": curve(cor, "gum-pairs", "antecedent_accuracy")}
    layers = curves["POS"][0]
    n_layers = int(layers.max())
    parts = {}
    for later, earlier in (("Deps", "POS"), ("Coref", "Deps")):
        (_, a, ba), (_, b, bb) = curves[later], curves[earlier]
        parts[f"E[{later}] - E[{earlier}]"] = depth.difference(a, ba, b, bb, layers)["expected_layer"]
    expected = {task: depth.summarise(c[1], c[2], c[0])["expected_layer"] for task, c in curves.items()}
    paper = {"POS": "tenney2019_bert_large_pos_expected_layer", "Deps": "tenney2019_bert_large_deps_expected_layer",
             "Coref": "tenney2019_bert_large_coref_expected_layer"}  # of BERT-large's 24 layers
    depths = {}
    for task, (value, _, _) in expected.items():
        p = cited_value(paper[task])
        depths[task] = (value / n_layers, None if p is None else p / 24)
    return Measurement(value=parts["E[Coref] - E[Deps]"][0], low=parts["E[Coref] - E[Deps]"][1],
                       high=parts["E[Coref] - E[Deps]"][2], model=model_name(model), data="UD EWT (POS, deprel), GUM (coref)",
                       detail="expected layer " + ", ".join(f"{t} {v:.2f} [{lo:.2f}, {hi:.2f}]"
                                                            for t, (v, lo, hi) in expected.items()),
                       components=parts, run_ids=(run_s, run_c), depths=depths)


# --------------------------------------------------------------------------- row 2: Hewitt & Manning 2019
def measure_structural(ctx: Context, role: str, protocol: str = "workbench") -> Measurement:
    """The structural distance probe's best layer: UUAS with its CI, its margin over the right-branching
    chain, and the best layer's relative depth."""
    model = ctx.models[role]
    settings = {"tasks": ["structural-distance"], "treebank": "en_ewt", "baselines": ["majority"], "mdl_tasks": [],
                "scalar_mix_tasks": [], "protocol": protocol}
    if protocol == "workbench":  # extract the Tenney and Hewitt & Liang rows' 4,000 sentences (one activation
        settings["max_train_sentences"] = TRAIN_SENTENCES  # cache), not all 12,543; the probe fits 2,000 trees of them
    run_id, rows = ctx.probe("syntax", model, settings)
    uuas = model_rows(rows, "structural-distance", "uuas").sort_values("layer")
    chain = rows[(rows["task"] == "structural-distance") & (rows["metric"] == "right_branching_uuas")]["value"]
    if chain.empty:
        raise ConfigError("the structural probe wrote no right-branching chain rows (its `majority` baseline)")
    best = uuas.loc[uuas["value"].idxmax()]
    n_layers = int(uuas["layer"].max())
    chain_value = float(chain.iloc[0])
    depth_rel = float(best["layer"]) / n_layers
    margin = (float(best["value"]) - chain_value, float(best["ci_low"]) - chain_value, float(best["ci_high"]) - chain_value)
    return Measurement(value=float(best["value"]), low=float(best["ci_low"]), high=float(best["ci_high"]),
                       model=model_name(model),
                       data=f"UD EWT ({'train -> test, every tree' if protocol == 'hewitt-manning' else '2,000 train trees -> dev'})",
                       detail=f"best layer {int(best['layer'])} of {n_layers}; right-branching chain {chain_value:.3f}",
                       components={"UUAS - chain": margin, "relative depth of the best layer": (depth_rel, depth_rel, depth_rel)},
                       run_ids=(run_id,), depths={"UUAS peak": (depth_rel, None)})


def hewitt_manning_test() -> AllOf:
    return AllOf((IntervalsAbove(("UUAS - chain",), 0.0, "the best layer beats the right-branching chain"),
                  InRange(1 / 3, 2 / 3, "relative depth of the best layer")))


# --------------------------------------------------------------------------- row 3: Hewitt & Liang 2019
def measure_selectivity(ctx: Context) -> Measurement:
    """The UPOS probe's accuracy and selectivity (accuracy minus the control task's) per layer: the
    layer where each peaks, and how much more selective the selectivity peak is than the accuracy peak."""
    model = ctx.models["encoder"]
    run_id, rows = ctx.probe("syntax", model, {"tasks": ["upos"], "treebank": "en_ewt", "baselines": ["control"],
                                               "mdl_tasks": [], "scalar_mix_tasks": [], "max_train_sentences": TRAIN_SENTENCES})
    acc = model_rows(rows, "upos", "accuracy").set_index("layer").sort_index()
    sel = model_rows(rows, "upos", "selectivity").set_index("layer").sort_index()
    acc_peak, sel_peak = int(acc["value"].idxmax()), int(sel["value"].idxmax())
    gain = float(sel.loc[sel_peak, "value"] - sel.loc[acc_peak, "value"])
    n_layers = int(acc.index.max())
    return Measurement(value=float(sel_peak - acc_peak), model=model_name(model), data="UD EWT UPOS, 4,000 train sentences -> dev",
                       detail=(f"accuracy peaks at layer {acc_peak} ({acc.loc[acc_peak, 'value']:.3f}), selectivity at "
                               f"layer {sel_peak} ({sel.loc[sel_peak, 'value']:.3f}; {gain:+.3f} over the accuracy peak's)"),
                       components={"layers from the accuracy peak to the selectivity peak": (float(sel_peak - acc_peak),) * 3},
                       run_ids=(run_id,), depths={"UPOS accuracy peak": (acc_peak / n_layers, None),
                                                  "UPOS selectivity peak": (sel_peak / n_layers, None)})


# --------------------------------------------------------------------------- row 4: Voita & Titov 2020
def paired_ratio(a: tuple, b: tuple) -> tuple[float, float, float]:
    """a / b with a percentile CI from paired replicates: `a`, `b` are (point, replicates [B] or None);
    the CI is NaN without replicates."""
    from probes.core.statistics import percentile_interval

    point = a[0] / b[0]
    if a[1] is None or b[1] is None:
        return point, math.nan, math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = percentile_interval(np.asarray(a[1], dtype=float) / np.asarray(b[1], dtype=float))
    return point, float(lo), float(hi)


def codelength_components(compression: tuple[float, float], accuracy: tuple[tuple, tuple]) -> dict[str, tuple]:
    """Voita & Titov's comparison at one layer: the compression ratio trained / random-init (the online
    code has no resampling: a point), the accuracy ratio with its paired-bootstrap CI, and their
    difference, whose interval is the compression ratio minus the accuracy ratio's CI."""
    c = compression[0] / compression[1]
    a, a_lo, a_hi = paired_ratio(*accuracy)
    return {"compression ratio": (c, c, c), "accuracy ratio": (a, a_lo, a_hi),
            "compression ratio - accuracy ratio": (c - a, c - a_hi, c - a_lo)}


def measure_codelength(ctx: Context) -> Measurement:
    """The UPOS probe's online codelength (Voita & Titov 2020, `mdl_tasks`) and accuracy on the encoder
    and its random-init twin (`baselines: random_init`, the same architecture with fresh weights), at
    the layer where the trained model compresses best: how much more the compression ratio separates
    the two than the accuracy ratio does."""
    from probes.core.depth import curve_with_replicates

    model = ctx.models["encoder"]
    run_id, rows = ctx.probe("syntax", model, {"tasks": ["upos"], "treebank": "en_ewt", "baselines": ["random_init"],
                                               "mdl_tasks": ["upos"], "scalar_mix_tasks": [],
                                               "max_train_sentences": 1000, "max_eval_sentences": 500})

    def series(metric, baseline=None):
        sel = model_rows(rows, "upos", metric, baseline)
        if sel.empty:
            raise ConfigError(f"no upos {metric} rows{' of the random-init twin' if baseline else ''} to read")
        return sel.set_index("layer").sort_index()["value"]

    comp, comp_twin = series("compression"), series("compression", "random_init")
    layers, acc, acc_boot = curve(rows, "upos", "accuracy")
    t_layers, acc_twin, twin_boot = curve_with_replicates(model_rows(rows, "upos", "accuracy", "random_init"))
    best = int(comp.idxmax())
    i, j = list(layers).index(best), list(t_layers).index(best)
    parts = codelength_components((float(comp[best]), float(comp_twin[best])),
                                  ((acc[i], None if acc_boot is None else acc_boot[:, i]),
                                   (acc_twin[j], None if twin_boot is None else twin_boot[:, j])))
    n_layers = int(max(layers))
    c, a = parts["compression ratio"][0], parts["accuracy ratio"][0]
    paper = citations()["voita2020_pos_layer1_trained_vs_random_online_codelength"]["value"]
    return Measurement(value=c, model=model_name(model), data="UD EWT UPOS (1,000 train sentences: online code on their fit part; accuracy on 500 dev sentences)",
                       detail=(f"layer {best} of {n_layers}: compression {comp[best]:.1f} vs twin {comp_twin[best]:.1f} "
                               f"({(c - 1) * 100:+.0f}%), accuracy {acc[i]:.3f} vs twin {acc_twin[j]:.3f} "
                               f"({(a - 1) * 100:+.1f}%); paper (ELMo layer 1): online codelength {paper[0]} vs "
                               f"{paper[1]} kbits, accuracy 97.8 vs 95.7"),
                       components=parts, run_ids=(run_id,),
                       depths={"UPOS compression peak": (best / n_layers, 1 / 2)})


def voita_paper_value() -> PaperValue:
    """The paper's compression ratio trained / random-init ELMo at layer 1: compression = uniform /
    online codelength, so the ratio is the random model's online codelength over the trained one's."""
    e = citations()["voita2020_pos_layer1_trained_vs_random_online_codelength"]
    trained, random = e["value"]
    c = Citation(paper=e["paper"], where=e["where"], quote=e.get("quote") or "", verified=bool(e.get("verified")),
                 source=e.get("source_url") or "", note=e.get("note") or "")
    return PaperValue(c, float(random) / float(trained),
                      "compression ratio trained / random-init (ELMo layer 1: 294 / 192 kbits)")


# --------------------------------------------------------------------------- row 5: Clark et al. 2019
def measure_coref_head(ctx: Context) -> Measurement:
    """The coreference probe's attention heads (Clark et al.'s criterion: a mention's head word attends
    most to an antecedent's head word): the best layer x head chosen on GUM dev, its accuracy on GUM
    test against the nearest-mention rule on the same mentions, and its layer's relative depth."""
    model = ctx.models["encoder"]
    run_id, rows = ctx.probe("coref", model, {"tasks": ["attention-heads"], "baselines": ["rules"],
                                              "max_eval_documents": 10, "max_gap_examples": 100})
    from app.fields import row_field

    sel = rows[(rows["task"] == "attention-heads") & (rows["metric"] == "best_head_accuracy_overall")]
    if sel.empty:
        raise ConfigError("the coref probe wrote no best_head_accuracy_overall row")
    best = sel.iloc[0]
    layer, head = int(row_field(best, "best_layer", "coref")), int(row_field(best, "best_head", "coref"))
    near = model_rows(rows, "attention-heads", "nearest_mention", "nearest_mention")
    if near.empty:
        raise ConfigError("the coref probe wrote no nearest_mention baseline rows (its `rules` baseline)")
    near = near.iloc[0]
    n_layers = int(model_rows(rows, "attention-heads", "best_head_accuracy")["layer"].max())
    v, lo, hi = float(best["value"]), float(best["ci_low"]), float(best["ci_high"])
    nv, nlo, nhi = float(near["value"]), float(near["ci_low"]), float(near["ci_high"])
    depth_rel = layer / n_layers
    paper_layer = 5 / 12  # head 5-4 of BERT-base
    return Measurement(value=v, low=lo, high=hi, model=model_name(model),
                       data="GUM (head chosen on the first 10 dev documents, scored on the first 10 test documents; Clark's head-word criterion)",
                       detail=(f"best head {layer}-{head} (layer {layer} of {n_layers}, head {head}, 0-based) chosen "
                               f"on dev at {float(row_field(best, 'chosen_value', 'coref') or math.nan):.3f}; nearest mention "
                               f"{nv:.3f} [{nlo:.3f}, {nhi:.3f}] on the same test mentions"),
                       components={"best head - nearest mention (CI: head's low - rule's high)": (v - nv, lo - nhi, hi - nlo),
                                   "relative depth of the best head": (depth_rel,) * 3},
                       run_ids=(run_id,), depths={"coreference head": (depth_rel, paper_layer)})


# --------------------------------------------------------------------------- row 6: GAP (Webster et al. 2018)
def measure_gap(ctx: Context) -> Measurement:
    """The frozen-encoder GAP probe (trained on development, stopped on validation, scored on test with
    the official scorer's logic, `probes/coref/gap_scorer.py`): the best layer's overall F1 with its
    CI, and its margin over the stronger model-free rule (nearest name, subject name) on the same rows."""
    model = ctx.models["encoder"]
    run_id, rows = ctx.probe("coref", model, {"tasks": ["gap"], "baselines": ["rules"], "max_gap_examples": 600})
    f1 = model_rows(rows, "gap", "f1").sort_values("layer")
    if f1.empty:
        raise ConfigError("the coref probe wrote no gap f1 rows")
    best = f1.loc[f1["value"].idxmax()]
    rules = {}
    for name in ("nearest_name", "subject_name"):
        r = model_rows(rows, "gap", f"{name}_f1", name)
        if not r.empty:
            rules[name] = r.iloc[0]
    if not rules:
        raise ConfigError("the coref probe wrote no GAP rule baselines (its `rules` baseline)")
    rule_name, rule = max(rules.items(), key=lambda kv: float(kv[1]["value"]))
    v, lo, hi = float(best["value"]), float(best["ci_low"]), float(best["ci_high"])
    n_layers = int(f1["layer"].max())
    layer = int(best["layer"])
    n_test = int(best["n"])
    return Measurement(value=v, low=lo, high=hi, model=model_name(model),
                       data=f"GAP (first 600 development rows -> fit, validation -> stop, first {n_test:,} test rows)",
                       detail=(f"best layer {layer} of {n_layers} (chosen on test: not in the CI); stronger rule "
                               f"{rule_name.replace('_', ' ')}; "
                               + ", ".join(f"{k.replace('_', ' ')} rule F1 {float(r['value']):.3f}" for k, r in rules.items())),
                       components={GAP_MARGIN: (v - float(rule["value"]), lo - float(rule["ci_high"]),
                                                hi - float(rule["ci_low"])),
                                   "stronger rule": (float(rule["value"]), float(rule["ci_low"]), float(rule["ci_high"]))},
                       run_ids=(run_id,), depths={"GAP F1 peak": (layer / n_layers, None)})


GAP_MARGIN = "F1 - stronger model-free rule (CI: ours low - rule high)"


def gap_test() -> AllOf:
    """Webster et al.'s point is that syntactic parallelism (66.9 F1) is a strong baseline: reproduced
    when a frozen-encoder probe lands at its level (within 5 F1 points) while beating the model-free
    rules (nearest name, subject name) on the same test rows; above or below that band it differs."""
    return AllOf((IntervalsAbove((GAP_MARGIN,), 0.0, "above the model-free rules on the same rows"),
                  WithinTolerance(0.05)))


# --------------------------------------------------------------------------- row 8: Kornblith et al. 2019
def best_match_spearman(cka: np.ndarray) -> float:
    """Spearman correlation of each layer of the first model with its best-matching layer (highest
    linear CKA) in the second: 1 when the map is monotone increasing; 0 when the map is constant."""
    from scipy.stats import spearmanr

    match = np.nanargmax(cka, axis=1)
    if len(set(match.tolist())) < 2:
        return 0.0
    return float(spearmanr(np.arange(len(match)), match).statistic)


def measure_cka(ctx: Context, n_boot: int = 200) -> Measurement:
    """Linear CKA between every layer of a shallow encoder and every layer of a deep one on the same
    EWT dev words (the align probe's `model-pair` task); each shallow layer's best-matching deep layer,
    and the Spearman correlation of that map with depth, with a bootstrap CI over sentences."""
    from probes.align import PROBE
    from probes.align.tasks import model_pair_vectors
    from probes.core.runner import resolve_settings
    from probes.core.statistics import percentile_interval, resample_counts
    from workbench.geometry import cka_matrix_bootstrap
    from workbench.store.checkpoints import expand_checkpoints

    shallow = ctx.models["causal"] if ctx.quick else MINILM
    deep = ctx.models["encoder"]
    shallow, deep = (str(expand_checkpoints([m])[-1].path) if Path(m).exists() else m for m in (shallow, deep))
    settings = {"tasks": ["model-pair"], "baselines": [], "pair_corpus": "ud:en_ewt:dev", "pair_words": 1500}
    run_id, rows = ctx.probe("align", [shallow, deep], settings)
    sel = rows[(rows["task"] == "model-pair") & (rows["metric"] == "cka")]
    if sel.empty:
        raise ConfigError("the align probe wrote no model-pair cka rows")
    from app.fields import row_field

    other = row_field(sel, "other_layer", "align").astype(int)
    matrix = (pd.DataFrame({"i": sel["layer"].astype(int).to_numpy(), "j": other.to_numpy(), "v": sel["value"].to_numpy()})
              .pivot(index="i", columns="j", values="v").sort_index().sort_index(axis=1).to_numpy())
    point = best_match_spearman(matrix)
    full = resolve_settings(PROBE, ctx.probe_settings("align", settings), "model-pair vectors")
    xs, sentences = model_pair_vectors(shallow, full)
    ys, _ = model_pair_vectors(deep, full)
    n_units = len(np.unique(sentences))
    boot = cka_matrix_bootstrap(list(xs), list(ys), sentences, resample_counts(n_units, n_boot, seed=0))
    reps = np.array([best_match_spearman(b) for b in boot])
    lo, hi = percentile_interval(reps)
    match = np.nanargmax(matrix, axis=1)
    ls, ld = matrix.shape[0] - 1, matrix.shape[1] - 1
    return Measurement(value=point, low=float(lo), high=float(hi), model=f"{model_name(shallow)} vs {model_name(deep)}",
                       data=f"UD EWT dev, {xs.shape[1]:,} words of {n_units:,} sentences",
                       detail=("best-matching layers " + ", ".join(f"{i}->{j}" for i, j in enumerate(match))
                               + f"; mean |relative depth gap| {np.mean(np.abs(np.arange(ls + 1) / ls - match / ld)):.2f}"
                               + f"; {n_boot} resamples of sentences"),
                       components={"Spearman(layer, best-matching layer)": (point, float(lo), float(hi))},
                       run_ids=(run_id,))


# --------------------------------------------------------------------------- row 9: Strubell et al. 2019
@contextlib.contextmanager
def environment(**values: str):
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure_strubell(ctx: Context) -> Measurement:
    """Strubell et al.'s published inputs (power, hours, PUE 1.58, 0.954 lbs CO2e per kWh) through
    the cost module's own formula (`workbench.cost.own_cost`): our kWh for BERT-base."""
    from workbench.cost import own_cost

    power, hours = cited_value("strubell2019_bert_base_power_w"), cited_value("strubell2019_bert_base_hours")
    pue, lbs_per_kwh = cited_value("strubell2019_pue_coefficient"), cited_value("strubell2019_co2_per_kwh")
    grams_per_kwh = lbs_per_kwh * 453.59237
    with environment(BERTOLOGY_PUE=str(pue), BERTOLOGY_GRID_GCO2_PER_KWH=str(grams_per_kwh)):
        record = own_cost(flops=None, flops_per_token=None, tokens=None, seconds=hours * 3600,
                          device={"kind": "gpu", "count": 64}, energy_joules=power * hours * 3600,
                          energy_source="Strubell et al. 2019, Table 3", what="reproduction")
    lbs = record["co2e_kg"] * 1000 / 453.59237
    paper_lbs = cited_value("strubell2019_bert_base_co2e_lbs")
    return Measurement(value=record["energy_kwh"], model="(no model: the paper's inputs)", data="Strubell et al. Table 3",
                       detail=f"{power:g} W x {hours:g} h x PUE {pue:g}; CO2e {lbs:.0f} lbs"
                              + (f" (paper {paper_lbs:g})" if paper_lbs is not None else ""),
                       components={"CO2e lbs": (lbs, lbs, lbs)})


# --------------------------------------------------------------------------- the registry
def rows() -> list[Row]:
    return [
        Row(key="tenney2019", finding="POS is decoded earlier than dependencies, dependencies earlier than coreference",
            paper=cited("tenney2019_ordering_sentence"), paper_setting="BERT-large, edge probing, scalar mixes, OntoNotes",
            our_setting="bertology probe syntax --tasks upos,deprel + probe coref --tasks gum-pairs (per-layer probes)",
            test=IntervalsAbove(("E[Deps] - E[POS]", "E[Coref] - E[Deps]"), 0.0, "expected layers in the paper's order"),
            measure=measure_tenney, models=(MPNET,), minutes=28),
        Row(key="hewitt_manning2019", finding="a linear structural probe recovers parse trees, best in the middle layers",
            paper=cited("hewittmanning2019_bert_base7_uuas_dspr", "uuas", 0.01), paper_setting="BERT-base, PTB WSJ, all training trees",
            our_setting="bertology probe syntax --tasks structural-distance --max-train-sentences 4000 (EWT, 2,000 train trees, dev)",
            test=hewitt_manning_test(), measure=lambda ctx: measure_structural(ctx, "encoder"),
            models=(MPNET,), minutes=6, ratio=True),
        Row(key="hewitt_manning2019_causal", finding="the same probe on a causal LM (SmolLM2) beats the chain in its middle layers",
            paper=cited("hewittmanning2019_bert_base7_uuas_dspr", "uuas", 0.01), paper_setting="BERT-base, PTB WSJ, all training trees",
            our_setting="bertology probe syntax --tasks structural-distance --max-train-sentences 4000 on SmolLM2 (EWT, 2,000 train trees, dev)",
            test=hewitt_manning_test(), measure=lambda ctx: measure_structural(ctx, "causal"),
            models=(SMOLLM,), minutes=10, ratio=True),
        Row(key="hewitt_manning2019_protocol", finding="the structural probe under Hewitt & Manning's own data protocol",
            paper=cited("hewittmanning2019_bert_base7_uuas_dspr", "uuas", 0.01), paper_setting="BERT-base, PTB WSJ, all training trees, test",
            our_setting="bertology probe syntax --tasks structural-distance --protocol hewitt-manning (every EWT train tree, test)",
            test=hewitt_manning_test(),  # --quick: the tiny models on the workbench protocol (the preset refuses a cap)
            measure=lambda ctx: measure_structural(ctx, "encoder", "workbench" if ctx.quick else "hewitt-manning"),
            models=(MPNET,), full=True, minutes=40, ratio=True),
        Row(key="hewitt_liang2019", finding="selectivity peaks later in depth than accuracy (ELMo: layer 1 more accurate, layer 2 more selective)",
            paper=cited("hewittliang2019_elmo1_vs_elmo2_finding"), paper_setting="ELMo, PTB POS, linear and MLP probes, control task",
            our_setting="bertology probe syntax --tasks upos --baselines control (linear probe)",
            test=InRange(1, math.inf, "layers from the accuracy peak to the selectivity peak"),
            measure=measure_selectivity, models=(MPNET,), minutes=6),
        Row(key="voita_titov2020", finding="the online codelength separates a trained model from its random-init twin far more than accuracy does",
            paper=voita_paper_value(), paper_setting="ELMo vs random-orthonormal ELMo, PTB POS (edge probing), online code, MLP probe",
            our_setting="bertology probe syntax --tasks upos --mdl-tasks upos --baselines random_init (linear probe, 1,000 EWT train sentences, 500 dev)",
            test=IntervalsAbove(("compression ratio - accuracy ratio",), 0.0,
                                "trained / random-init: compression separates more than accuracy, at the best-compressing layer"),
            measure=measure_codelength, models=(MPNET,), minutes=13.5, ratio=True),
        Row(key="clark2019", finding="an attention head does coreference far above the nearest-mention baseline, in the middle layers",
            paper=cited("clark2019_head_5_4_coref_acc", scale=0.01, label="antecedent selection accuracy, BERT-base head 5-4"),
            paper_setting="BERT-base, CoNLL-2012, head chosen and reported on the same data, 128-token documents",
            our_setting="bertology probe coref --tasks attention-heads --baselines rules --max-eval-documents 10 (GUM: head chosen on dev, scored on test)",
            test=AllOf((IntervalsAbove(("best head - nearest mention (CI: head's low - rule's high)",), 0.0,
                                       "the best head beats the nearest-mention rule"),
                        InRange(1 / 3, 2 / 3, "relative depth of the best head"))),
            measure=measure_coref_head, models=(MPNET,), minutes=10.5, ratio=True),
        Row(key="webster2018", finding="GAP: syntactic parallelism (66.9 F1) is a strong baseline; a frozen-encoder probe lands at its level",
            paper=cited("webster2018_gap_parallelism_overall_f1", scale=0.01, label="overall F1, Parallelism, snippet-context, test"),
            paper_setting="GAP test (2,000 rows), the Parallelism heuristic, official scorer",
            our_setting="bertology probe coref --tasks gap --baselines rules --max-gap-examples 600 (linear probe per layer, the scorer's logic)",
            test=gap_test(), measure=measure_gap, models=(MPNET,), minutes=13.5, ratio=True),
        Row(key="kornblith2019", finding="linear CKA matches layers across models monotonically (deeper layers to deeper layers)",
            paper=cited("kornblith2019_conclusion_statement"),
            paper_setting="CNNs and Transformers; same architecture from two initialisations (linear CKA finds the corresponding layer 99.3% of the time) and across architectures",
            our_setting="bertology probe align --tasks model-pair (all-MiniLM-L6-v2 vs all-mpnet-base-v2, 1,500 EWT dev words)",
            test=IntervalsAbove(("Spearman(layer, best-matching layer)",), 0.5, "the layer map rises with depth"),
            measure=measure_cka, models=(MINILM, MPNET), minutes=15),
        Row(key="strubell2019", finding="training energy from published power and hours (BERT-base, 64 V100s)",
            paper=cited("strubell2019_bert_base_kwh"), paper_setting="Table 3 inputs, PUE 1.58, US average grid",
            our_setting="workbench.cost.own_cost on the paper's inputs",
            test=WithinTolerance(0.01, relative=True), measure=measure_strubell, minutes=0.01, ratio=True),
    ]
