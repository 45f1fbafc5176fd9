"""Reproduction rows on causal language models: oLMpics (row 7, Talmor et al. 2020) on SmolLM2 with
the calibrated zero-shot rules, and the Secret Sharer (row 10, Carlini et al. 2019) on a tiny GPT
trained here with canaries.

Both read the store through the probes' own runs: the cloze row asks `bertology probe cloze` once per
task with the settings of docs/cloze.md's measured table (`CLOZE_SETTINGS`), and re-reads a finished
run made with the same settings and checkpoint, whatever it was named (`probe_reusing`); the canary
row trains its model through the training driver (a finished training folder is reused) and asks
`bertology probe extraction --tasks exposure`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from app.reproduce import rows as base
from app.reproduce.spec import AllOf, IntervalsAbove, IntervalsBelow, IntervalsContain, Measurement, Row
from workbench.errors import ConfigError


# --------------------------------------------------------------------------- a finished run, re-read
def probe_reusing(ctx, probe: str, checkpoint: str, settings: dict) -> tuple[str, pd.DataFrame]:
    """A finished run of `probe` on `checkpoint` whose settings decide the same rows (the settings'
    `resume_key`: execution-only fields such as the name, threads and progress left out), re-read
    from the store; otherwise a new run through `ctx.probe`. So a row finds the runs a documented
    `bertology probe ... --name NAME` command made with the same options, by the same version of the
    probe's code (the run's notes record it)."""
    from probes import get_probe
    from probes.core.runner import resolve_settings
    from workbench.store.checkpoints import expand_checkpoints

    spec = get_probe(probe)
    values = dict(settings, progress=ctx.progress, threads=ctx.threads)
    if ctx.quick:
        values.update(base.QUICK_PROBE_SETTINGS.get(probe, {}))
    want = resolve_settings(spec, values, f"probe {probe}").resume_key()
    paths = [str(c.path) if c.path else c.name for c in expand_checkpoints([checkpoint])]
    fields = {f.name for f in dataclasses.fields(spec.settings)}
    runs = ctx.store.runs(kind="probe", status="finished", probe=probe)
    for run_id in reversed(list(runs["run_id"])):
        manifest = ctx.store.manifest(run_id)
        config = manifest.get("config") or {}
        if config.get("checkpoints") != paths:
            continue
        if (manifest.get("notes") or {}).get("probe_version") != spec.version:
            continue  # another version of the probe's code (or one from before runs recorded it): its rows may differ
        # the manifest's config is {"probe": name, "checkpoints": [...], **settings}: a setting named
        # `probe` (the cloze probe's linear probe switch) writes over the name, so keep the fields only
        config = {k: v for k, v in config.items() if k in fields}
        try:
            found = resolve_settings(spec, config, f"probe {probe}").resume_key()
        except Exception:  # a run of an older version of the probe, with settings it no longer takes
            continue
        if found == want:
            rows = ctx.store.read(run_id)
            return run_id, rows
    return ctx.probe(probe, checkpoint, settings)


# --------------------------------------------------------------------------- row 7: oLMpics
CLOZE_SETTINGS = {"n_train": 200, "n_test": 200, "probe": False, "lens": False, "baselines": ["majority"],
                  "scoring": ["raw", "contextual", "pmi_dc"]}
QUICK_CLOZE = {"n_train": 20, "n_test": 30}
CLOZE_RULES = {"raw": "zero_shot_acc", "contextual": "zero_shot_contextual_acc", "pmi_dc": "zero_shot_pmi_dc_acc"}
VERDICT_RULE = "raw"  # the head's own score, the cloze probe's default (docs/cloze.md: calibration changes no
# conclusion on SmolLM2; pmi_dc answers one constant choice on antonym, multihop): the others go in the detail
ABOVE_CHANCE = ("antonym",)
AT_CHANCE = ("always-never", "multihop")


def _metric(rows: pd.DataFrame, task: str, metric: str) -> tuple[float, float, float]:
    sel = rows[(rows["task"] == task) & (rows["metric"] == metric)]
    sel = sel[~sel["model"].astype(str).str.endswith("(random init)")]
    if sel.empty:
        raise ConfigError(f"cloze: no {task} {metric} rows to read")
    r = sel.iloc[0]
    return float(r["value"]), float(r["ci_low"]), float(r["ci_high"])


def measure_olmpics(ctx) -> Measurement:
    """Zero-shot accuracy of the causal LM's own head on antonym negation, always-never and multi-hop
    composition (one cloze run per task), each minus chance (1/K: the splits are balanced) with its
    bootstrap CI over items, under the verdict's rule; the other rules in the detail."""
    model = ctx.models["causal"]
    settings = dict(CLOZE_SETTINGS, **(QUICK_CLOZE if ctx.quick else {}))
    parts, details, run_ids, accuracy = {}, [], [], {}
    for task in ABOVE_CHANCE + AT_CHANCE:
        run_id, rows = probe_reusing(ctx, "cloze", model, dict(settings, tasks=[task]))
        run_ids.append(run_id)
        chance = _metric(rows, task, "random_acc")[0]
        scores = {rule: _metric(rows, task, metric) for rule, metric in CLOZE_RULES.items()}
        v, lo, hi = accuracy[task] = scores[VERDICT_RULE]
        parts[f"{task} - chance"] = (v - chance, lo - chance, hi - chance)
        nonsense = _metric(rows, task, "nonsense_acc")[0]
        details.append(f"{task} (chance {chance:.3g}): " + ", ".join(
            f"{rule} {s[0]:.3f} [{s[1]:.2f}, {s[2]:.2f}]" for rule, s in scores.items()) + f"; nonsense (raw) {nonsense:.3f}")
    antonym = accuracy["antonym"]  # the table shows the antonym accuracy; the test reads the differences from chance
    return Measurement(value=antonym[0], low=antonym[1], high=antonym[2], model=base.model_name(model),
                       data="oLMpics-style cloze items regenerated here (probes/cloze/tasks.py), test split",
                       detail=f"verdict rule {VERDICT_RULE}; " + "; ".join(details),
                       components=parts, run_ids=tuple(run_ids))


