"""The training loops' hooks (workbench/loop.py), each checked on values in a real loop:

- an after-step hook that re-applies a pruning mask keeps the masked weights exactly zero through
  training (Adam's momentum moves them off zero after every step, so the hook is what keeps them
  there) while the unmasked weights move;
- a loss that reads a teacher: with the teacher a copy of the student at step 0 (dropout off) the
  KL term of the first step is exactly 0; toward a different teacher the KL falls markedly; every
  term of the composite loss is logged;
- a parameter filter: with biases only (BitFit) every other tensor ends bit-identical to its
  initial value and the biases move; the manifest records the filter and the trainable count;
- a run with hooks, interrupted, resumes bit-identically; a run folder refuses other hooks.

Pretraining runs are the tiny GPT of tests/training_helpers.py (seconds); fine-tuning runs a tiny
BERT classifier on a slice of sentence_polarity; the cloze MC fine-tuning a tiny BERT on age items.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import tiny_bert
from tests.training_helpers import tiny_config, tiny_finetune_config
from workbench.errors import ConfigError
from workbench.loop import ParamFilter, TrainingHooks, biases_only, kl_to_teacher, loss_terms
from workbench.drivers.train import read_log, train_from_config

STEPS = 8
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BERTOLOGY_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("BERTOLOGY_RUNS", str(tmp_path_factory.mktemp("runs")))
    torch.set_num_threads(1)
    yield
    mp.undo()


def _gpt_config(out, steps=STEPS, **kw):
    return tiny_config("gpt", steps, out, corpus={"sources": ["inaugural"], "max_documents": 12,
                                                  "heldout_fraction": 0.2, "seed": 0},
                       tokenizer={"vocab_size": 400}, max_len=32, batch_size=4,
                       **{"eval.batches": 0, "checkpoints.log_spaced": False, **kw})


def _module_weights(checkpoint) -> dict:
    return torch.load(checkpoint / "trainer_state" / "model.pt", weights_only=True)


# ---- after-step hook ------------------------------------------------------------------------------


class ReapplyMask:
    """Zero a fixed random half of two weight matrices after every step (lottery-ticket style
    pruning); records how far the masked weights had moved off zero before each re-application."""

    NAMES = ("model.transformer.h.0.mlp.c_fc.weight", "model.transformer.h.0.attn.c_attn.weight")

    def __init__(self):
        self.masks: dict[str, torch.Tensor] = {}
        self.moved_before: list[float] = []
        self.steps: list[int] = []

    @torch.no_grad()
    def __call__(self, model, step):
        params = dict(model.named_parameters())
        for name in self.NAMES:
            p = params[name]
            if name not in self.masks:
                g = torch.Generator().manual_seed(len(self.masks))
                self.masks[name] = torch.rand(p.shape, generator=g) < 0.5
            else:  # the optimizer step just taken moved the zeros
                self.moved_before.append(float(p[self.masks[name]].abs().max()))
            p[self.masks[name]] = 0.0
        self.steps.append(step)


def test_after_step_mask_keeps_pruned_weights_exactly_zero(cache, tmp_path):
    hook = ReapplyMask()
    (final,) = train_from_config(_gpt_config(tmp_path), hooks=TrainingHooks(after_step=hook))
    assert hook.steps == list(range(1, STEPS + 1))  # every optimizer step, numbered by steps done
    start = load_file(final.parent / "step-0000000" / "model.safetensors")
    end = _module_weights(final)
    for name, mask in hook.masks.items():
        w, w0 = end[name], start[name.removeprefix("model.")]
        assert mask.float().mean() == pytest.approx(0.5, abs=0.02)
        assert torch.count_nonzero(w[mask]) == 0, name  # every masked weight is exactly zero
        moved = (w[~mask] != w0[~mask]).float().mean()
        assert moved > 0.99, (name, float(moved))  # the others trained
    # without the hook they would not stay zero: Adam moved them off zero after every step
    assert min(hook.moved_before) > 1e-5, hook.moved_before
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["hooks"] == {"after_step": "ReapplyMask"}
    assert json.loads((final.parent / "run.json").read_text())["hooks"] == {"after_step": "ReapplyMask"}


def test_a_run_folder_refuses_other_hooks(cache, tmp_path):
    train_from_config(_gpt_config(tmp_path, steps=1))
    with pytest.raises(ConfigError, match="holds a run trained with other hooks"):
        train_from_config(_gpt_config(tmp_path, steps=1), hooks=TrainingHooks(trainable=biases_only()))


class StopAt:
    """An after-step hook that interrupts training at one step (a killed run), or never."""

    def __init__(self, step=None):
        self.step, self.seen = step, []

    def __call__(self, model, step):
        self.seen.append(step)
        if step == self.step:
            raise KeyboardInterrupt


def test_an_interrupted_run_with_hooks_resumes_bit_identically(cache, tmp_path):
    """A run with a parameter filter, stopped after step 5, resumes from its step-4 checkpoint and
    ends with the uninterrupted run's weights, optimizer state and log (dropout on: the restored
    RNG matters)."""
    spaced = {"checkpoints.log_spaced": True}  # checkpoints at 0, 1, 2, 4, 6
    ref_cfg, cut_cfg = (_gpt_config(tmp_path / name, steps=6, **spaced) for name in ("ref", "cut"))
    (ref,) = train_from_config(ref_cfg, hooks=TrainingHooks(after_step=StopAt(), trainable=biases_only()))
    with pytest.raises(KeyboardInterrupt):
        train_from_config(cut_cfg, hooks=TrainingHooks(after_step=StopAt(5), trainable=biases_only()))
    assert (tmp_path / "cut" / "seed-0" / "step-0000004" / "trainer_state").is_dir()
    assert not (tmp_path / "cut" / "seed-0" / "step-0000006").exists()
    again = StopAt()
    (cut,) = train_from_config(cut_cfg, hooks=TrainingHooks(after_step=again, trainable=biases_only()))
    assert again.seen == [5, 6]  # it resumed after step 4, it did not start over
    a, b = _module_weights(ref), _module_weights(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa = torch.load(ref / "trainer_state" / "optimizer.pt", weights_only=True)["state"]
    ob = torch.load(cut / "trainer_state" / "optimizer.pt", weights_only=True)["state"]
    assert all(torch.equal(oa[i]["exp_avg"], ob[i]["exp_avg"]) for i in oa)
    strip = lambda log: [{k: v for k, v in r.items() if k != "elapsed"} for r in log]  # noqa: E731
    assert strip(read_log(cut.parent)) == strip(read_log(ref.parent))


# ---- teacher --------------------------------------------------------------------------------------


def lm_plus_kl(student, batch, teacher) -> dict:
    """A composite loss: the family's LM loss plus KL(teacher || student) over the vocabulary."""
    kl = kl_to_teacher(student.extra["logits"], teacher.extra["logits"])
    return {"loss": student.loss + kl, "lm": student.loss, "kl": kl}


