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

    def probe(self, probe: str, checkpoint: str, settings: dict) -> tuple[str, pd.DataFrame]:
        """One probe run through the runner (cached in the store: a second call re-reads it)."""
        from probes.core.runner import run_probe

        settings = dict(settings, progress=self.progress, threads=self.threads)
        if self.quick:
            settings.update(QUICK_PROBE_SETTINGS.get(probe, {}))
        return run_probe(probe, [checkpoint], settings, store=self.store)


QUICK_PROBE_SETTINGS = {
    "syntax": {"max_train_sentences": 200, "max_eval_sentences": 100, "structural_max_train_sentences": 200,
               "mdl_tasks": ()},
    "coref": {"max_train_documents": 6, "max_eval_documents": 4, "max_train_pairs": 500},
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
    from workbench.store.results import decode_extra

    sel = rows[(rows["task"] == task) & (rows["metric"] == metric) & rows["layer"].notna()]
    marks = sel["extra"].map(lambda e: decode_extra(e).get("baseline"))
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
                                             "max_train_sentences": 4000})
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
                                               "mdl_tasks": [], "scalar_mix_tasks": [], "max_train_sentences": 4000})
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
            measure=measure_tenney, models=(MPNET,), minutes=12),
        Row(key="hewitt_manning2019", finding="a linear structural probe recovers parse trees, best in the middle layers",
            paper=cited("hewittmanning2019_bert_base7_uuas_dspr", "uuas", 0.01), paper_setting="BERT-base, PTB WSJ, all training trees",
            our_setting="bertology probe syntax --tasks structural-distance (EWT, 2,000 train trees, dev)",
            test=hewitt_manning_test(), measure=lambda ctx: measure_structural(ctx, "encoder"),
            models=(MPNET,), minutes=6, ratio=True),
        Row(key="hewitt_manning2019_causal", finding="the same probe on a causal LM (SmolLM2) beats the chain in its middle layers",
            paper=cited("hewittmanning2019_bert_base7_uuas_dspr", "uuas", 0.01), paper_setting="BERT-base, PTB WSJ, all training trees",
            our_setting="bertology probe syntax --tasks structural-distance on SmolLM2 (EWT, 2,000 train trees, dev)",
            test=hewitt_manning_test(), measure=lambda ctx: measure_structural(ctx, "causal"),
            models=(SMOLLM,), minutes=10, ratio=True),
        Row(key="hewitt_manning2019_protocol", finding="the structural probe under Hewitt & Manning's own data protocol",
            paper=cited("hewittmanning2019_bert_base7_uuas_dspr", "uuas", 0.01), paper_setting="BERT-base, PTB WSJ, all training trees, test",
            our_setting="bertology probe syntax --tasks structural-distance --protocol hewitt-manning (every EWT train tree, test)",
            test=hewitt_manning_test(), measure=lambda ctx: measure_structural(ctx, "encoder", "hewitt-manning"),
            models=(MPNET,), full=True, minutes=40, ratio=True),
        Row(key="hewitt_liang2019", finding="selectivity peaks later in depth than accuracy (ELMo: layer 1 more accurate, layer 2 more selective)",
            paper=cited("hewittliang2019_elmo1_vs_elmo2_finding"), paper_setting="ELMo, PTB POS, linear and MLP probes, control task",
            our_setting="bertology probe syntax --tasks upos --baselines control (linear probe)",
            test=InRange(1, math.inf, "layers from the accuracy peak to the selectivity peak"),
            measure=measure_selectivity, models=(MPNET,), minutes=6),
        Row(key="strubell2019", finding="training energy from published power and hours (BERT-base, 64 V100s)",
            paper=cited("strubell2019_bert_base_kwh"), paper_setting="Table 3 inputs, PUE 1.58, US average grid",
            our_setting="workbench.cost.own_cost on the paper's inputs",
            test=WithinTolerance(0.01, relative=True), measure=measure_strubell, minutes=0.01, ratio=True),
    ]


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


@lru_cache(maxsize=1)
def registry() -> dict[str, Row]:
    return build_registry(rows())