def olmpics_test() -> AllOf:
    return AllOf((IntervalsAbove(tuple(f"{t} - chance" for t in ABOVE_CHANCE), 0.0, "zero-shot above chance"),
                  IntervalsContain(tuple(f"{t} - chance" for t in AT_CHANCE), 0.0, "at chance, as the paper's models")))


# --------------------------------------------------------------------------- row 10: the Secret Sharer
# A tiny GPT (2 x 64) on a 25-document slice of the inaugural addresses with canaries at 1, 4, 16 and
# 64 repetitions (four each) and eight never inserted; four digits, so the exposure is exact (every
# one of the 10,000 candidates scored, rank 1 = the most likely; five digits took 4.5 min to score).
CANARY_TRAIN = {"family": "gpt", "preset": "tiny", "tokenizer": {"vocab_size": 2000}, "max_len": 64, "batch_size": 16,
                "lr": 3.0e-3, "warmup": 0.05, "steps": 800, "seeds": [0],
                "corpus": {"sources": ["inaugural"], "heldout_fraction": 0.2, "seed": 0, "max_documents": 25,
                           "canaries": {"repetitions": [1, 4, 16, 64], "per_count": 4, "unseen": 8, "digits": 4,
                                        "seed": 0}}}
QUICK_CANARY_TRAIN = {"steps": 80, "corpus": {"sources": ["inaugural"], "heldout_fraction": 0.2, "seed": 0,
                                              "max_documents": 6,
                                              "canaries": {"repetitions": [1, 4, 16, 64], "per_count": 2, "unseen": 4,
                                                           "digits": 3, "seed": 0}}}
RANDOM_EXPOSURE_P95 = math.log2(20)  # a random candidate's exposure exceeds x with probability 2^-x: 4.32 bits


def train_canary_model(ctx) -> str:
    """The canary GPT's last checkpoint (trained once under the runs root, then found there)."""
    from probes.core.runner import torch_threads
    from workbench.drivers.train import train_from_config

    name = "reproduce-canaries" + ("-quick" if ctx.quick else "")
    cfg = dict(CANARY_TRAIN, **(QUICK_CANARY_TRAIN if ctx.quick else {}), name=name, progress=ctx.progress,
               output_dir=str(Path(ctx.store.root) / "train" / name),
               checkpoints={"log_spaced": False, "every": 10 ** 9})
    with torch_threads(ctx.threads):
        return str(train_from_config(cfg)[0])


