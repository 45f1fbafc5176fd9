"""The cost of every checkpoint (workbench/cost.py): FLOPs hand counts per family, energy measured vs
estimated, costs adding along a lineage, old checkpoints reconstructed or unknown, `bertology cost`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from workbench import cost as cost_mod
from workbench.cost import (EnergyMeter, checkpoint_cost, cost_of_manifest, cost_record, flops_per_token, own_cost,
                            totals)
from workbench.families import get_family

V, S = 1000, 64  # vocabulary and attention span of every hand count below

# Hand counts of the FORWARD matmul FLOPs per token of each family's tiny preset (2 multiply-adds
# = 2 FLOPs per weight and token); training = 3 x forward. Per BERT-shaped layer of width d, FFN f
# and span s: Q,K,V,O 4 x 2d^2 = 8d^2, scores QK^T and weights x V 2 x 2sd = 4sd, FFN 2 x 2df = 4df.
BERT_LAYERS = 2 * (8 * 64 * 64 + 4 * S * 64 + 4 * 64 * 128)          # 163,840
MLM_HEAD = 0.15 * (2 * 64 * 64 + 2 * 64 * V)                          # transform + decoder on 15% of tokens
HAND_FORWARD = {
    "bert": BERT_LAYERS + MLM_HEAD,                                   # 184,268.8
    "roberta": BERT_LAYERS + MLM_HEAD,
    # DeBERTa adds content->position and position->content scores: 2 x 2sd per layer
    "deberta": BERT_LAYERS + 2 * 4 * S * 64 + MLM_HEAD,
    # SpanBERT adds the span-boundary MLP (3d -> d -> d) and its decoder on the predicted tokens
    "spanbert": BERT_LAYERS + MLM_HEAD + 0.15 * (2 * 3 * 64 * 64 + 2 * 64 * 64 + 2 * 64 * V),
    # ALBERT: E=32 -> H=64 projection; head H -> E then E -> V
    "albert": BERT_LAYERS + 2 * 32 * 64 + 0.15 * (2 * 64 * 32 + 2 * 32 * V),   # 178,150.4
    # ELECTRA: discriminator (E 32 -> H 64, 2 layers, head H->H->1 on every token) + generator
    # (E 32 -> 16, 2 layers of width 16 / FFN 64, MLM head 16 -> 32 -> V on 15%)
    "electra": (BERT_LAYERS + 2 * 32 * 64 + (2 * 64 * 64 + 2 * 64)
                + 2 * (8 * 16 * 16 + 4 * S * 16 + 4 * 16 * 64) + 2 * 32 * 16 + 0.15 * (2 * 16 * 32 + 2 * 32 * V)),
    # GPT: FFN 4d = 256, LM head on every token
    "gpt": 2 * (8 * 64 * 64 + 4 * S * 64 + 4 * 64 * 256) + 2 * 64 * V,  # 357,376
    # T5 (d 64, 2 heads x d_kv 32 = 64, FFN 128): encoder; decoder on 0.15 x (1 + 1/3) = 0.2 target
    # tokens per input token (span 12.8): self-attention + FFN, cross-attention Q/O and scores over
    # the 64 inputs; cross K/V once per input token; LM head per target token
    "t5": (BERT_LAYERS + 0.2 * 2 * (8 * 64 * 64 + 4 * 12.8 * 64 + 4 * 64 * 128) + 0.2 * 2 * 4 * 64 * 64
           + 2 * 4 * 64 * 64 + 0.2 * 2 * 4 * S * 64 + 0.2 * 2 * 64 * V),          # 262,840.32
    # BART: same shapes, the decoder reconstructs the whole input (1 target token per input token)
    "bart": 2 * BERT_LAYERS + 2 * 4 * 64 * 64 + 2 * 4 * 64 * 64 + 2 * 4 * S * 64 + 2 * 64 * V,   # 553,984
    # ELMo: char CNN widths 1,2,3 (16,16,32 filters, 16-d chars, 20 chars), highway 64 -> 128,
    # projection 64 -> 32, 2 directions x 2 layers of LSTM(4 gates x 64 cells over [32 in, 32 rec])
    # + projection 64 -> 32, the shared softmax 32 -> V for each direction
    "elmo": ((2 * 1 * 16 * 16 * 20 + 2 * 2 * 16 * 16 * 19 + 2 * 3 * 16 * 32 * 18) + 2 * 64 * 128 + 2 * 64 * 32
             + 2 * 2 * (2 * 4 * 64 * (32 + 32) + 2 * 64 * 32) + 2 * 2 * 32 * V),      # 380,928
}


@pytest.mark.parametrize("family", sorted(HAND_FORWARD))
def test_flops_per_token_of_each_family_equal_a_hand_count(family):
    spec = get_family(family)
    got = flops_per_token(family, spec.model_config("tiny"), V, S, spec.objective)
    assert got["total"] == pytest.approx(3 * HAND_FORWARD[family], rel=1e-12)
    assert got["total"] == pytest.approx(sum(v for k, v in got.items() if k != "total"))


def test_hand_counts_written_as_numbers():
    """The arithmetic above, spelled out for three of them."""
    assert HAND_FORWARD["bert"] == pytest.approx(184_268.8)
    assert HAND_FORWARD["gpt"] == 357_376
    assert HAND_FORWARD["elmo"] == 380_928


def test_the_training_benchmark_uses_the_same_count():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_train import flops_per_token as bench_count

    cfg = get_family("bert").model_config("tiny")
    assert bench_count(cfg, V, S, 1.0) == flops_per_token("bert", cfg, V, S, head_fraction=1.0)
    assert bench_count(cfg, V, S, 0.15)["total"] == pytest.approx(3 * HAND_FORWARD["bert"])


# ---- energy: measured vs estimated -------------------------------------------------------------------

def test_energy_is_measured_from_rapl_when_the_counter_exists(tmp_path, monkeypatch):
    pkg = tmp_path / "intel-rapl:0"
    pkg.mkdir()
    counter = pkg / "energy_uj"
    counter.write_text("5000000\n")
    monkeypatch.setattr(cost_mod, "_rapl_files", lambda: [counter])
    meter = EnergyMeter({"kind": "cpu", "name": "x", "count": 1, "threads": 1})
    counter.write_text("7500000\n")  # 2.5 J later
    joules, source = meter.reading()
    assert source == "measured: rapl"
    assert joules == pytest.approx(2.5)


def test_energy_is_estimated_from_cpu_seconds_without_a_counter(monkeypatch):
    monkeypatch.setattr(cost_mod, "_rapl_files", lambda: [])
    monkeypatch.setenv("BERTOLOGY_CPU_WATTS_PER_CORE", "10")
    meter = EnergyMeter({"kind": "cpu", "name": "x", "count": 1, "threads": 1})
    c0 = time.process_time()
    x = 0
    while time.process_time() - c0 < 0.2:  # burn 0.2 CPU seconds
        x += 1
    joules, source = meter.reading()
    used = time.process_time() - c0
    assert source.startswith("estimated: 10 W per busy core")
    assert 10 * 0.2 <= joules <= 10 * used + 0.5


def test_bad_power_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("BERTOLOGY_GRID_GCO2_PER_KWH", "lots")
    with pytest.raises(ValueError, match="BERTOLOGY_GRID_GCO2_PER_KWH"):
        own_cost(flops=1.0, flops_per_token=1.0, tokens=1, seconds=1.0, device={"count": 1}, energy_joules=1.0,
                 energy_source="x", what="x")


def test_kwh_and_co2_follow_pue_and_grid(monkeypatch):
    monkeypatch.setenv("BERTOLOGY_PUE", "1.5")
    monkeypatch.setenv("BERTOLOGY_GRID_GCO2_PER_KWH", "400")
    own = own_cost(flops=2.0, flops_per_token=1.0, tokens=2, seconds=7200.0, device={"count": 2},
                   energy_joules=3.6e6, energy_source="estimated: test", what="x")
    assert own["energy_kwh"] == pytest.approx(1.5)          # 1 kWh at the device x PUE 1.5
    assert own["co2e_kg"] == pytest.approx(0.6)             # 1.5 kWh x 400 g
    assert own["device_hours"] == pytest.approx(4.0)        # 2 h x 2 devices


# ---- totals along a lineage --------------------------------------------------------------------------

def test_totals_add_and_unknown_is_never_zero():
    own = {"flops": 10.0, "device_hours": 1.0, "energy_kwh": 2.0, "co2e_kg": 3.0}
    parent = {"flops": 5.0, "device_hours": 0.5, "energy_kwh": 1.0, "co2e_kg": 1.0, "known": True}
    t = totals(own, parent)
    assert (t["flops"], t["device_hours"], t["energy_kwh"], t["co2e_kg"], t["known"]) == (15.0, 1.5, 3.0, 4.0, True)
    unknown = totals(own, {"flops": None, "device_hours": None, "energy_kwh": None, "co2e_kg": None, "known": False})
    assert unknown["flops"] is None and unknown["energy_kwh"] is None and unknown["known"] is False


def test_old_manifest_without_cost_is_reconstructed_or_unknown():
    spec = get_family("bert")
    old = {"family": "bert", "model_config": spec.model_config("tiny"), "objective": spec.objective,
           "tokenizer": {"vocab_size": V}, "config": {"max_len": S}, "tokens_seen": 1000, "elapsed_seconds": 36.0,
           "world_size": 1}
    rec = cost_of_manifest(old)
    assert rec["reconstructed"] is True
    assert rec["own"]["flops"] == pytest.approx(1000 * 3 * HAND_FORWARD["bert"])
    assert rec["own"]["energy_source"].startswith("estimated")
    hub = cost_of_manifest({})
    assert hub["total"]["flops"] is None and hub["total"]["known"] is False and "unknown" in hub


@pytest.mark.slow
def test_a_lora_fine_tuning_records_its_methods_flops(tmp_path, monkeypatch):
    """`bertology finetune --method lora` records the LoRA count (2x body weights, 3x scores and
    head, 3x the A and B matrices measured on the attached model), not full fine-tuning's 3x; own
    FLOPs = that per token x the tokens trained."""
    from tests.training_helpers import run_tiny_training, tiny_finetune_config
    from workbench.store.checkpoints import read_manifest
    from workbench.cost import finetune_flops
    from workbench.drivers.finetune import run_finetune
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    run = run_tiny_training("bert", 2, tmp_path / "train", max_len=S)
    cfg = tiny_finetune_config(run.checkpoint, tmp_path / "ft", max_train_examples=32, max_eval_examples=16,
                               method="lora", lora_r=4)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"))
    m = read_manifest(Path(res.seeds[0].checkpoint))
    basis, own = m["cost_basis"], m["cost"]["own"]
    span = max(1, round(basis["mean_train_length"]))
    lora_forward = 2 * 2 * 2 * (64 * 4 + 4 * 64)  # 2 FLOPs x 2 layers x (query, value) x (A + B weights)
    want = finetune_flops("bert", get_family("bert").model_config("tiny"), span, 2, "lora", lora_forward)["total"]
    full = finetune_flops("bert", get_family("bert").model_config("tiny"), span, 2, "full")["total"]
    assert basis["flops"]["method"] == "lora" and basis["flops"]["forward"]["method_modules"] == lora_forward
    assert own["flops_per_token"] == pytest.approx(want) and own["flops"] == pytest.approx(want * own["tokens"])
    assert want < 0.8 * full


@pytest.mark.slow
def test_costs_add_along_a_lineage(tmp_path, monkeypatch):
    """Pretrain a tiny BERT -> fine-tune it -> derive (mask a head) and save: each checkpoint's
    total = own + parent's total; the pretraining FLOPs = hand count x tokens seen."""
    from tests.training_helpers import run_tiny_training, tiny_finetune_config
    from workbench.store.checkpoints import read_manifest
    from workbench.drivers.finetune import run_finetune
    from workbench.running.models import ModelHandle
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    run = run_tiny_training("bert", 3, tmp_path / "train", max_len=S)
    m = read_manifest(run.checkpoint)
    pre = m["cost"]
    vocab = m["tokenizer"]["vocab_size"]
    fpt = flops_per_token("bert", get_family("bert").model_config("tiny"), vocab, S, m["objective"])["total"]
    assert pre["own"]["flops"] == pytest.approx(fpt * m["tokens_seen"])
    assert pre["parent"] is None and pre["total"]["flops"] == pre["own"]["flops"]
    assert pre["own"]["energy_source"].split(":")[0] in ("measured", "estimated")
    expect = "measured: rapl" if cost_mod._rapl_files() else "estimated"
    assert pre["own"]["energy_source"].startswith(expect)
    assert pre["own"]["device"]["kind"] == "cpu" and pre["own"]["device_hours"] > 0

    cfg = tiny_finetune_config(run.checkpoint, tmp_path / "ft", max_train_examples=32, max_eval_examples=16)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"))
    ft = read_manifest(Path(res.seeds[0].checkpoint))["cost"]
    assert ft["parent"]["checkpoint"] == str(run.checkpoint)
    assert ft["own"]["flops"] > 0 and ft["own"]["tokens"] > 0
    for k in ("flops", "device_hours", "energy_kwh", "co2e_kg"):
        assert ft["total"][k] == pytest.approx(ft["own"][k] + pre["total"][k])

    handle = ModelHandle.load(res.seeds[0].checkpoint)

    def zero_bias(model):
        for name, p in model.named_parameters():
            if name.endswith("attention.output.dense.bias"):
                p.data.zero_()
                break

    derived = handle.derive("zero_bias", {}, apply=zero_bias)
    folder = derived.save(tmp_path / "derived")
    dc = checkpoint_cost(folder)
    assert dc["own"]["flops"] == 0.0
    assert dc["total"]["flops"] == pytest.approx(ft["total"]["flops"])
    assert dc["parent"]["checkpoint"] == res.seeds[0].checkpoint
    assert cost_mod.lineage_chain(folder) == [str(folder), res.seeds[0].checkpoint, str(run.checkpoint)]

    from app.cli import main

    assert main(["cost", str(folder), str(run.checkpoint), "--grid", "100"]) == 0


