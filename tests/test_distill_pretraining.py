"""Pretraining distillation (workbench.drivers.distill_pretraining) and the DistilBERT checkpoint format
(workbench.families.distilbert): the triple loss by hand, the student's initial weights, the BERT
-> DistilBERT conversion (same logits in plain transformers), bad configs, a tiny run end to end.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.tolerances import assert_same_outputs, assert_same_state
from tests.training_helpers import tiny_config
from workbench.drivers.distill_pretraining import (
    TeacherLayers,
    TripleLoss,
    load_pretrain_distill_config,
    run_pretrain_distill,
)
from workbench.errors import ConfigError
from workbench.families.distilbert import bert_to_distilbert
from workbench.store.results import ResultsStore
from workbench.drivers.train import train_from_config


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BERTOLOGY_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("BERTOLOGY_RUNS", str(tmp_path_factory.mktemp("runs")))
    yield
    mp.undo()


def _teacher_cfg(family, out, steps=20):
    return tiny_config(family, steps, out, model={"num_hidden_layers": 4}, objective={"nsp": False} if family == "bert" else {},
                       corpus={"sources": ["inaugural"], "max_documents": 12, "heldout_fraction": 0.2, "seed": 0},
                       tokenizer={"vocab_size": 400}, max_len=32, batch_size=4, eval={"batches": 1})


@pytest.fixture(scope="module")
def bert_teacher(env, tmp_path_factory):
    (final,) = train_from_config(_teacher_cfg("bert", tmp_path_factory.mktemp("bert-teacher")))
    return final


def _outputs(seed=0, vocab=11, dim=8):
    """Student and teacher outputs as the pretrainers return them: last hidden states, an MLM head
    (a linear map here), the head's logits at the masked positions, the student's MLM loss."""
    g = torch.Generator().manual_seed(seed)
    s_hidden, t_hidden = torch.randn(2, 5, dim, generator=g), torch.randn(2, 5, dim, generator=g)
    s_head, t_head = torch.nn.Linear(dim, vocab), torch.nn.Linear(dim, vocab)
    with torch.no_grad():
        for p in (*s_head.parameters(), *t_head.parameters()):
            p.copy_(torch.randn(p.shape, generator=g))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    labels = torch.full((2, 5), -100)
    labels[0, 1], labels[1, 3] = 4, 7  # two masked positions out of 8 non-pad tokens
    masked = labels != -100
    student = SimpleNamespace(loss=torch.tensor(3.0), extra={"logits": s_head(s_hidden[masked]), "hidden": s_hidden,
                                                             "mlm_head": s_head})
    teacher = SimpleNamespace(extra={"logits": t_head(t_hidden[masked]), "hidden": t_hidden, "mlm_head": t_head})
    return student, teacher, {"attention_mask": mask, "labels": labels}


def _reference_kl(s_logits, t_logits, T=2.0):
    """distiller.py's soft-target term: KLDivLoss(batchmean) of log_softmax(s/T) against softmax(t/T), x T^2."""
    return F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T**2


@pytest.mark.parametrize("restrict", [False, True])
def test_triple_loss_matches_distilberts_terms_by_hand(restrict):
    """Each term as the reference distiller.py computes it: the soft-target KL over every non-pad
    token by default (`--restrict_ce_to_mask` off), over the masked positions with the option; the
    cosine loss over every non-pad token (CosineEmbeddingLoss, target 1, mean)."""
    student, teacher, batch = _outputs()
    terms = TripleLoss(restrict_soft_loss_to_mask=restrict)(student, batch, teacher)
    keep = batch["attention_mask"].bool()
    where = (batch["labels"] != -100) if restrict else keep
    s_logits = student.extra["mlm_head"](student.extra["hidden"][where])
    t_logits = teacher.extra["mlm_head"](teacher.extra["hidden"][where])
    assert s_logits.shape[0] == (2 if restrict else 8)
    ce = _reference_kl(s_logits, t_logits)
    s_hidden, t_hidden = student.extra["hidden"], teacher.extra["hidden"]
    cos = F.cosine_embedding_loss(s_hidden[keep], t_hidden[keep], torch.ones(int(keep.sum())))  # DistilBERT's
    mlm = student.loss
    assert terms["ce"].item() == pytest.approx(ce.item(), rel=1e-5)
    assert terms["cos"].item() == pytest.approx(cos.item(), rel=1e-5)
    assert terms["loss"].item() == pytest.approx((5.0 * ce + 2.0 * mlm + 1.0 * cos).item(), rel=1e-5)