def spearman_bootstrap(x, y, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Spearman's rho of (x, y) with a percentile bootstrap over the pairs (the statistics home's
    resamples); a resample with a constant side is left out."""
    from scipy.stats import spearmanr

    from probes.core.statistics import percentile_interval, resample_counts

    x, y = np.asarray(x, float), np.asarray(y, float)
    point = float(spearmanr(x, y).statistic)
    boot = []
    for block in resample_counts(len(x), n_boot, seed):
        for counts in block:
            idx = np.repeat(np.arange(len(x)), counts.astype(int))
            if np.ptp(x[idx]) == 0 or np.ptp(y[idx]) == 0:
                boot.append(np.nan)
            else:
                boot.append(spearmanr(x[idx], y[idx]).statistic)
    low, high = percentile_interval(np.array(boot))
    return point, float(low), float(high)


def measure_secret_sharer(ctx) -> Measurement:
    """Exposure (bits) of every canary of the tiny GPT: Spearman's rho of exposure against repetitions
    over the inserted canaries, and the mean exposure of the never-inserted ones, each with a
    bootstrap CI over canaries."""
    from probes.core.statistics import ratio_bootstrap
    from app.fields import row_field

    checkpoint = train_canary_model(ctx)
    run_id, rows = probe_reusing(ctx, "extraction", checkpoint, {"tasks": ["exposure"], "baselines": []})
    exp = rows[(rows["task"] == "exposure") & (rows["metric"] == "exposure")]
    if exp.empty:
        raise ConfigError("extraction: no exposure rows to read")
    reps = row_field(exp, "repetitions", "extraction").astype(int).to_numpy()
    values = exp["value"].to_numpy(float)
    space = int(row_field(exp.iloc[0], "candidate_space", "extraction"))
    seen, unseen = reps > 0, reps == 0
    rho = spearman_bootstrap(reps[seen], values[seen])
    u, ulo, uhi = (float(a) for a in ratio_bootstrap(values[unseen]))
    by_count = pd.Series(values).groupby(reps).mean()
    return Measurement(value=rho[0], low=rho[1], high=rho[2], model=base.model_name(checkpoint),
                       data=f"{int(seen.sum())} canaries inserted 1-64 times, {int(unseen.sum())} never, "
                            f"|R| = {space:,} ({row_field(exp.iloc[0], 'method', 'extraction')})",
                       detail="mean exposure by repetitions " + ", ".join(f"{r}: {v:.2f}" for r, v in by_count.items())
                              + f" bits (max {math.log2(space):.1f}); unseen {u:.2f} [{ulo:.2f}, {uhi:.2f}]",
                       components={"Spearman rho (exposure, repetitions)": rho, "unseen canaries' mean exposure": (u, ulo, uhi)},
                       run_ids=(run_id,))


def secret_sharer_test() -> AllOf:
    return AllOf((IntervalsAbove(("Spearman rho (exposure, repetitions)",), 0.0, "exposure grows with repetitions"),
                  IntervalsBelow(("unseen canaries' mean exposure",), RANDOM_EXPOSURE_P95,
                                 "unseen canaries at a random candidate's level (its 95th percentile, log2 20)")))


# --------------------------------------------------------------------------- the rows
def lm_rows() -> list[Row]:
    return [
        Row(key="talmor2020", finding="zero-shot, an LM negates antonyms above chance but sits at chance on always-never "
                                      "and multi-hop composition (oLMpics; the paper's per-task numbers unverified)",
            paper=base.cited("talmor2020_olmpics_main_findings"),
            paper_setting="BERT, RoBERTa and others, MC-MLM zero-shot on the oLMpics tasks",
            our_setting="bertology probe cloze --tasks T --n-train 200 --n-test 200 --no-probe --no-lens --baselines majority "
                        "--scoring raw,contextual,pmi_dc (one run per task; verdict on the raw rule)",
            test=olmpics_test(), measure=measure_olmpics, models=(base.SMOLLM,), minutes=35),
        Row(key="carlini2019", finding="a canary's exposure grows with its repetitions; never-inserted canaries stay at "
                                       "a random candidate's level",
            paper=base.cited("carlini2019_abstract_finding"),
            paper_setting="LSTM on PTB and others, canaries inserted 1 to 10,000 times",
            our_setting="tiny GPT (2 x 64) trained here 800 steps on 25 inaugural addresses with canaries at 1/4/16/64 "
                        "copies; bertology probe extraction --tasks exposure (exact over 10^4 secrets)",
            test=secret_sharer_test(), measure=measure_secret_sharer, minutes=5),
    ]