def test_cost_record_of_a_parent_without_record_is_unknown(tiny_checkpoint):
    rec = cost_record({"flops": 1.0, "device_hours": 0.1, "energy_kwh": 0.1, "co2e_kg": 0.1}, tiny_checkpoint)
    assert rec["parent"]["total"]["known"] is False
    assert rec["total"]["flops"] is None  # never zero


def test_cli_cost_bad_input_is_one_line_exit_2(tmp_path, capsys, tiny_checkpoint):
    from app.cli import main

    assert main(["cost", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing" in err[0]
    assert main(["cost", str(tiny_checkpoint), "--grid", "-3"]) == 2
    assert "--grid" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["cost", str(tmp_path / "empty")]) == 2


def test_cli_cost_table_and_json(tiny_checkpoint, capsys):
    from app.cli import main

    assert main(["cost", str(tiny_checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "tiny-bert" in out and "unknown" in out
    assert main(["cost", str(tiny_checkpoint), "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert list(rec.values())[0]["total"]["known"] is False


def _folder_with_cost(path: Path, flops: float) -> Path:
    path.mkdir()
    own = {"flops": flops, "device_hours": 1.0, "energy_kwh": 2.0, "co2e_kg": 0.5}
    (path / "manifest.json").write_text(json.dumps({"cost": {"own": own, "parent": None, "total": totals(own, None)}}))
    return path


def test_a_distillation_teacher_adds_its_total(tmp_path, tiny_checkpoint):
    parent = _folder_with_cost(tmp_path / "parent", 100.0)
    teacher = _folder_with_cost(tmp_path / "teacher", 1000.0)
    own = {"flops": 10.0, "device_hours": 0.1, "energy_kwh": 0.2, "co2e_kg": 0.05}
    rec = cost_record(own, parent, teacher=teacher)
    assert rec["teacher"]["checkpoint"] == str(teacher)
    assert rec["total"]["flops"] == 1110.0 and rec["total"]["energy_kwh"] == pytest.approx(4.2)
    assert rec["total"]["known"] is True
    unknown_teacher = cost_record(own, parent, teacher=tiny_checkpoint)  # no record: unknown, not zero
    assert unknown_teacher["total"]["flops"] is None and unknown_teacher["total"]["known"] is False
    assert cost_mod.teacher_folder({"teacher": {"class": "BertForMaskedLM", "name_or_path": str(teacher)}}) == str(teacher)
    assert cost_mod.teacher_folder({"trainable": "x"}) is None


def test_cost_rows_of_an_untracked_model_are_nan_not_zero(tiny_checkpoint):
    import math

    from workbench.cost import cost_rows

    rows = cost_rows([tiny_checkpoint])
    assert len(rows) == 10 and {r["split"] for r in rows} == {"own", "total"}  # 5 metrics (6ND included) x 2
    assert all(math.isnan(r["value"]) for r in rows)
    assert rows[0]["extra"]["untracked"] is True and rows[0]["extra"]["known"] is False
    assert rows[0]["model"] == "tiny-bert" and rows[0]["probe"] == "cost"


def test_a_teacher_already_in_the_students_lineage_is_counted_once(tmp_path, monkeypatch):
    """A student initialised from the teacher's layers (`distill_student`, a derived model) has the
    teacher as its parent; distilling it adds the teacher as teacher too: its total must enter once."""
    teacher = _folder_with_cost(tmp_path / "teacher", 1000.0)
    student_init = tmp_path / "student"
    student_init.mkdir()
    derived = cost_mod.derived_cost(json.loads((teacher / "manifest.json").read_text()), str(teacher),
                                    "distill_student")
    (student_init / "manifest.json").write_text(json.dumps({"cost": derived}))
    own = {"flops": 10.0, "device_hours": 0.1, "energy_kwh": 0.2, "co2e_kg": 0.05}
    # the teacher named by another spelling of the same folder (the hooks record name_or_path)
    monkeypatch.chdir(tmp_path)
    rec = cost_record(own, student_init, teacher="teacher")
    assert rec["teacher"]["in_parent_total"] is True
    assert rec["total"]["flops"] == 1010.0 and rec["total"]["energy_kwh"] == pytest.approx(2.2)
    # a randomly initialised student (fresh weights, no parent in its lineage) adds the teacher
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "manifest.json").write_text(json.dumps({"cost": cost_mod.derived_cost(None, None, "random", True)}))
    rec = cost_record(own, fresh, teacher=teacher)
    assert "in_parent_total" not in rec["teacher"] and rec["total"]["flops"] == 1010.0
    other = _folder_with_cost(tmp_path / "parent", 100.0)
    assert cost_record(own, other, teacher=teacher)["total"]["flops"] == 1110.0


# ---- what each fine-tuning method's step computes (Kaplan et al. 2020's 6N split) -------------------

# Tiny BERT classifier body at span S (d 64, FFN 128, 2 layers), 2 labels: the forward per token
BODY_WEIGHTS = 2 * (8 * 64 * 64 + 4 * 64 * 128)   # 131,072: Q,K,V,O and the FFN, weight matmuls
BODY_SCORES = 2 * 4 * S * 64                        # 32,768: Q K^T and P V, matmuls of two activations
HEAD = 2 * 64 * 2                                   # 256: a linear head on every token (upper bound)


def test_fine_tuning_passes_per_method_equal_a_hand_count():
    """6N per token = forward 2N + activation gradients 2N + weight gradients 2N (Kaplan et al.
    2020): full fine-tuning pays all three on every part (3x); a frozen body under a trainable head
    only its forward (1x); LoRA/adapters/BitFit/prompts the forward and the activation gradients of
    the body's weight matmuls (2x), all of the attention scores' backward (3x: both operands are
    activations), and 3x on their own matrices."""
    from workbench.cost import finetune_flops

    cfg = get_family("bert").model_config("tiny")
    want = {
        "full": 3 * (BODY_WEIGHTS + BODY_SCORES + HEAD),                 # 492,288 (the old count for every method)
        "head": BODY_WEIGHTS + BODY_SCORES + 3 * HEAD,                   # 164,608
        "bitfit": 2 * BODY_WEIGHTS + 3 * BODY_SCORES + 3 * HEAD,         # 361,216
        "prompt": 2 * BODY_WEIGHTS + 3 * BODY_SCORES + 3 * HEAD,
        # LoRA r = 8 on Q and V of both layers: A (64 -> 8) and B (8 -> 64), 2 x 1,024 weights each
        "lora": 2 * BODY_WEIGHTS + 3 * BODY_SCORES + 3 * HEAD + 3 * (2 * 2 * 2 * 2 * 64 * 8),
    }
    assert want["full"] == 492_288 and want["head"] == 164_608 and want["bitfit"] == 361_216
    lora_forward = 2 * 2 * 2 * 2 * 64 * 8  # 2 FLOPs x 2 layers x 2 matrices x (A + B: 2 x 64 x 8 weights)
    for method, total in want.items():
        got = finetune_flops("bert", cfg, S, 2, method, lora_forward if method == "lora" else 0.0)
        assert got["total"] == pytest.approx(total, rel=1e-12), method
        assert cost_mod.finetune_flops_per_token("bert", cfg, S, 2, method,
                                                 lora_forward if method == "lora" else 0.0) == got["total"]
    with pytest.raises(KeyError, match="no FLOPs passes for fine-tuning method 'sgd'"):
        finetune_flops("bert", cfg, S, 2, "sgd")


def _tiny_token_classifier(method: str):
    """A tiny BERT token classifier (eager attention: every matmul is one FlopCounterMode sees), the
    method attached and its parameter filter applied as the fine-tuning runner does."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    from workbench.loop import apply_param_filter
    from workbench.running.peft_methods import attach

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    model = BertForTokenClassification(config)
    apply_param_filter(model, attach(model, method))
    return model.train(), config


@pytest.mark.parametrize("method", ["full", "head", "bitfit", "prompt", "lora", "adapter"])
def test_a_measured_training_step_of_each_method_matches_its_count(method):
    """torch's FlopCounterMode over one real step (forward + backward) of a tiny BERT token
    classifier (a linear head on every token, as the count assumes; no pooler). full, BitFit and
    prompt tuning (their trainable embedding LayerNorm bias / prompt rows make every activation need
    its gradient) equal the count exactly; head equals it less the head's input gradient (nothing
    below it trains: the count's 3x on the head is an upper bound); LoRA and adapters are below the
    count by at most the lowest layer's activation-gradient pass (what lies under their first
    trainable module in layer 0 needs no gradient, which autograd skips)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from workbench.cost import finetune_flops, method_forward_flops

    model, config = _tiny_token_classifier(method)
    b, s = 2, 12
    ids = torch.randint(5, 100, (b, s), generator=torch.Generator().manual_seed(1))
    if method == "prompt":
        ids[:, 1:4] = torch.tensor(list(range(100, 103)))  # three of the prompt's vectors
    labels = torch.randint(0, 3, (b, s), generator=torch.Generator().manual_seed(2))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
    measured = counter.get_total_flops()
    extra = method_forward_flops(model) if method in ("lora", "adapter") else 0.0
    count = finetune_flops("bert", config.to_dict(), s, 3, method, extra)
    tokens = b * s
    analytic = count["total"] * tokens
    if method in ("full", "bitfit", "prompt"):
        assert measured == pytest.approx(analytic, rel=1e-9)
    elif method == "head":
        assert measured == pytest.approx(analytic - tokens * count["forward"]["head"], rel=1e-9)
    else:
        d, f, L = 32, 64, 2
        layer0 = (8 * d * d + 4 * d * f) + 2 * (4 * s * d) + extra / L  # its activation gradients, at most
        assert extra > 0
        assert analytic - tokens * layer0 <= measured <= analytic
    # the old count (3x the forward for every method, no term for the method's own matrices) is
    # above what head, BitFit and prompt tuning compute; for adapters of width 64 on this 32-wide
    # body it is below (the adapters' own matrices were not counted at all)
    old = 3 * sum(count["forward"][k] for k in ("body_weights", "body_scores", "head")) * tokens
    if method in ("head", "bitfit", "prompt"):
        assert measured < 0.75 * old
    if method == "adapter":
        assert measured > old


def test_a_distilled_students_flops_include_its_teachers_forwards(tmp_path):
    """Pretraining distillation: the student's step (3x), the teacher's forward on the same batches
    (1x, its MLM head at the masked share) and, for DistilBERT's soft targets over every non-pad
    token, both MLM heads at every position; a fine-tuning student adds its teacher classifier's
    forward over the tokens the teacher ran on (a cached teacher: one epoch's)."""
    from workbench.cost import finetune_cost_flops, teacher_tokens, training_flops_per_token

    spec = get_family("bert")
    tiny = spec.model_config("tiny")
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "manifest.json").write_text(json.dumps({"family": "bert", "model_config": tiny,
                                                       "objective": spec.objective, "label_names": ["a", "b"]}))
    student = {"family": "distilbert", "model_config": {**tiny, "num_hidden_layers": 1}, "objective": spec.objective,
               "tokenizer": {"vocab_size": V}, "config": {"max_len": S},
               "hooks": {"teacher": {"class": "OneSegmentTeacher", "name_or_path": str(teacher)},
                         "loss": {"name": "distilbert_triple", "soft_loss_positions": "non_pad"}}}
    head_all = 2 * 64 * 64 + 2 * 64 * V                          # 136,192 per position
    student_step = 3 * (BERT_LAYERS / 2 + MLM_HEAD)               # 307,046.4
    teacher_forward = HAND_FORWARD["bert"]                        # 184,268.8
    got = training_flops_per_token(student)
    assert got["teacher_forward"] == pytest.approx(teacher_forward)
    assert got["total"] == pytest.approx(student_step + teacher_forward + 3 * head_all + head_all)   # 1,036,083.2
    assert got["total"] == pytest.approx(1_036_083.2)
    masked = {**student, "hooks": {**student["hooks"], "loss": {"name": "distilbert_triple",
                                                                "soft_loss_positions": "masked"}}}
    assert training_flops_per_token(masked)["total"] == pytest.approx(student_step + teacher_forward)
    plain = {k: v for k, v in student.items() if k != "hooks"}
    assert training_flops_per_token(plain)["total"] == pytest.approx(student_step)
    gone = {**student, "hooks": {**student["hooks"], "teacher": {"name_or_path": str(tmp_path / "gone")}}}
    assert training_flops_per_token(gone)["total"] is None  # unknown, never the student's alone

    # task distillation: the teacher classifier's forward per token at the run's mean length
    basis = {"flops_per_token": 1000.0, "mean_train_length": float(S)}
    t_fwd = BODY_WEIGHTS + BODY_SCORES + HEAD                       # 164,096
    assert finetune_cost_flops(basis, 30, None) == 30_000.0
    assert finetune_cost_flops(basis, 30, teacher) == pytest.approx(30_000 + 30 * t_fwd)
    assert finetune_cost_flops(basis, 30, teacher, 10) == pytest.approx(30_000 + 10 * t_fwd)
    assert finetune_cost_flops(basis, 30, tmp_path / "gone") is None

    class Cached:
        cache: dict = {}

    assert teacher_tokens(Cached(), 300, 3) == 100 and teacher_tokens(object(), 300, 3) == 300


# ---- the classifier that runs (issue 49) and Kaplan et al.'s 6ND beside the full count ----------------

# t5-small's shape (Raffel et al. 2020): d 512, 8 heads x d_kv 64 = 512, FFN 2048, 6 + 6 layers; at 64
# tokens, per token. One encoder layer: Q,K,V,O 8 x 512 x 512 + scores/values 4 x 64 x 512 + FFN
# 4 x 512 x 2048 = 6,422,528; x 6 = 38,535,168. The decoder_last classifier adds the decoder on every
# input token (6 self-attention layers as above, 38,535,168) and its cross-attention: Q/O 4 x 512 x 512,
# K/V 4 x 512 x 512, scores/values 4 x 64 x 512 per layer = 2,228,224 x 6 = 13,369,344. No LM head.
T5_SMALL = {"d_model": 512, "d_ff": 2048, "num_heads": 8, "d_kv": 64, "num_layers": 6, "num_decoder_layers": 6}
T5_SMALL_ENCODER = 38_535_168
T5_SMALL_DECODER_LAST = 38_535_168 + 38_535_168 + 13_369_344   # 90,439,680


@pytest.mark.parametrize("classifier,body", [(None, T5_SMALL_DECODER_LAST), ("decoder_last", T5_SMALL_DECODER_LAST),
                                             ("encoder_mean", T5_SMALL_ENCODER), ("token", T5_SMALL_ENCODER)])
def test_a_t5_classifier_is_charged_for_the_stacks_it_runs(classifier, body):
    """Before issue 49 every T5 classifier was charged the pretraining decoder (0.2 target tokens
    per input: 53.8 M here, whatever ran)."""
    fwd = cost_mod.finetune_forward_flops("t5", T5_SMALL, 64, 2, classifier)
    assert fwd["body_weights"] + fwd["body_scores"] == body
    assert fwd["head"] == 2 * 512 * 2
    assert cost_mod.finetune_flops("t5", T5_SMALL, 64, 2, "full", classifier=classifier)["total"] == 3 * (body + 2048)


def test_a_bart_classifier_is_charged_for_the_stacks_it_runs():
    bart = {"d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "encoder_layers": 2, "decoder_layers": 2}
    enc = 2 * (8 * 64 * 64 + 4 * S * 64 + 4 * 64 * 128)              # 163,840
    dec = enc + 2 * (8 * 64 * 64 + 4 * S * 64)                        # + cross-attention Q/O, K/V, scores
    for kind, want in (("decoder_last", enc + dec), ("encoder_mean", enc), ("token", enc)):
        fwd = cost_mod.finetune_forward_flops("bart", bart, S, 3, kind)
        assert fwd["body_weights"] + fwd["body_scores"] == want, kind
    with pytest.raises(KeyError, match="first"):
        cost_mod.finetune_forward_flops("bart", bart, S, 3, "first")


def test_the_fine_tuning_cost_basis_counts_the_pooling_that_runs():
    from types import SimpleNamespace

    from workbench.drivers.finetune import Encoded, finetune_cost_basis

    handle = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(to_dict=lambda: dict(T5_SMALL))))
    train = Encoded(ids=[[1] * 64, [1] * 64], labels=[0, 1])
    mean = finetune_cost_basis(handle, "t5", train, 2, "full", "encoder_mean")
    last = finetune_cost_basis(handle, "t5", train, 2, "full", "decoder_last")
    assert mean["flops_per_token"] == 3 * (T5_SMALL_ENCODER + 2048)
    assert last["flops_per_token"] == 3 * (T5_SMALL_DECODER_LAST + 2048)
    # Kaplan's N of the encoder alone: 6 x (4 x 512 x 512 + 2 x 512 x 2048) = 18,874,368
    assert mean["kaplan_flops_per_token"] == 6 * 18_874_368
    assert last["kaplan_flops_per_token"] == 6 * (18_874_368 + 6 * (8 * 512 * 512 + 2 * 512 * 2048))


# GPT-2 small (Radford et al. 2019): 12 layers of d 768, FFN 3072, 1,024 positions, 50,257 types.
GPT2_SMALL = {"n_embd": 768, "n_layer": 12, "n_inner": None}
GPT2_SMALL_N = 12 * 12 * 768 * 768        # Kaplan et al. 2020: N = 12 n_layer d^2 = 84,934,656


def test_kaplan_n_and_6nd_of_gpt2_small():
    assert cost_mod.non_embedding_params("gpt", GPT2_SMALL) == GPT2_SMALL_N
    assert cost_mod.kaplan_flops_per_token("gpt", GPT2_SMALL) == 6 * GPT2_SMALL_N
    # the full count: Kaplan's forward 2N + 2 n_layer n_ctx d plus the second attention matmul and the LM head
    full = cost_mod.forward_flops_per_token("gpt", GPT2_SMALL, 50257, 1024)["total"]
    assert full == 2 * GPT2_SMALL_N + 2 * (2 * 12 * 1024 * 768) + 2 * 768 * 50257
    assert full / (2 * GPT2_SMALL_N + 2 * 12 * 1024 * 768) == pytest.approx(1.509, abs=1e-3)
    own = own_cost(flops=1.0, flops_per_token=1.0, tokens=1000, seconds=1.0, device={"count": 1}, energy_joules=1.0,
                   energy_source="estimated", what="x", kaplan_per_token=cost_mod.kaplan_flops_per_token("gpt", GPT2_SMALL))
    assert own["kaplan_flops"] == 6 * GPT2_SMALL_N * 1000


def test_kaplan_n_of_other_families_equal_a_hand_count():
    # tiny presets: BERT 2 x (4 x 64^2 + 2 x 64 x 128) = 65,536; ALBERT the same (its shared layer
    # counted per application); ELECTRA adds its generator 2 x (4 x 16^2 + 2 x 16 x 64) = 6,144;
    # ELMo 2 directions x 2 layers x (4 x 64 x (32 + 32) + 64 x 32) = 73,728
    want = {"bert": 65_536, "albert": 65_536, "electra": 65_536 + 6_144, "elmo": 73_728}
    for family, n in want.items():
        assert cost_mod.non_embedding_params(family, get_family(family).model_config("tiny")) == n, family


def test_kaplan_flops_are_filled_in_along_an_old_lineage(tmp_path):
    """Records written before 6ND existed get it on read: own from the manifest's shape and tokens,
    total through the parent's record (which is filled in the same way)."""
    cfg = get_family("gpt").model_config("tiny")
    n = cost_mod.non_embedding_params("gpt", cfg)
    parent, child = tmp_path / "parent", tmp_path / "child"
    old_own = {"flops": 7.0, "tokens": 100, "device_hours": 0.0, "energy_kwh": 0.0, "co2e_kg": 0.0}
    old_total = {"flops": 7.0, "device_hours": 0.0, "energy_kwh": 0.0, "co2e_kg": 0.0, "known": True}
    parent.mkdir()
    (parent / "manifest.json").write_text(json.dumps({"family": "gpt", "model_config": cfg, "cost": {
        "own": old_own, "parent": None, "total": old_total}}))
    child.mkdir()
    (child / "config.json").write_text(json.dumps(cfg))
    (child / "manifest.json").write_text(json.dumps({"kind": "finetune", "family": "gpt", "pooling": "last", "cost": {
        "own": {**old_own, "tokens": 50}, "parent": {"checkpoint": str(parent), "total": old_total},
        "total": {**old_total, "flops": 14.0}}}))
    rec = checkpoint_cost(child)
    assert rec["own"]["kaplan_flops"] == 6 * n * 50
    assert rec["total"]["kaplan_flops"] == 6 * n * 150
    assert rec["total"]["flops"] == 14.0  # the stored full count is left as it was
    rows = cost_mod.cost_rows([child])
    assert {r["value"] for r in rows if r["metric"] == "kaplan_flops"} == {6.0 * n * 50, 6.0 * n * 150}


@pytest.mark.slow
def test_a_t5_fine_tuning_records_the_count_of_its_pooling(tmp_path, monkeypatch):
    """`bertology finetune` on a tiny T5 with encoder_mean records the encoder-only count, with
    decoder_last both stacks over the input (the manifest's cost basis, 6N beside it)."""
    from tests.training_helpers import run_tiny_training, tiny_finetune_config
    from workbench.store.checkpoints import read_manifest
    from workbench.drivers.finetune import run_finetune
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    run = run_tiny_training("t5", 1, tmp_path / "train", max_len=S)
    cfg = get_family("t5").model_config("tiny")
    got = {}
    for pooling in ("encoder_mean", "decoder_last"):
        res = run_finetune(tiny_finetune_config(run.checkpoint, tmp_path / pooling, pooling=pooling,
                                                max_train_examples=16, max_eval_examples=8),
                           store=ResultsStore(tmp_path / "store"))
        m = read_manifest(Path(res.seeds[0].checkpoint))
        span = max(1, round(m["cost_basis"]["mean_train_length"]))
        want = cost_mod.finetune_flops("t5", cfg, span, 2, "full", classifier=pooling)["total"]
        assert m["pooling"] == pooling and m["cost"]["own"]["flops_per_token"] == pytest.approx(want)
        assert m["cost"]["own"]["kaplan_flops"] == pytest.approx(
            cost_mod.kaplan_flops_per_token("t5", cfg, pooling) * m["cost"]["own"]["tokens"])
        got[pooling] = want
    assert got["decoder_last"] > 2 * got["encoder_mean"]