def test_soft_loss_reads_the_unmasked_tokens_by_default():
    """Planted: the student's head equals the teacher's and the hidden states agree at the masked
    positions only. The soft-target term over the masked positions is then 0; over every non-pad
    token (the reference's default) it is the unmasked positions' disagreement, 6 of 8 rows; a
    gradient reaches the student's hidden states at unmasked positions."""
    student, teacher, batch = _outputs()
    masked = batch["labels"] != -100
    t_head = teacher.extra["mlm_head"]
    hidden = teacher.extra["hidden"].clone()
    hidden[~masked] = hidden[~masked] + 3.0 * torch.randn(hidden[~masked].shape, generator=torch.Generator().manual_seed(5))
    hidden.requires_grad_(True)
    student = SimpleNamespace(loss=torch.tensor(0.0), extra={"logits": t_head(hidden[masked]), "hidden": hidden,
                                                             "mlm_head": t_head})
    restricted = TripleLoss(restrict_soft_loss_to_mask=True)(student, batch, teacher)["ce"].item()
    assert restricted == pytest.approx(0.0, abs=1e-6)
    terms = TripleLoss()(student, batch, teacher)
    keep = batch["attention_mask"].bool()
    s_rows, t_rows = t_head(hidden[keep]), t_head(teacher.extra["hidden"][keep])
    by_row = F.kl_div(F.log_softmax(s_rows / 2, -1), F.softmax(t_rows / 2, -1), reduction="none").sum(-1) * 4
    unmasked = ~masked[keep]
    assert by_row[~unmasked].max().item() == pytest.approx(0.0, abs=1e-5)
    assert by_row[unmasked].min().item() > 1e-3  # every unmasked row carries a planted difference
    assert terms["ce"].item() == pytest.approx(by_row.sum().item() / 8, rel=1e-5)
    soft_only = TripleLoss(alpha_mlm=0.0, alpha_cos=0.0)(student, batch, teacher)["loss"]
    (grad,) = torch.autograd.grad(soft_only, hidden)
    assert grad[~masked & batch["attention_mask"].bool()].abs().sum() > 0
    assert torch.all(grad[~batch["attention_mask"].bool()] == 0)  # padding takes no part


def test_the_masked_positions_the_pretrainers_return_are_their_heads_there(bert_teacher):
    """`extra["mlm_head"]` of the BERT and DistilBERT pretrainers applied to the hidden states at
    the masked positions gives `extra["logits"]`: the default path computes what the option did
    at those positions."""
    from workbench.families.bert import load_pretrainer

    teacher = load_pretrainer(bert_teacher).eval()
    ids = torch.randint(5, teacher.model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5] = ids[0, 2], ids[1, 5]
    with torch.no_grad():
        out = teacher(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                      labels=labels)
        again = out.extra["mlm_head"](out.extra["hidden"][labels != -100])
    torch.testing.assert_close(again, out.extra["logits"], rtol=1e-5, atol=1e-5)