def kl_only(student, batch, teacher) -> dict:
    return {"loss": kl_to_teacher(student.extra["logits"], teacher.extra["logits"])}


def _student_at_step_0(cfg):
    """The training module `train_seed` starts from (same seed, same build)."""
    from workbench.families import get_family
    from workbench.drivers.train import build_model, prepare_data

    family = get_family("gpt")
    return build_model(cfg, family, prepare_data(cfg, family).tokenizer, cfg.seeds[0], torch.device("cpu"))


def test_teacher_equal_to_the_student_gives_kl_exactly_zero_at_the_first_step(cache, tmp_path):
    cfg = _gpt_config(tmp_path, steps=3, model=NO_DROPOUT)
    teacher = _student_at_step_0(cfg)
    hooks = TrainingHooks(loss=lm_plus_kl, teacher=teacher)
    (final,) = train_from_config(cfg, hooks=hooks)
    log = read_log(final.parent)[1:]
    assert log[0]["kl"] == 0.0  # same weights, same batch: identical logits
    assert log[0]["loss"] == log[0]["lm"]
    assert all(r["kl"] > 0 for r in log[1:])  # the student moved away (its LM loss pulls it)
    assert all(r["loss"] == pytest.approx(r["lm"] + r["kl"]) for r in log)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    hooks_record = json.loads((final / "manifest.json").read_text())["hooks"]
    assert hooks_record["loss"] == "lm_plus_kl" and hooks_record["teacher"]["class"] == "PretrainingWrapper"


