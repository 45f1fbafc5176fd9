"""The shipped session-3 CPU evidence configs of issue 28 (experiments/distill/*_cpu3.yaml,
experiments/peft/minilm_polarity_cpu3.yaml) parse against their settings classes and describe the
runs docs/distillation.md and docs/peft.md report: a config with an unknown or misspelt key would
fail here instead of minutes into a run. (The teacher folders are checked when a run starts.)"""

from workbench.coerce import build_dataclass
from workbench.io import read_yaml
from workbench.paths import REPO_ROOT

DISTILL = REPO_ROOT / "experiments" / "distill"


def test_task_grid_has_the_issue_points_with_ce_and_t1_at_the_same_size():
    from workbench.drivers.distill import DistillConfig, sweep_points

    path = DISTILL / "polarity_minilm_grid_cpu3.yaml"
    cfg = build_dataclass(DistillConfig, read_yaml(path), str(path))
    points = sweep_points(cfg)
    per_depth = [(p.temperature, p.alpha) for p in points if p.depth == 3]
    # plain CE once, then T 2 and T 4 (the points the GPU run did not reach), then T 1
    assert per_depth == [(None, 0.0), (2.0, 0.5), (2.0, 0.9), (4.0, 0.5), (4.0, 0.9), (1.0, 0.5), (1.0, 0.9)]
    assert len(points) == 14 and {p.init for p in points} == {"teacher"} and cfg.seeds == [0, 1, 2]
    assert (cfg.max_train_examples, cfg.max_eval_examples, cfg.epochs) == (480, 400, 1)


def test_pretraining_config_uses_distilbert_loss_weights():
    from workbench.drivers.distill_pretraining import PretrainDistillConfig

    path = DISTILL / "pretrain_reference_cpu3.yaml"
    cfg = build_dataclass(PretrainDistillConfig, read_yaml(path), str(path))
    assert (cfg.kind, cfg.temperature, cfg.alpha_ce, cfg.alpha_mlm, cfg.alpha_cos) == ("pretraining", 2.0, 5.0, 2.0, 1.0)
    assert cfg.inits == ["teacher", "random"] and cfg.depths is None  # default: half the teacher's 4 layers


def test_syntax_probe_config_probes_teacher_and_both_students():
    from app.experiments import load_experiment

    spec = load_experiment(DISTILL / "probe_pretrain_syntax_cpu3.yaml")
    names = [str(c) for c in spec["checkpoints"]]
    assert len(names) == 3 and "step-0001500" in names[0]
    assert any("L2-teacher" in n for n in names) and any("L2-random" in n for n in names)


def test_peft_config_runs_prompt_and_lora_against_full_over_three_seeds():
    from workbench.drivers.peft_sweep import load_sweep_config, method_config

    cfg = load_sweep_config(REPO_ROOT / "experiments" / "peft" / "minilm_polarity_cpu3.yaml")
    assert cfg.methods == ["full", "prompt", "lora"]
    lora = method_config(cfg, "lora")
    assert (lora.lr, lora.seeds, lora.max_train_examples, lora.lora_r) == (2e-3, [0, 1, 2], 640, 8)
