"""The long reproduction rows (`bertology reproduce --full`): each runs a driver that fine-tunes,
so each says its expected time (`Row.minutes`: 2 shared CPU cores, one torch thread; `FULL_MINUTES`
also gives a GPU estimate) and has a quick path on the tiny encoder of `--quick`.

- `chen2020`: lottery tickets (IMP with rewinding to the pretrained weights) on sentence polarity, the
  `bertology prune` sweep: the highest sparsity whose ticket still matches the full model.
- `michel2019`: iterative head pruning (the prune sweep's heads_good / heads_random / heads_bad,
  Prasanna et al.'s equal-size subnetworks): heads removable within one point of dev accuracy, and
  good > random > bad subnetworks.
- `sanh2019`: task distillation of a fine-tuned 6-layer MiniLM into a 3-layer student (`bertology
  distill`): the share of the teacher's test accuracy kept.
- `houlsby2019`: BitFit, adapters and LoRA against full fine-tuning (`bertology peft`): each
  method's share of the full model's test accuracy, at its parameter fraction.
- `hewitt_manning2019_causal_protocol`: the structural probe on every EWT training tree for SmolLM2.
- `duan2024`: membership inference near chance on a GPT that saw its corpus less than once (LOSS
  attack), and LiRA's true-positive rate at 1% FPR well above 1% on an overfit shadow set's model
  (Carlini et al. 2022).

Accuracies of the drivers are stored without per-item predictions, so their 95% CIs here are the
binomial (Wald) ones, and a difference of two on the same test sentences takes them as independent
(wider than a paired interval would be).
"""

from __future__ import annotations

import math
from pathlib import Path

from app.reproduce import rows as base
from app.reproduce.spec import AllOf, Citation, InRange, IntervalsAbove, IntervalsBelow, Measurement, PaperValue, Row
from workbench.errors import ConfigError

Z = 1.959963984540054
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# expected wall time of the real row: (2 shared CPU cores, one thread; one GPU), minutes
FULL_MINUTES = {"duan2024": (3, 1), "chen2020": (120, 10), "michel2019": (15, 3), "sanh2019": (10, 2), "houlsby2019": (8, 2),
                "hewitt_manning2019_causal_protocol": (120, 10)}
# the real rows' fine-tuning recipe (experiments/prune/minilm_polarity_cpu3.yaml's, one seed)
FINETUNE = {"checkpoint": MINILM, "task": "sentence_polarity", "seeds": [0], "epochs": 2, "lr": 1.0e-4,
            "batch_size": 16, "max_len": 32, "patience": 2, "max_train_examples": 1000, "max_eval_examples": 500,
            "baselines": False, "device": "cpu", "progress": False}
QUICK_FINETUNE = {"epochs": 1, "lr": 1.0e-3, "max_train_examples": 64, "max_eval_examples": 48, "patience": 1}


def finetune_settings(ctx, **changes) -> dict:
    s = dict(FINETUNE, threads=ctx.threads, **changes)
    if ctx.quick:
        s.update(QUICK_FINETUNE, checkpoint=ctx.models["encoder"])
    return s


def folder(ctx, kind: str, name: str) -> str:
    return str(Path(ctx.store.root) / kind / (name + ("-quick" if ctx.quick else "")))


def wald(acc: float, n: int) -> tuple[float, float, float]:
    se = math.sqrt(max(acc * (1 - acc), 1e-12) / max(n, 1))
    return acc, acc - Z * se, acc + Z * se


def difference(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, float, float]:
    """acc_a - acc_b with a Wald CI, the two taken as independent."""
    (pa, na), (pb, nb) = a, b
    se = math.sqrt(pa * (1 - pa) / max(na, 1) + pb * (1 - pb) / max(nb, 1))
    d = pa - pb
    return d, d - Z * se, d + Z * se


def ratio(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, float, float]:
    """acc_a / acc_b with a delta-method CI (independent)."""
    (pa, na), (pb, nb) = a, b
    if pb <= 0:
        raise ConfigError("a reference accuracy of 0: no retention to compute")
    r = pa / pb
    rel = math.sqrt(pa * (1 - pa) / max(na, 1) / max(pa, 1e-12) ** 2 + pb * (1 - pb) / max(nb, 1) / pb ** 2)
    return r, r - Z * r * rel, r + Z * r * rel