def test_kl_to_a_trained_teacher_falls_markedly(cache, tmp_path):
    """Distillation alone (the loss is the KL term): the student, random at step 0, moves to a
    teacher trained for 30 steps (another seed; it has left the uniform guess: its LM loss fell
    from 6.0 to 5.0). Measured: KL 1.03 at the first step, 0.11 at the 15th."""
    teacher_cfg = _gpt_config(tmp_path / "teacher", steps=30, lr=1e-2, seeds=[1], model=NO_DROPOUT)
    (trained,) = train_from_config(teacher_cfg)
    teacher = _student_at_step_0(teacher_cfg)
    teacher.load_state_dict(_module_weights(trained))
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    cfg = _gpt_config(tmp_path / "student", steps=15, lr=3e-3, warmup=0.0, model=NO_DROPOUT)
    (final,) = train_from_config(cfg, hooks=TrainingHooks(loss=kl_only, teacher=teacher))
    kl = [r["loss"] for r in read_log(final.parent)[1:]]
    print("KL to the teacher by step:", [round(x, 3) for x in kl])
    assert kl[0] > 0.5
    assert sum(kl[-3:]) / 3 < 0.25 * kl[0], kl
    after = teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the teacher never trains


# ---- parameter filter -----------------------------------------------------------------------------


def test_biases_only_pretraining_changes_biases_only(cache, tmp_path):
    (final,) = train_from_config(_gpt_config(tmp_path), hooks=TrainingHooks(trainable=biases_only()))
    start = load_file(final.parent / "step-0000000" / "model.safetensors")
    end = load_file(final / "model.safetensors")
    biases = [k for k in end if k.endswith(".bias")]
    assert len(biases) >= 10
    for k in end:
        if k in biases:
            assert not torch.equal(end[k], start[k]), k
        else:
            assert torch.equal(end[k], start[k]), k
    manifest = json.loads((final / "manifest.json").read_text())
    n_bias = sum(end[k].numel() for k in biases)
    assert manifest["trainable"] == {"filter": "biases_only", "parameters": n_bias,
                                     "total": manifest["trainable"]["total"]}
    assert manifest["trainable"]["total"] > 10 * n_bias
    # kept out of the optimizer: its saved state holds the trainable tensors only
    opt = torch.load(final / "trainer_state" / "optimizer.pt", weights_only=True)
    assert sum(len(g["params"]) for g in opt["param_groups"]) == len(biases)


def test_default_manifest_records_all_parameters_training(cache, tmp_path):
    cfg = _gpt_config(tmp_path, steps=1)
    (final,) = train_from_config(cfg)
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["trainable"]["filter"] == "all" and "hooks" not in manifest
    # GPT-2 ties its output layer to the token embeddings: counted once, as model.parameters() does
    expected = sum(p.numel() for p in _student_at_step_0(cfg).parameters())
    in_state_dict = sum(v.numel() for k, v in _module_weights(final).items() if k != "model.lm_head.weight")
    assert manifest["trainable"]["parameters"] == manifest["trainable"]["total"] == expected == in_state_dict


# ---- fine-tuning ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_checkpoint(tokenizers, tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained") / "bert"
    tiny_bert(tokenizers["bert"], hidden=32).save_pretrained(path)
    tokenizers["bert"].save_pretrained(path)
    return path


def _finetune_cfg(checkpoint, out, **kw):
    return tiny_finetune_config(checkpoint, out, **{"lr": 3e-3, **kw})


