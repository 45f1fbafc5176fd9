"""Task distillation (workbench.drivers.distill): the layer map, the students' initial weights, the KD loss
against torch's kl_div by hand, the teacher cache, bad configs, and a tiny sweep end to end.

Tiny models: a 4-layer BERT (hidden 32) fine-tuned for one epoch on 64 sentence_polarity sentences.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_bert
from tests.slurm_cluster import SUBMITIT_EXECUTORS, executor_flags
from tests.tolerances import assert_same_outputs, assert_same_state
from tests.training_helpers import tiny_finetune_config
from workbench.drivers.distill import (
    CachedTeacher,
    TaskKD,
    classifier_handle,
    cut_student,
    load_distill_config,
    make_student,
    random_student,
    run_distill,
    student_layers,
    sweep_points,
)
from workbench.errors import ConfigError
from workbench.drivers.finetune import run_finetune
from workbench.running.classifier_loading import load_classifier
from workbench.store.results import ResultsStore


@pytest.fixture(scope="module")
def teacher(tokenizers, tmp_path_factory) -> Path:
    """A 4-layer tiny BERT fine-tuned (one epoch) on sentence_polarity: finetune/.../seed-0/best."""
    root = tmp_path_factory.mktemp("teacher")
    model = tiny_bert(tokenizers["bert"], layers=4)
    model.save_pretrained(root / "pre")
    tokenizers["bert"].save_pretrained(root / "pre")
    cfg = tiny_finetune_config(root / "pre", root / "ft", max_len=32)
    res = run_finetune(cfg, store=ResultsStore(root / "store"))
    return Path(res.seeds[0].checkpoint)


# ------------------------------------------------------------------------------------ layer map

def test_layer_map_is_distilberts_for_12_to_6_and_keeps_first_and_last():
    assert student_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # Sanh et al. 2019's extraction
    assert student_layers(6, 3) == [0, 3, 5]
    assert student_layers(6, 2) == [0, 5]
    assert student_layers(12, 4) == [0, 4, 7, 11]
    assert student_layers(5, 5) == [0, 1, 2, 3, 4]
    assert student_layers(6, 1) == [5]
    for L in range(2, 13):
        for k in range(2, L + 1):
            m = student_layers(L, k)
            assert m[0] == 0 and m[-1] == L - 1 and m == sorted(set(m)), (L, k, m)
    with pytest.raises(ConfigError, match="must be in"):
        student_layers(6, 7)


# ---------------------------------------------------------------------------------------- loss

def _outs(seed=0, n=8, c=3):
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(n, c, generator=g, requires_grad=True)
    zt = torch.randn(n, c, generator=g) * 3
    y = torch.randint(0, c, (n,), generator=g)
    ce_by_hand = -torch.log_softmax(zs, -1)[torch.arange(n), y].mean()
    return SimpleNamespace(logits=zs, loss=F.cross_entropy(zs, y)), SimpleNamespace(logits=zt), y, ce_by_hand


@pytest.mark.parametrize("T,alpha", [(1.0, 0.5), (2.0, 0.9), (4.0, 0.1), (0.5, 1.0)])
def test_kd_loss_is_kl_div_batchmean_times_T2_plus_ce(T, alpha):
    student, teacher, _, ce = _outs()
    terms = TaskKD(T, alpha)(student, {}, teacher)
    kl = F.kl_div(torch.log_softmax(student.logits / T, -1), torch.softmax(teacher.logits / T, -1),
                  reduction="batchmean") * T**2
    assert terms["loss"].item() == pytest.approx((alpha * kl + (1 - alpha) * ce).item(), rel=1e-6)
    assert terms["kd"].item() == pytest.approx(kl.item(), rel=1e-6)
    assert terms["ce"].item() == pytest.approx(ce.item(), rel=1e-6)


def test_alpha_zero_is_plain_cross_entropy_whatever_the_teacher():
    student, teacher, _, ce = _outs()
    terms = TaskKD(3.0, 0.0)(student, {}, teacher)
    assert terms["loss"] is student.loss  # the very CE tensor, not a mixture with weight 0
    (g,) = torch.autograd.grad(terms["loss"], student.logits)
    (g_ce,) = torch.autograd.grad(ce, student.logits)
    torch.testing.assert_close(g, g_ce)


def test_kd_loss_refuses_bad_temperature_and_alpha():
    with pytest.raises(ConfigError, match="temperature"):
        TaskKD(0.0, 0.5)
    with pytest.raises(ConfigError, match="alpha"):
        TaskKD(2.0, 1.5)


# ------------------------------------------------------------------------------------ students

def test_student_weights_are_exactly_the_intended_teacher_layers(teacher):
    t = load_classifier(teacher)
    layers = student_layers(4, 2)
    assert layers == [0, 3]
    s = cut_student(t, layers)
    assert s.config.num_hidden_layers == 2 and len(s.bert.encoder.layer) == 2
    ts, ss = t.state_dict(), s.state_dict()
    for key, value in ss.items():
        if ".encoder.layer." in key:
            j = int(key.split(".encoder.layer.")[1].split(".")[0])
            source = key.replace(f".encoder.layer.{j}.", f".encoder.layer.{layers[j]}.")
        else:
            source = key
        assert torch.equal(value, ts[source]), key
    # every block copied: the student computes exactly what the teacher does
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    full = cut_student(t, [0, 1, 2, 3])
    assert_same_state(full, t)
    assert_same_outputs(full(input_ids=ids).logits, t(input_ids=ids).logits, t.config)


def test_random_student_is_seeded_and_not_the_teachers(teacher):
    t = load_classifier(teacher)
    a, b, c = random_student(t, 2, 0), random_student(t, 2, 0), random_student(t, 2, 1)
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(a.state_dict()[key], b.state_dict()[key])
    assert not torch.equal(a.state_dict()[key], c.state_dict()[key])
    assert not torch.equal(a.state_dict()[key], t.state_dict()[key])


def test_saved_student_records_its_lineage_and_opens_in_plain_transformers(teacher, tmp_path):
    from transformers import AutoModelForSequenceClassification

    th = classifier_handle(teacher)
    student = make_student(th, 2, "teacher")
    student.save(tmp_path / "s")
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    lineage = manifest["derived_from"]
    assert lineage["parent"] == str(teacher) and lineage["parent_sha256"] == th.checkpoint_hash
    assert lineage["params"] == {"init": "teacher", "teacher_layers": [0, 3], "teacher_depth": 4}
    assert lineage["fresh_weights"] is False
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "s").eval()
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    assert_same_state(plain, student.model)  # saved bit for bit; the logits up to the kernels' summation order
    assert_same_outputs(plain(input_ids=ids).logits, student.model(input_ids=ids).logits, plain.config)
    rand = make_student(th, 2, "random", seed=0)
    assert rand.lineage.fresh_weights and rand.lineage.params["depth"] == 2


def test_cached_teacher_gives_the_teachers_logits_and_runs_each_example_once(teacher):
    t = load_classifier(teacher)
    cached = CachedTeacher(t)
    ids = torch.tensor([[2, 40, 41, 3, 0, 0], [2, 50, 51, 52, 53, 3]])
    mask = (ids != 0).long()
    with torch.no_grad():
        direct = t(input_ids=ids, attention_mask=mask).logits
        first = cached(input_ids=ids, attention_mask=mask).logits
        # the first sentence again, padded to another length, next to a new one
        ids2 = torch.tensor([[2, 40, 41, 3], [2, 60, 61, 3]])
        second = cached(input_ids=ids2, attention_mask=torch.ones_like(ids2)).logits
        direct2 = t(input_ids=ids2, attention_mask=torch.ones_like(ids2)).logits
    torch.testing.assert_close(first, direct)
    torch.testing.assert_close(second, direct2, rtol=1e-5, atol=1e-6)
    assert cached.computed == 3 and cached.served == 4


# -------------------------------------------------------------------------------------- config

def _cfg(teacher, tmp_path, **kw):
    base = {"teacher": str(teacher), "depths": [2], "inits": ["teacher"], "temperatures": [2.0], "alphas": [0.5],
            "seeds": [0], "epochs": 1, "max_train_examples": 64, "max_eval_examples": 32, "batch_size": 16,
            "max_len": 32, "lr": 1e-3, "progress": False, "output_dir": str(tmp_path / "sweep"),
            "latency_repeats": 1, "latency_batch": 4}
    return {**base, **kw}


@pytest.mark.parametrize("override,match", [
    ({"temperatures": [2.0, 0.0]}, "temperatures: a temperature must be > 0"),
    ({"temperatures": [-1.0]}, "temperatures: a temperature must be > 0"),
    ({"alphas": [1.2]}, r"alphas: alpha must be in \[0, 1\]"),
    ({"alphas": [-0.1]}, r"alphas: alpha must be in \[0, 1\]"),
    ({"depths": [5]}, r"depths: a student of 5 layers: must be in \[1, 4\]"),
    ({"inits": ["teachers"]}, "inits: unknown init"),
    ({"temperature": [2.0]}, "unknown key"),
])
def test_bad_config_is_one_config_error(teacher, tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        load_distill_config(_cfg(teacher, tmp_path, **override))


def test_teacher_without_a_classification_head_is_refused(tokenizers, tmp_path):
    lm = tmp_path / "lm"
    tiny_bert(tokenizers["bert"]).save_pretrained(lm)
    with pytest.raises(ConfigError, match="teacher: .*no sequence-classification head"):
        load_distill_config(_cfg(lm, tmp_path))
    with pytest.raises(ConfigError, match="not a checkpoint folder"):
        load_distill_config(_cfg(tmp_path / "nowhere", tmp_path))


@pytest.mark.parametrize("extra,match", [
    ("temperatures: [0]", "temperatures: a temperature must be > 0"),
    ("depths: [9]", "depths: a student of 9 layers"),
    ("alphas: [2]", "alphas: alpha must be in"),
])
def test_cli_bad_config_is_one_line_exit_2_and_nothing_written(teacher, tmp_path, capsys, monkeypatch, extra, match):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    path = tmp_path / "d.yaml"
    path.write_text(f"teacher: {teacher}\n{extra}\n")
    assert main(["distill", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bertology: error: ") and match.split(":")[0] in err
    assert not (tmp_path / "runs").exists()


def test_alpha_zero_is_one_point_per_student_whatever_t(teacher, tmp_path):
    cfg = load_distill_config(_cfg(teacher, tmp_path, depths=[2, 1], inits=["teacher", "random"],
                                   temperatures=[1.0, 2.0, 4.0], alphas=[0.0, 0.5, 0.9]))
    points = sweep_points(cfg)
    assert len(points) == 2 * 2 * (1 + 3 * 2)
    assert sum(p.alpha == 0 for p in points) == 4 and all(p.temperature is None for p in points if p.alpha == 0)


# --------------------------------------------------------------------------------------- sweep

@pytest.mark.slow
def test_sweep_runs_every_point_rows_are_consistent_and_a_rerun_resumes(teacher, tmp_path):
    store = ResultsStore(tmp_path / "store")
    cfg = load_distill_config(_cfg(teacher, tmp_path, inits=["teacher", "random"], alphas=[0.0, 0.5], epochs=2))
    res = run_distill(cfg, store=store)
    rows = res.rows
    teacher_doc = json.loads((res.folder / "teacher.json").read_text())
    students = rows[rows.extra.map(lambda e: e["role"] == "student")]
    assert set(students.model.str.rsplit("/", n=1).str[-1]) == {"L2-teacher-Tnone-a0", "L2-teacher-T2-a0.5",
                                                                "L2-random-Tnone-a0", "L2-random-T2-a0.5"}
    acc = students[(students.metric == "accuracy") & (students.split == "test")].set_index("model")["value"]
    kept = students[students.metric == "accuracy_kept"].set_index("model")["value"]
    for m in acc.index:
        assert kept[m] == pytest.approx(acc[m] / teacher_doc["test_accuracy"])
    # the student's parameters: the teacher's minus two blocks
    t = load_classifier(teacher)
    block = sum(p.numel() for p in t.bert.encoder.layer[0].parameters())
    params = students[students.metric == "parameters"]["value"]
    assert set(params) == {teacher_doc["parameters"] - 2 * block} and teacher_doc["parameters"] == sum(
        p.numel() for p in t.parameters())
    # the distilled point's checkpoint records its teacher and loss; the teacher ran once per example
    point = json.loads((res.folder / "points" / "L2-teacher-T2-a0.5" / "point.json").read_text())
    best = json.loads((Path(point["seeds"]["0"]["checkpoint"]) / "manifest.json").read_text())
    assert best["hooks"]["loss"]["teacher_sha256"] == classifier_handle(teacher).checkpoint_hash
    assert best["hooks"]["loss"]["temperature"] == 2.0 and best["hooks"]["loss"]["teacher_layers"] == [0, 3]
    assert point["teacher_calls"] == {"computed": 64, "served": 128}
    # a rerun skips the finished points: same rows, no new fine-tuning
    stamp = (res.folder / "points" / "L2-teacher-T2-a0.5" / "point.json").stat().st_mtime_ns
    again = run_distill(cfg, store=store)
    assert (res.folder / "points" / "L2-teacher-T2-a0.5" / "point.json").stat().st_mtime_ns == stamp
    assert again.rows.drop(columns=[]).equals(res.rows)
    with pytest.raises(ConfigError, match="another config"):
        run_distill(load_distill_config(_cfg(teacher, tmp_path, alphas=[0.9])), store=store)


def _comparable(rows):
    """The rows without what is a timing (latency) or a path under the sweep folder."""
    df = rows[rows.metric != "latency_ms"].reset_index(drop=True)
    return df.assign(extra=df.extra.map(lambda e: {k: v for k, v in e.items() if k not in ("fraction_of_teacher", "teacher_value")}))


@pytest.mark.slow
def test_two_jobs_give_the_rows_of_a_sequential_run_and_resume(teacher, tmp_path, monkeypatch):
    """A 2-point grid run with --jobs 2 (two spawned processes, one thread each) gives the same
    accuracies, sizes and teacher calls as the same grid run point after point with one thread;
    a second parallel run finds every point done and runs nothing."""
    from app.cli import main

    kw = dict(inits=["teacher"], alphas=[0.0, 0.5], threads=1)
    seq = run_distill(load_distill_config(_cfg(teacher, tmp_path / "seq", **kw)), store=ResultsStore(tmp_path / "s1"))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    path = tmp_path / "grid.yaml"
    path.write_text(json.dumps(_cfg(teacher, tmp_path / "par", **{k: v for k, v in kw.items() if k != "threads"})))
    assert main(["distill", str(path), "--jobs", "2"]) == 0
    par_folder = tmp_path / "par" / "sweep"
    docs = {p: json.loads((par_folder / "points" / p / "point.json").read_text())
            for p in ("L2-teacher-Tnone-a0", "L2-teacher-T2-a0.5")}
    for name, doc in docs.items():
        want = json.loads((seq.folder / "points" / name / "point.json").read_text())
        assert doc["seeds"]["0"]["test_accuracy"] == want["seeds"]["0"]["test_accuracy"], name
        assert doc["seeds"]["0"]["dev_accuracy"] == want["seeds"]["0"]["dev_accuracy"], name
        assert (doc["parameters"], doc["file_bytes"], doc["teacher_calls"]) == (
            want["parameters"], want["file_bytes"], want["teacher_calls"]), name
        # the trained students are the same weights, bit for bit
        a = load_classifier(Path(doc["seeds"]["0"]["checkpoint"])).state_dict()
        b = load_classifier(Path(want["seeds"]["0"]["checkpoint"])).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    from workbench.drivers.distill import run_distill as again

    par = again(load_distill_config(path), store=ResultsStore(tmp_path / "runs"), jobs=2)
    stamps = {p: (par_folder / "points" / p / "point.json").stat().st_mtime_ns for p in docs}
    assert {p: (par_folder / "points" / p / "point.json").stat().st_mtime_ns for p in docs} == stamps
    import pandas.testing as pd_testing
    pd_testing.assert_frame_equal(_comparable(par.rows), _comparable(seq.rows))


@pytest.mark.slow
@pytest.mark.parametrize("executor", SUBMITIT_EXECUTORS)
def test_submitit_local_executor_gives_the_rows_of_a_sequential_run(executor, request, teacher, tmp_path, monkeypatch):
    """The submitit path (`bertology distill --executor submitit-local`, and `--executor slurm` on the
    test session's real single-node cluster): each point runs as a submitit job in its own
    process and gives the same student, bit for bit, and the same rows as the point run in this
    process; submitit really ran it (its result file is in the sweep's `submitit/` folder)."""
    from app.cli import main

    kw = dict(inits=["teacher"], alphas=[0.5], threads=1)
    seq = run_distill(load_distill_config(_cfg(teacher, tmp_path / "seq", **kw)), store=ResultsStore(tmp_path / "s1"))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    path = tmp_path / "grid.yaml"
    path.write_text(json.dumps(_cfg(teacher, tmp_path / "sub", **kw)))
    assert main(["distill", str(path), *executor_flags(executor, request)]) == 0
    folder = tmp_path / "sub" / "sweep"
    assert list((folder / "submitit").glob("*_result.pkl")), "no submitit job ran"
    name = "L2-teacher-T2-a0.5"
    doc = json.loads((folder / "points" / name / "point.json").read_text())
    want = json.loads((seq.folder / "points" / name / "point.json").read_text())
    assert doc["seeds"]["0"]["test_accuracy"] == want["seeds"]["0"]["test_accuracy"]
    assert (doc["parameters"], doc["teacher_calls"]) == (want["parameters"], want["teacher_calls"])
    a = load_classifier(Path(doc["seeds"]["0"]["checkpoint"])).state_dict()
    b = load_classifier(Path(want["seeds"]["0"]["checkpoint"])).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    sub = run_distill(load_distill_config(path), store=ResultsStore(tmp_path / "runs"))  # resumes: nothing new runs
    import pandas.testing

    pandas.testing.assert_frame_equal(_comparable(sub.rows), _comparable(seq.rows))


def test_bad_jobs_and_executor_are_one_line_exit_2(teacher, tmp_path, capsys, monkeypatch):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    path = tmp_path / "d.yaml"
    path.write_text(json.dumps(_cfg(teacher, tmp_path)))
    assert main(["distill", str(path), "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--jobs must be >= 1" in err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "runs").exists()