def model_layers(checkpoint: str) -> int:
    """The number of transformer layers in a checkpoint folder's config.json."""
    import json

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if key in config:
            return int(config[key])
    raise ConfigError(f"{checkpoint}: config.json names no layer count")


def cited_finding(key: str, label: str = "") -> PaperValue:
    """A citations.yaml entry as a finding (no single number for our table)."""
    e = base.citations()[key]
    return PaperValue(Citation(paper=e["paper"], where=e["where"], quote=e.get("quote") or "",
                               verified=bool(e.get("verified")), source=e.get("source_url") or "",
                               note=e.get("note") or ""), None, label)


# --------------------------------------------------------------------------- Chen et al. 2020
def measure_tickets(ctx) -> Measurement:
    """IMP tickets (rounds of 10% of the original weights, rewound to the pretrained weights, each
    retrained) of the fine-tuned encoder: the highest sparsity whose test accuracy is within one
    standard error of the full model's (Chen et al.'s "matching": within one sd of the full model)."""
    from workbench.drivers.prune_sweep import load_prune_config, run_prune

    top = 0.3 if ctx.quick else 0.7
    cfg, ft = load_prune_config({"finetune": finetune_settings(ctx), "methods": ["imp"], "sparsities": [top],
                                 "imp_step": 0.1, "rewind_step": 0, "keep_checkpoints": False, "progress": False,
                                 "name": "reproduce-tickets", "output_dir": folder(ctx, "prune", "reproduce-tickets")})
    result = run_prune(cfg, ft, store=ctx.store)
    full = next(p for p in result.points if p["method"] == "full")
    f_acc, f_n = full["test"]["accuracy"], full["test"]["n"]
    se = math.sqrt(f_acc * (1 - f_acc) / f_n)
    imp = sorted((p for p in result.points if p["method"] == "imp"), key=lambda p: p["amount"])
    matching = [p["amount"] for p in imp if p["test"]["accuracy"] >= f_acc - se]
    best = max(matching, default=0.0)
    return Measurement(value=best, model=base.model_name(ft.checkpoint), data="sentence polarity (test split)",
                       detail=f"full {f_acc:.3f} (n {f_n}, se {se:.3f}); IMP " + ", ".join(
                           f"{p['amount']:.0%} {p['test']['accuracy']:.3f}" for p in imp),
                       components={"highest matching sparsity": (best, best, best)}, run_ids=(result.run_id,))


# --------------------------------------------------------------------------- Michel et al. 2019 / Prasanna et al. 2020
def measure_heads(ctx) -> Measurement:
    """Head pruning of the fine-tuned encoder in three orders: the share of heads the good order
    removes with dev accuracy within one point of the full model's, and the test accuracies of the
    good subnetwork and of Prasanna et al.'s random and bad ones of its size (not re-fine-tuned)."""
    from workbench.drivers.prune_sweep import load_prune_config, run_prune

    heads = {"fraction": 0.1, "step_of": "total", "threshold": 0.9, "subnetworks": "equal_size",
             "importance_examples": 16 if ctx.quick else 128}
    cfg, ft = load_prune_config({"finetune": finetune_settings(ctx, lr=2.0e-4 if not ctx.quick else 1.0e-3),
                                 "methods": ["heads_good", "heads_random", "heads_bad"], "heads": heads,
                                 "keep_checkpoints": False, "progress": False, "name": "reproduce-heads",
                                 "output_dir": folder(ctx, "prune", "reproduce-heads")})
    result = run_prune(cfg, ft, store=ctx.store)
    pts = result.points
    full = next(p for p in pts if p["method"] == "full")
    good = sorted((p for p in pts if p["method"] == "heads_good"), key=lambda p: p["amount"])
    if not good:
        raise ConfigError("the head-pruning sweep wrote no heads_good points")
    n_heads = good[0]["n_heads"]
    within = [n_heads - p["n_heads_kept"] for p in good if p["dev"]["accuracy"] >= full["dev"]["accuracy"] - 0.01]
    share = max(within, default=0) / n_heads

    def sub(method):
        found = [p for p in pts if p["method"] == method]
        if not found:
            raise ConfigError(f"the head-pruning sweep wrote no {method} point")
        return found[-1]

    rnd, bad = sub("heads_random_equal_size"), sub("heads_bad_equal_size")
    kept = rnd["n_heads_kept"]
    good_sub = min((p for p in good if p["n_heads_kept"] >= kept), key=lambda p: p["n_heads_kept"])
    acc = {k: (p["test"]["accuracy"], p["test"]["n"]) for k, p in (("good", good_sub), ("random", rnd), ("bad", bad))}
    return Measurement(value=share, model=base.model_name(ft.checkpoint), data="sentence polarity (dev: pruning, test: subnetworks)",
                       detail=f"full dev {full['dev']['accuracy']:.3f}; {max(within, default=0)} of {n_heads} heads removed "
                              f"within one point; subnetworks of {kept} heads, test: " +
                              ", ".join(f"{k} {a:.3f}" for k, (a, _) in acc.items()),
                       components={"share of heads removable within one point": (share, share, share),
                                   "good - random": difference(acc["good"], acc["random"]),
                                   "random - bad": difference(acc["random"], acc["bad"])},
                       run_ids=(result.run_id,))