def test_bitfit_finetuning_leaves_every_other_tensor_bit_identical(bert_checkpoint, tmp_path):
    from workbench.drivers.finetune import run_finetune
    from workbench.running.classifier_loading import build_classifier
    from workbench.running.models import ModelHandle
    from workbench.store.results import ResultsStore

    res = run_finetune(_finetune_cfg(bert_checkpoint, tmp_path / "run"), store=ResultsStore(tmp_path / "s"),
                       hooks=TrainingHooks(trainable=biases_only()))
    handle = ModelHandle.load(bert_checkpoint)
    torch.manual_seed(0)  # the seed's fresh head, as train_seed builds it
    start = build_classifier(bert_checkpoint, "bert", "sentence", "first", ["neg", "pos"], handle.pad_id).state_dict()
    end = load_file(res.seeds[0].checkpoint + "/model.safetensors")
    changed = {k for k in end if not torch.equal(end[k], start[k])}
    biases = {k for k in end if k.endswith(".bias")}
    assert changed == biases, sorted(changed ^ biases)[:5]
    manifest = json.loads((tmp_path / "run" / "seed-0" / "best" / "manifest.json").read_text())
    assert manifest["trainable"]["filter"] == "biases_only"
    assert manifest["trainable"]["parameters"] == sum(end[k].numel() for k in biases)
    assert manifest["hooks"] == {"trainable": "biases_only"}
    # the folder belongs to these hooks: the same config without them is refused
    with pytest.raises(ConfigError, match="another config, checkpoint or hooks"):
        run_finetune(_finetune_cfg(bert_checkpoint, tmp_path / "run"), store=ResultsStore(tmp_path / "s"))


class ConfidentTeacher(torch.nn.Module):
    """A planted teacher: whatever the sentence, class 0 with probability 0.9975 (logits +3, -3)."""

    def forward(self, input_ids, attention_mask, labels):
        return SimpleNamespace(logits=torch.tensor([3.0, -3.0]).expand(len(input_ids), 2))


def ce_plus_kl(student, batch, teacher) -> dict:
    """A composite loss, DistilBERT-style: a small weight on the gold labels, the KL to the teacher."""
    kl = kl_to_teacher(student.logits, teacher.logits)
    return {"loss": 0.1 * student.loss + kl, "ce": student.loss, "kl": kl}


def test_finetuning_with_a_teacher_logs_every_term_and_pulls_toward_it(bert_checkpoint, tmp_path):
    """Every term's epoch mean is in the curve; the KL to the planted teacher falls (measured: epoch
    means 0.47, 0.11, 0.04) while the gold-label cross-entropy, weighted 0.1, rises."""
    from workbench.drivers.finetune import run_finetune
    from workbench.store.results import ResultsStore

    cfg = _finetune_cfg(bert_checkpoint, tmp_path / "run", epochs=3, patience=3, max_train_examples=32,
                        batch_size=8, warmup=0.0, lr=1e-2)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "s"), hooks=TrainingHooks(loss=ce_plus_kl,
                                                                                     teacher=ConfidentTeacher()))
    curve = res.seeds[0].curve
    terms = [c["train_terms"] for c in curve]
    print("per-epoch terms:", terms)
    assert all(set(t) == {"loss", "ce", "kl"} for t in terms)
    assert all(t["loss"] == pytest.approx(0.1 * t["ce"] + t["kl"]) and t["loss"] == pytest.approx(c["train_loss"])
               for t, c in zip(terms, curve))
    assert terms[-1]["kl"] < 0.5 * terms[0]["kl"], terms  # the student's logits move to the teacher's


# ---- cloze MC fine-tuning -------------------------------------------------------------------------


def test_cloze_finetuning_takes_the_hooks(tokenizers):
    from probes import cloze
    from probes.cloze import tasks as ct
    from workbench.running.lm_scores import lm_scorer
    from workbench.running.models import ModelHandle

    tok = tokenizers["bert"]
    items = ct.generate("age", seed=0, sizes={"train": 40, "dev": 4, "test": 16})
    scorer = lm_scorer(ModelHandle(tiny_bert(tok, hidden=32), tok))
    start = {k: v.clone() for k, v in scorer.model.state_dict().items()}
    seen = {}

    def keep_last(model, step):
        seen["state"] = {k: v.clone() for k, v in model.state_dict().items()}
        seen["step"] = step

    res = cloze.finetune_mc(scorer, ct.split(items, "train"), ct.split(items, "test"), steps=5, lr=3e-3,
                            batch_size=8, hooks=TrainingHooks(after_step=keep_last, trainable=biases_only()))
    assert seen["step"] == 5
    changed = {k for k in start if not torch.equal(seen["state"][k], start[k])}
    assert changed and all(k.endswith(".bias") for k in changed), sorted(changed)[:5]
    assert res["trainable"]["filter"] == "biases_only"
    assert all(p.requires_grad for p in scorer.model.parameters())  # the scorer's own model untouched

    # a teacher equal to the student at step 0 (dropout off): the KL term of the first step is 0
    from transformers import BertForMaskedLM

    config = copy.deepcopy(scorer.model.config)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    student = BertForMaskedLM(config).eval()
    student.load_state_dict(scorer.model.state_dict())
    first = {}

    def kl_scores(scores, index, teacher_scores) -> dict:
        kl = kl_to_teacher(scores, teacher_scores)
        first.setdefault("kl", float(kl.detach()))
        return {"loss": kl + torch.nn.functional.cross_entropy(scores, torch.zeros(len(index), dtype=torch.long)),
                "kl": kl}

    quiet = lm_scorer(ModelHandle(student, tok))
    res = cloze.finetune_mc(quiet, ct.split(items, "train"), ct.split(items, "test"), steps=3, lr=3e-3, batch_size=8,
                            hooks=TrainingHooks(loss=kl_scores, teacher=copy.deepcopy(student)))
    assert first["kl"] == 0.0 and set(res["train_terms"]) == {"loss", "kl"} and res["train_terms"]["kl"] > 0