def test_distilbert_conversion_gives_the_berts_logits_in_plain_transformers(tmp_path):
    from transformers import AutoModelForMaskedLM, BertConfig, BertForPreTraining

    torch.manual_seed(0)
    bert = BertForPreTraining(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=64)).eval()
    with torch.no_grad():  # a token-type embedding far from 0: the fold into positions must matter
        bert.bert.embeddings.token_type_embeddings.weight.normal_(0, 1)
    bert_to_distilbert(bert).save_pretrained(tmp_path / "d")
    plain = AutoModelForMaskedLM.from_pretrained(tmp_path / "d").eval()
    assert type(plain).__name__ == "DistilBertForMaskedLM"
    ids = torch.randint(0, 60, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    with torch.no_grad():
        want = bert(input_ids=ids, attention_mask=mask).prediction_logits
        got = plain(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)


def test_teacher_layers_hook_sets_exactly_the_chosen_layers(bert_teacher):
    from workbench.families.bert import build_model as build_bert, load_pretrainer

    teacher = load_pretrainer(bert_teacher)
    cfg = {k: getattr(teacher.model.config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size",
                                                         "max_position_embeddings")}
    student = build_bert({**cfg, "num_hidden_layers": 2}, _Tok(teacher))
    TeacherLayers(teacher.model, [0, 3], {})(student)
    ts, ss = teacher.model.state_dict(), student.model.state_dict()
    for key, value in ss.items():
        src = key.replace("encoder.layer.1.", "encoder.layer.3.")
        assert torch.equal(value, ts[src]), key


class _Tok:
    """What `build_model` reads of a tokenizer: its length and pad id."""

    def __init__(self, teacher):
        self.n, self.pad_token_id = teacher.model.config.vocab_size, teacher.model.config.pad_token_id

    def __len__(self):
        return self.n


def _dcfg(teacher, **kw):
    return {"teacher": str(teacher), "kind": "pretraining", "steps": 6, "heldout_batches": 1, "progress": False, **kw}


@pytest.mark.parametrize("override,match", [
    ({"temperature": 0}, "temperature: must be > 0"),
    ({"alpha_cos": -1}, "alpha_cos: must be >= 0"),
    ({"depths": [5]}, r"depths: a student of 5 layers: must be in \[1, 4\]"),
    ({"inits": ["copy"]}, "inits: unknown init"),
    ({"restrict_soft_loss_to_mask": "maybe"}, "restrict_soft_loss_to_mask"),
])
def test_bad_pretraining_config_is_one_config_error(bert_teacher, override, match):
    with pytest.raises(ConfigError, match=match):
        load_pretrain_distill_config(_dcfg(bert_teacher, **override))


def test_a_teacher_not_trained_here_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(ConfigError, match="teacher: .*not a checkpoint trained here"):
        load_pretrain_distill_config(_dcfg(tmp_path / "x"))


@pytest.mark.slow
def test_bert_students_train_as_distilbert(bert_teacher, tmp_path):
    """A BERT teacher's students are trained as the distilbert family: every checkpoint is a plain
    `DistilBertForMaskedLM`, and the pretrainer computes what transformers' own class computes."""
    from transformers import AutoModelForMaskedLM

    from workbench.families.distilbert import load_pretrainer

    cfg = load_pretrain_distill_config(_dcfg(bert_teacher, seeds=[0]))
    res = run_pretrain_distill(cfg, store=ResultsStore(tmp_path / "store"))
    rows = res.rows
    assert set(rows.extra.map(lambda e: e["role"])) == {"teacher", "student"}
    students = rows[rows.extra.map(lambda e: e["role"] == "student")]
    assert len(students) == 2 and set(students.extra.map(lambda e: e["depth"])) == {2}
    assert set(students["family"]) == {"distilbert"} and set(rows[~rows.index.isin(students.index)]["family"]) == {"bert"}
    assert all(v > 0 and v == v for v in rows["value"])
    final = res.students["L2-teacher-seed0"]
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["family"] == "distilbert" and "nsp" not in manifest["objective"]
    assert manifest["hooks"]["loss"]["name"] == "distilbert_triple" and manifest["hooks"]["loss"]["teacher_layers"] == [0, 3]
    assert manifest["hooks"]["initial"]["teacher_layers"] == [0, 3] and manifest["model_config"]["num_hidden_layers"] == 2
    assert manifest["hooks"]["loss"]["soft_loss_positions"] == "non_pad"
    # the teacher is recorded (its folder through OneSegmentTeacher.config): its total joins the
    # student's, and its forwards and the all-token heads are in the student's own FLOPs
    from workbench.cost import training_flops_per_token

    assert manifest["hooks"]["teacher"]["name_or_path"] == str(bert_teacher)
    assert manifest["cost"]["teacher"]["checkpoint"] == str(bert_teacher)
    own = manifest["cost"]["own"]
    parts = training_flops_per_token(manifest)
    assert own["flops_per_token"] == pytest.approx(parts["total"])
    assert parts["teacher_forward"] > 0 and parts["soft_loss_student_head"] > 0
    student_only = training_flops_per_token({k: v for k, v in manifest.items() if k != "hooks"})["total"]
    assert own["flops_per_token"] > student_only + parts["teacher_forward"]
    from workbench.drivers.train import read_log

    log = read_log(final.parent)
    assert all({"ce", "mlm", "cos"} <= set(r) for r in log[1:]), log[1]
    plain = AutoModelForMaskedLM.from_pretrained(final).eval()
    assert type(plain).__name__ == "DistilBertForMaskedLM"
    student = load_pretrainer(final).model.eval()
    ids = torch.tensor([[2, 40, 41, 42, 43, 3]])
    assert_same_state(plain, student)
    with torch.no_grad():
        assert_same_outputs(plain(input_ids=ids).logits, student(input_ids=ids).logits, plain.config)
    assert not (final.parent / "distilbert").exists()  # no conversion after training any more


def test_a_bert_teachers_distilbert_student_starts_as_the_cut_bert(bert_teacher):
    """The DistilBERT student's initial weights are the teacher's layers [0, 3] (through the
    conversion): on one-segment input it computes what the cut BERT computes, and its blocks are
    bit-for-bit the teacher's blocks 0 and 3."""
    from workbench.drivers.distill import cut_student
    from workbench.families.bert import load_pretrainer
    from workbench.families.distilbert import build_model

    teacher = load_pretrainer(bert_teacher)
    tc = teacher.model.config
    student = build_model({"num_hidden_layers": 2, "hidden_size": tc.hidden_size, "num_attention_heads":
                           tc.num_attention_heads, "intermediate_size": tc.intermediate_size,
                           "max_position_embeddings": tc.max_position_embeddings}, _Tok(teacher))
    TeacherLayers(teacher.model, [0, 3], {})(student)
    ts, ss = teacher.model.state_dict(), student.model.state_dict()
    assert torch.equal(ss["distilbert.transformer.layer.1.ffn.lin1.weight"], ts["bert.encoder.layer.3.intermediate.dense.weight"])
    assert torch.equal(ss["distilbert.transformer.layer.0.attention.q_lin.bias"], ts["bert.encoder.layer.0.attention.self.query.bias"])
    ids = torch.randint(5, tc.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    cut = cut_student(teacher.model, [0, 3]).eval()
    with torch.no_grad():
        want = cut(input_ids=ids, token_type_ids=torch.zeros_like(ids)).prediction_logits
        got = student.model.eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_cli_dispatches_on_kind_and_refuses_a_bad_pretraining_config(bert_teacher, tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(f"kind: pretraining\nteacher: {bert_teacher}\ntemperature: -2\n")
    assert main(["distill", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "temperature: must be > 0" in err


@pytest.mark.slow
def test_students_trained_with_two_jobs_equal_a_sequential_run(bert_teacher, tmp_path, monkeypatch):
    """The two students (teacher-initialised and random) trained in two spawned processes, one
    thread each, are the weights and held-out losses of the same sweep run in this process with
    one thread; a rerun with --jobs 2 trains nothing (the finished runs are found)."""
    from app.cli import main
    from workbench.families.distilbert import load_pretrainer

    torch.set_num_threads(1)
    seq = run_pretrain_distill(load_pretrain_distill_config(_dcfg(bert_teacher, seeds=[0], name="seq")),
                               store=ResultsStore(tmp_path / "s1"))
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(_dcfg(bert_teacher, seeds=[0], name="par")))
    assert main(["distill", str(path), "--jobs", "2"]) == 0
    par = run_pretrain_distill(load_pretrain_distill_config(path), store=ResultsStore(tmp_path / "s2"), jobs=2)
    for key in ("L2-teacher-seed0", "L2-random-seed0"):
        a, b = load_pretrainer(seq.students[key]).state_dict(), load_pretrainer(par.students[key]).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), key
    assert list(par.rows["value"]) == list(seq.rows["value"])