# --------------------------------------------------------------------------- Sanh et al. 2019
def measure_distillation(ctx) -> Measurement:
    """The fine-tuned encoder (teacher) distilled into a student of half its layers (every other
    teacher layer, T = 2, alpha 0.5): the student's test accuracy over the teacher's."""
    from workbench.drivers.distill import load_distill_config, run_distill
    from workbench.drivers.finetune import load_finetune_config, run_finetune
    from app.fields import row_field

    teacher = run_finetune(load_finetune_config(dict(finetune_settings(ctx), name="reproduce-teacher",
                                                     output_dir=folder(ctx, "finetune", "reproduce-teacher"))),
                           store=ctx.store)
    seed = teacher.seeds[0]
    depth = max(1, model_layers(seed.checkpoint) // 2)
    cfg = load_distill_config({"teacher": seed.checkpoint, "name": "reproduce-distill", "depths": [depth],
                               "inits": ["teacher"], "temperatures": [2.0], "alphas": [0.5], "seeds": [0],
                               "epochs": FINETUNE["epochs"] if not ctx.quick else 1,
                               "lr": FINETUNE["lr"] if not ctx.quick else 1.0e-3, "batch_size": 16, "max_len": 32,
                               "max_train_examples": 64 if ctx.quick else 1000, "max_eval_examples": 48 if ctx.quick else 500,
                               "device": "cpu", "threads": ctx.threads, "progress": False,
                               "output_dir": folder(ctx, "distill", "reproduce-distill")})
    result = run_distill(cfg, store=ctx.store, executor=None)
    rows = result.rows
    acc = rows[(rows["metric"] == "accuracy") & (rows["split"] == "test")]
    roles = row_field(acc, "role", "distill")
    t, s = acc[roles == "teacher"].iloc[0], acc[roles == "student"].iloc[0]
    t_acc, s_acc = (float(t["value"]), int(t["n"])), (float(s["value"]), int(s["n"]))
    kept = ratio(s_acc, t_acc)
    start = base.model_name(finetune_settings(ctx)["checkpoint"])
    return Measurement(value=kept[0], low=kept[1], high=kept[2], model=f"{start} fine-tuned -> {depth}-layer student",
                       data="sentence polarity (test split)",
                       detail=f"teacher test {t_acc[0]:.3f}, {depth}-layer student {s_acc[0]:.3f}",
                       components={"accuracy kept": kept}, run_ids=(teacher.run_id, result.run_id))


# --------------------------------------------------------------------------- PEFT
PEFT_METHODS = ("bitfit", "adapter", "lora")


def measure_peft(ctx) -> Measurement:
    """Full fine-tuning, BitFit, adapters and LoRA on the same task (the peft sweep, each method at its
    usual learning rate): each method's test accuracy over the full model's, and its trainable share."""
    from app.fields import row_field
    from workbench.drivers.peft_sweep import load_sweep_config, run_sweep

    ft = finetune_settings(ctx, name="reproduce-peft", lora_r=8, lora_alpha=16, adapter_size=64 if not ctx.quick else 8)
    ft["epochs"] = 1
    cfg = load_sweep_config({"finetune": ft, "methods": ["full", *PEFT_METHODS], "cka_sentences": 20 if ctx.quick else 100,
                             "lr": {"full": 5.0e-5, "bitfit": 1.0e-3, "adapter": 1.0e-3, "lora": 5.0e-4},
                             "name": "reproduce-peft" + ("-quick" if ctx.quick else "")})
    run_id, rows = run_sweep(cfg, store=ctx.store, progress=False)
    acc = rows[(rows["metric"] == "accuracy") & (rows["split"] == "test")]
    method = row_field(acc, "method", "peft")
    trainable = rows[rows["metric"] == "trainable_parameters"]
    t_method = row_field(trainable, "method", "peft")
    get = {m: (float(acc[method == m]["value"].iloc[0]), int(acc[method == m]["n"].iloc[0])) for m in ("full", *PEFT_METHODS)}
    total = float(trainable[t_method == "full"]["value"].iloc[0])
    parts, detail = {}, [f"full {get['full'][0]:.3f}"]
    for m in PEFT_METHODS:
        parts[f"{m} / full"] = ratio(get[m], get["full"])
        share = float(trainable[t_method == m]["value"].iloc[0]) / total
        detail.append(f"{m} {get[m][0]:.3f} ({share:.2%} of the parameters)")
    low = min(parts.values(), key=lambda p: p[0])
    return Measurement(value=low[0], low=low[1], high=low[2], model=base.model_name(ft["checkpoint"]),
                       data="sentence polarity (test split)", detail="test accuracy: " + ", ".join(detail),
                       components=parts, run_ids=(run_id,))


# --------------------------------------------------------------------------- Duan et al. 2024 / Carlini et al. 2022
ONCE_SEEN = {"family": "gpt", "preset": "tiny", "tokenizer": {"vocab_size": 2000}, "max_len": 64, "batch_size": 16,
             "lr": 3.0e-3, "warmup": 0.05, "steps": 200, "seeds": [0],
             "corpus": {"sources": ["inaugural", "state_union"], "heldout_fraction": 0.1, "seed": 0}}
# experiments/shadows/membership_shadows_tiny.yaml: nine tiny GPTs on halves of 96 sentences, 60 steps at lr 0.02
SHADOW_TRAIN = {"family": "gpt", "preset": "tiny", "tokenizer": {"vocab_size": 1000}, "max_len": 64, "batch_size": 16,
                "lr": 2.0e-2, "warmup": 0.05, "weight_decay": 0.0, "steps": 60,
                "model": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, "eval": {"batches": 0},
                "checkpoints": {"log_spaced": False}, "progress": False}
LIRA_TPR_FLOOR = 0.05  # five times the false-positive rate it is read at


def measure_membership(ctx) -> Measurement:
    """LOSS attack AUC (bootstrap CI over documents) on a tiny GPT trained on 0.3 of one pass of its
    corpus, and LiRA's TPR at 1% FPR on model 0 of a shadow set of tiny GPTs overfit to 48 sentences."""
    from app.reproduce.rows_lm import probe_reusing
    from probes.core.runner import torch_threads
    from workbench.drivers.shadows import train_shadow_set
    from workbench.drivers.train import train_from_config

    name = "reproduce-mia-once" + ("-quick" if ctx.quick else "")
    once = dict(ONCE_SEEN, name=name, progress=ctx.progress, output_dir=str(Path(ctx.store.root) / "train" / name),
                checkpoints={"log_spaced": False, "every": 10 ** 9})
    if ctx.quick:
        once.update(steps=30, corpus=dict(ONCE_SEEN["corpus"], max_documents=40))
    with torch_threads(ctx.threads):
        target = str(train_from_config(once)[0])
    n = 100 if ctx.quick else 500
    run_a, rows_a = probe_reusing(ctx, "membership", target, {"tasks": ["attacks"], "attacks": ["loss"], "n_examples": n,
                                                              "baselines": []})
    auc = rows_a[(rows_a["task"] == "loss") & (rows_a["metric"] == "auc")].iloc[0]

    shadows = folder(ctx, "shadows", "reproduce-lira")
    n_models, docs = (4, 96) if ctx.quick else (9, 96)
    train = dict(SHADOW_TRAIN, name="reproduce-lira")
    if ctx.quick:
        train.update(steps=20, batch_size=8, max_len=32)
    with torch_threads(ctx.threads):
        train_shadow_set(train, {"sources": ["sentence_polarity"], "max_documents": docs, "seed": 0}, n_models, shadows,
                         progress=False)
    # model 0's last step (its training folder would also hold step 0, the untrained start)
    target_b = max((Path(shadows) / "model-00" / "seed-0").glob("step-*"))
    # a global variance (fix_variance): the paper's remedy when there are few shadows (9 here, 256 there);
    # per-example variances of 8 shadows give a TPR at FPR 0 of 0.02 on this set (AUC 0.96 either way)
    run_b, rows_b = probe_reusing(ctx, "membership", str(target_b),
                                  {"tasks": ["attacks"], "attacks": ["lira"], "shadows": shadows, "n_examples": 1000,
                                   "min_words": 1, "length_bin": 4, "fix_variance": True, "baselines": []})
    lira = rows_b[(rows_b["task"] == "lira_online") & (rows_b["metric"] == "tpr_fpr_1pct")]
    if lira.empty:
        raise ConfigError("the membership probe wrote no lira_online rows")
    best = lira.iloc[0]
    tpr = float(best["value"])
    lira_auc = rows_b[(rows_b["task"] == best["task"]) & (rows_b["metric"] == "auc")]["value"]
    non_members = int(best["n"]) // 2
    a = (float(auc["value"]), float(auc["ci_low"]), float(auc["ci_high"]))
    return Measurement(value=a[0], low=a[1], high=a[2], model=f"{base.model_name(target)}; shadow model 0 of {n_models}",
                       data="once-seen: inaugural + State of the Union passages (members: train split, non-members: "
                            f"held out); overfit: {docs} sentence-polarity sentences, each model on half",
                       detail=f"LOSS AUC {a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}] (once-seen); {best['task']} TPR at 1% FPR "
                              f"{tpr:.3f} (of about {non_members} non-members, so no false positive allowed), AUC "
                              f"{float(lira_auc.iloc[0]) if len(lira_auc) else math.nan:.3f} (overfit)",
                       components={"once-seen LOSS AUC": a, "LiRA TPR at 1% FPR (overfit)": (tpr, tpr, tpr)},
                       run_ids=(run_a, run_b))


# --------------------------------------------------------------------------- Hewitt & Manning, causal, their protocol
def measure_structural_protocol(ctx) -> Measurement:
    """The structural probe under Hewitt & Manning's protocol on the causal LM; `--quick` runs the
    workbench protocol on its capped sentences (the protocol sets the training trees itself)."""
    return base.measure_structural(ctx, "causal", "workbench" if ctx.quick else "hewitt-manning")


# --------------------------------------------------------------------------- the rows
def full_rows() -> list[Row]:

    def minutes(key):
        return FULL_MINUTES[key][0]

    peft_test = AllOf(tuple(InRange(0.95, math.inf, f"{m} / full") for m in PEFT_METHODS))
    return [
        Row(key="chen2020", finding="IMP finds matching subnetworks (lottery tickets) of a pretrained encoder at 40-90% sparsity",
            paper=cited_finding("chen2020_bert_tickets_sparsity_range", "sparsity of matching subnetworks"),
            paper_setting="BERT-base, GLUE and SQuAD, IMP rewound to the pretrained weights",
            our_setting=f"bertology prune: MiniLM on sentence polarity, IMP 10% per round to 70%, one seed "
                        f"(~{FULL_MINUTES['chen2020'][0]} min CPU, ~{FULL_MINUTES['chen2020'][1]} min GPU)",
            test=InRange(0.4, 0.9, "highest matching sparsity"), measure=measure_tickets, models=(MINILM,),
            full=True, minutes=minutes("chen2020")),
        Row(key="michel2019", finding="many heads can be removed at test time within one point; good > random > bad "
                                      "subnetworks (Prasanna et al. 2020)",
            paper=base.cited("michel2019_heads_prunable"),
            paper_setting="BERT-base on MNLI, iterative pruning by head importance; Prasanna et al.: good/random/bad re-fine-tuned",
            our_setting=f"bertology prune --methods heads_good,heads_random,heads_bad (equal-size subnetworks, evaluated "
                        f"without re-fine-tuning) on MiniLM, sentence polarity (~{FULL_MINUTES['michel2019'][0]} min CPU, "
                        f"~{FULL_MINUTES['michel2019'][1]} min GPU)",
            test=AllOf((InRange(0.2, 1.0, "share of heads removable within one point"),
                        IntervalsAbove(("good - random", "random - bad"), 0.0, "good > random > bad"))),
            measure=measure_heads, models=(MINILM,), full=True, minutes=minutes("michel2019")),
        Row(key="sanh2019", finding="a student of half the teacher's layers keeps about 97% of its accuracy (DistilBERT)",
            paper=base.cited("sanh2019_distilbert_retention", "language_understanding_retained_pct", 0.01,
                             label="share of the teacher's performance kept"),
            paper_setting="BERT-base (12 layers) distilled into 6 layers during pretraining, GLUE",
            our_setting=f"bertology finetune (teacher) + bertology distill: MiniLM (6 layers) -> 3-layer student, task "
                        f"distillation on sentence polarity (~{FULL_MINUTES['sanh2019'][0]} min CPU, "
                        f"~{FULL_MINUTES['sanh2019'][1]} min GPU)",
            test=AllOf((IntervalsAbove(("accuracy kept",), 0.9, "the student keeps over 90% of the teacher's accuracy"),)),
            measure=measure_distillation, models=(MINILM,), full=True, minutes=minutes("sanh2019"), ratio=True),
        Row(key="houlsby2019", finding="adapters, BitFit and LoRA come within a few percent of full fine-tuning while "
                                       "training a small fraction of the parameters",
            paper=cited_finding("houlsby2019_adapters_within_04", "gap to full fine-tuning"),
            paper_setting="BERT-large on GLUE (adapters: 3.6% of the parameters per task)",
            our_setting=f"bertology peft --methods full,bitfit,adapter,lora on MiniLM, sentence polarity, one epoch "
                        f"(~{FULL_MINUTES['houlsby2019'][0]} min CPU, ~{FULL_MINUTES['houlsby2019'][1]} min GPU)",
            test=peft_test, measure=measure_peft, models=(MINILM,), full=True, minutes=minutes("houlsby2019")),
        Row(key="hewitt_manning2019_causal_protocol", finding="the structural probe on every EWT training tree for a causal LM",
            paper=base.cited("hewittmanning2019_bert_base7_uuas_dspr", "uuas", 0.01),
            paper_setting="BERT-base, PTB WSJ, all training trees, test",
            our_setting=f"bertology probe syntax --tasks structural-distance --protocol hewitt-manning on SmolLM2 "
                        f"(~{FULL_MINUTES['hewitt_manning2019_causal_protocol'][0]} min CPU, "
                        f"~{FULL_MINUTES['hewitt_manning2019_causal_protocol'][1]} min GPU)",
            test=base.hewitt_manning_test(), measure=measure_structural_protocol,
            models=(base.SMOLLM,), full=True, minutes=minutes("hewitt_manning2019_causal_protocol"), ratio=True),
        Row(key="duan2024", finding="membership inference barely beats chance on a model that saw its data once; "
                                    "LiRA finds members at low false-positive rates on an overfit one (Carlini et al. 2022)",
            paper=cited_finding("duan2024_mia_near_random"),
            paper_setting="Pythia 160M-12B on the Pile (one pass), MIMIR; LiRA: models trained with many shadow models",
            our_setting=f"tiny GPT 200 steps (0.3 pass) + bertology probe membership --attacks loss; shadow set of 9 tiny "
                        f"GPTs (experiments/shadows/membership_shadows_tiny.yaml) + --attacks lira --fix-variance on model 0 "
                        f"(~{FULL_MINUTES['duan2024'][0]} min CPU, ~{FULL_MINUTES['duan2024'][1]} min GPU)",
            test=AllOf((IntervalsBelow(("once-seen LOSS AUC",), 0.6, "near chance: below 0.6"),
                        InRange(LIRA_TPR_FLOOR, 1.0, "LiRA TPR at 1% FPR (overfit)"))),
            measure=measure_membership, full=True, minutes=minutes("duan2024")),
    ]