# ---- bad hooks are clear errors -------------------------------------------------------------------


def test_bad_hooks_are_config_errors():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ConfigError, match="a teacher needs a loss"):
        TrainingHooks(teacher=model)
    from workbench.loop import apply_param_filter

    with pytest.raises(ConfigError, match="no parameter of Linear passes it"):
        apply_param_filter(model, ParamFilter("none", lambda n, p: False))
    hooks = TrainingHooks(loss=lambda out, batch, teacher: {"kl": out.sum()})
    with pytest.raises(ConfigError, match="must return a dict with a 'loss' entry"):
        loss_terms(model, torch.ones(1, 3), hooks, lambda o, b: {"loss": o.sum()}, forward=lambda m, b: m(b))


def test_freeze_body_and_a_filter_together_are_refused(bert_checkpoint, tmp_path):
    from workbench.drivers.finetune import run_finetune
    from workbench.store.results import ResultsStore

    with pytest.raises(ConfigError, match="freeze_body and a parameter filter"):
        run_finetune(_finetune_cfg(bert_checkpoint, tmp_path / "run", freeze_body=True),
                     store=ResultsStore(tmp_path / "s"), hooks=TrainingHooks(trainable=biases_only()))


def test_kl_to_teacher_matches_a_direct_computation():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    for temp in (1.0, 2.0):
        p = torch.softmax(t / temp, -1)
        expect = (p * (p.log() - torch.log_softmax(s / temp, -1))).sum(-1).mean() * temp**2
        torch.testing.assert_close(kl_to_teacher(s, t, temp), expect)
        # torch's own KL divergence agrees
        ref = torch.nn.functional.kl_div(torch.log_softmax(s / temp, -1), p, reduction="batchmean") * temp**2
        torch.testing.assert_close(kl_to_teacher(s, t, temp), ref)
    assert float(kl_to_teacher(s, s)) == 0.0
    keep = torch.tensor([True, False, True, False, False])
    torch.testing.assert_close(kl_to_teacher(s, t, mask=keep), kl_to_teacher(s[keep], t[keep]))


def test_filters_freeze_by_name_and_count_what_trains():
    """`names_matching` (adapters, prompts: added parameters found by name) and `biases_only` freeze
    everything else and report counts that match a direct count; the optimizer holds only the rest."""
    from workbench.loop import adamw, apply_param_filter, names_matching

    def model():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))
        m.add_module("adapter", torch.nn.Linear(2, 2, bias=False))
        return m

    m = model()
    record = apply_param_filter(m, names_matching(r"^adapter\."))
    assert [n for n, p in m.named_parameters() if p.requires_grad] == ["adapter.weight"]
    assert record == {"filter": "names_matching:^adapter\\.", "parameters": 4, "total": 15 + 6 + 8 + 4}
    opt = adamw(m.named_parameters(), 1e-3, 0.01)
    assert [len(g["params"]) for g in opt.param_groups] == [1, 0]  # matrices decay, the rest does not
    m = model()
    record = apply_param_filter(m, biases_only())
    assert [n for n, p in m.named_parameters() if p.requires_grad] == ["0.bias", "1.bias", "2.bias"]
    assert record["parameters"] == 3 + 3 + 2
