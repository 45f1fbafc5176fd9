"""The one YAML reader (`workbench.io.read_yaml`) and the one settings coercion
(`workbench.coerce.build_dataclass`) that probe Settings, TrainConfig and FinetuneConfig share."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from workbench.coerce import build_dataclass
from workbench.errors import ConfigError
from workbench.io import read_yaml


# --------------------------------------------------------------------------- read_yaml
def test_read_yaml_reads_a_mapping_and_an_empty_file_is_empty(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("steps: 3\ncorpus: {seed: 1}\n")
    assert read_yaml(path) == {"steps": 3, "corpus": {"seed": 1}}
    path.write_text("# nothing but a comment\n")
    assert read_yaml(path) == {}


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb: [2\n", r"bad\.yaml:3: not valid YAML: .* at line 3, column 1"),
    ("a: 1\n  b: 2\n", r"bad\.yaml:2: not valid YAML: mapping values are not allowed here at line 2, column 4"),
    ("- 1\n- 2\n", r"bad\.yaml: expected a mapping at the top level, got list"),
    ("just words\n", r"bad\.yaml: expected a mapping at the top level, got str"),
])  # fmt: skip
def test_read_yaml_errors_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_yaml(path)


def test_read_yaml_missing_file_names_what_was_expected(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: experiment file does not exist"):
        read_yaml(tmp_path / "nope.yaml", "experiment file")


def test_every_yaml_reader_goes_through_read_yaml(tmp_path):
    """A list at the top level of each kind of YAML file is refused with the same message (the
    messages differed before, and the probe's --config and the shadow-set config read lists as
    mappings or crashed)."""
    from app.experiments import load_experiment
    from app.figures import load_spec
    from workbench.config import load_train_config
    from workbench.drivers.finetune import load_finetune_config
    from workbench.drivers.shadows import main as shadows_main

    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    for load in (load_train_config, load_finetune_config, load_experiment, load_spec):
        with pytest.raises(ConfigError, match=r"list\.yaml: expected a mapping at the top level, got list"):
            load(path)
    assert shadows_main([str(path)]) == 2


def test_probe_settings_file_through_read_yaml(tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "settings.yaml"
    path.write_text("seed: [1\n")
    assert main(["probe", "syntax", "--config", str(path), "--checkpoint", str(tmp_path)]) == 2
    assert "settings.yaml:2: not valid YAML" in capsys.readouterr().err


# --------------------------------------------------------------------------- build_dataclass
@dataclass
class Inner:
    seed: int = 0
    rate: float = 0.5


@dataclass
class Outer:
    name: str
    count: int = 1
    scale: float = 1.0
    flag: bool = False
    tags: tuple[str, ...] = ()
    seeds: list[int] = field(default_factory=lambda: [0])
    betas: tuple[float, float] = (0.9, 0.999)
    limit: int | None = None
    extra: dict = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


def test_strings_from_the_command_line_give_the_same_object_as_typed_yaml_values():
    typed = build_dataclass(Outer, {"name": "x", "count": 3, "scale": 5e-4, "flag": True, "tags": ["a", "b"],
                                    "seeds": [1, 2], "betas": [0.8, 0.9], "limit": 7, "inner": {"seed": 2}}, "typed")
    strings = build_dataclass(Outer, {"name": "x", "count": "3", "scale": "5e-4", "flag": "yes", "tags": "a, b",
                                      "seeds": "1,2", "betas": "0.8,0.9", "limit": "7", "inner": {"seed": "2"}}, "cli")
    assert typed == strings
    assert typed.tags == ("a", "b") and typed.seeds == [1, 2] and typed.betas == (0.8, 0.9)
    assert type(typed.count) is int and type(typed.scale) is float and type(typed.inner.seed) is int
    assert build_dataclass(Outer, {"name": 2024, "count": 4.0, "limit": None}, "s") == Outer("2024", count=4)
    assert build_dataclass(Outer, {"name": "x", "count": "1e4"}, "s").count == 10_000  # YAML 1.1 reads 1e4 as a string


@pytest.mark.parametrize("values, message", [
    ({"name": "x", "count": 2.5}, r"^src: count: expected an integer, got 2\.5$"),
    ({"name": "x", "count": True}, r"^src: count: expected an integer, got True$"),
    ({"name": "x", "count": "three"}, r"^src: count: expected an integer, got 'three'$"),
    ({"name": "x", "scale": "fast"}, r"^src: scale: expected a number, got 'fast'$"),
    ({"name": "x", "flag": "maybe"}, r"^src: flag: expected true/false, got 'maybe'$"),
    ({"name": "x", "seeds": "1,a"}, r"^src: seeds\[1\]: expected an integer, got 'a'$"),
    ({"name": "x", "betas": [0.9]}, r"^src: betas: expected 2 items, got \[0\.9\]$"),
    ({"name": "x", "count": None}, r"^src: count: cannot be empty$"),
    ({"name": "x", "extra": [1]}, r"^src: extra: expected a mapping, got \[1\]$"),
    ({"name": "x", "inner": {"seed": "one"}}, r"^src: inner\.seed: expected an integer, got 'one'$"),
    ({"count": 1}, r"^src: name: required key is missing$"),
    ({"name": "x", "cuont": 1}, r"^src: unknown key\(s\) \['cuont'\] \(did you mean 'count'\?\); known: betas, count, "),
    ({"name": "x", "inner": {"sed": 1, "zzz": 2}},
     r"^src: unknown key\(s\) \['inner\.sed', 'inner\.zzz'\] \(did you mean 'seed' for 'sed'\?\); known: rate, seed$"),
])  # fmt: skip
def test_bad_values_name_the_source_and_the_key(values, message):
    with pytest.raises(ConfigError, match=message):
        build_dataclass(Outer, values, "src")


def test_the_three_settings_kinds_share_the_coercion():
    """Probe Settings, TrainConfig and FinetuneConfig refuse an unknown key with the same message,
    suggestion included, and accept the same strings."""
    from probes import get_probe
    from probes.core import runner
    from workbench.config import load_train_config
    from workbench.drivers.finetune import load_finetune_config

    syntax = get_probe("syntax").settings
    for build, wrong, right in ((lambda v: runner.make_settings(syntax, v), "sed", "seed"),
                                (lambda v: load_train_config({"family": "gpt", "steps": 1, **v}), "step", "steps"),
                                (lambda v: load_finetune_config({"checkpoint": "x", **v}), "epoch", "epochs")):
        with pytest.raises(ConfigError, match=rf"unknown key\(s\) \['{wrong}'\] \(did you mean '{right}'\?\)"):
            build({wrong: 1})
    assert runner.make_settings(syntax, {"seed": "3", "n_boot": "7"}).resume_key() == \
        runner.make_settings(syntax, {"seed": 3, "n_boot": 7}).resume_key()
    assert load_train_config({"family": "gpt", "steps": "5", "lr": "1e-3"}).training_hash() == \
        load_train_config({"family": "gpt", "steps": 5, "lr": 1e-3}).training_hash()
    assert load_finetune_config({"checkpoint": "x", "epochs": "2", "freeze_body": "true"}).training_hash() == \
        load_finetune_config({"checkpoint": "x", "epochs": 2, "freeze_body": True}).training_hash()


def test_probe_command_line_names_the_option_or_the_file(tmp_path, capsys):
    """A bad value on the command line is named with its option; in a --config file, with the file."""
    from app.cli import main

    assert main(["probe", "syntax", "--n-boot", "many", "--checkpoint", str(tmp_path)]) == 2
    assert "command line: --n-boot: expected an integer, got 'many'" in capsys.readouterr().err
    path = tmp_path / "settings.yaml"
    path.write_text("n_boot: many\nseeed: 1\n")
    assert main(["probe", "syntax", "--config", str(path), "--checkpoint", str(tmp_path)]) == 2
    assert f"{path}: unknown key(s) ['seeed'] (did you mean 'seed'?)" in capsys.readouterr().err
    path.write_text("n_boot: many\n")
    assert main(["probe", "syntax", "--config", str(path), "--checkpoint", str(tmp_path)]) == 2
    assert f"{path}: n_boot: expected an integer, got 'many'" in capsys.readouterr().err


# --------------------------------------------------------------------------- the one override rule
def test_apply_overrides_is_one_rule_for_dotted_keys_mappings_and_unset_flags():
    from workbench.coerce import apply_overrides

    data = {"name": "a", "corpus": {"sources": ["brown"], "split": {"seed": 0, "fraction": 0.1}}, "steps": 10}
    frozen = repr(data)
    dotted = apply_overrides(data, {"corpus.split.seed": 3, "steps": None, "name": "b"})
    nested = apply_overrides(data, {"corpus": {"split": {"seed": 3}}, "name": "b"})
    assert dotted == nested == {"name": "b", "corpus": {"sources": ["brown"], "split": {"seed": 3, "fraction": 0.1}},
                                "steps": 10}
    assert repr(data) == frozen  # the input is not modified
    assert apply_overrides(data, {"corpus": ["x"]})["corpus"] == ["x"]  # a non-mapping replaces
    assert apply_overrides({}, {"a.b": 1}) == {"a": {"b": 1}}  # sections are created
    with pytest.raises(ConfigError, match=r"f.yaml: steps: expected a mapping \(to set x\), got 10"):
        apply_overrides(data, {"steps.x": 1}, "f.yaml")


def test_clear_sets_a_key_to_none_where_none_changes_nothing():
    from workbench.coerce import CLEAR, apply_overrides

    data = {"corpus": {"max_documents": 50, "sources": ["brown"]}, "steps": 10}
    assert apply_overrides(data, {"corpus.max_documents": None}) == data
    assert apply_overrides(data, {"corpus.max_documents": CLEAR, "steps": CLEAR}) == {
        "corpus": {"max_documents": None, "sources": ["brown"]}, "steps": None}
    assert apply_overrides(data, {"corpus": {"max_documents": CLEAR}})["corpus"]["max_documents"] is None
    assert apply_overrides({"corpus": None}, {"corpus": {"max_documents": CLEAR}}) == {"corpus": {"max_documents": None}}


def test_train_set_null_clears_the_key_as_before_the_one_override_rule(tmp_path, monkeypatch):
    """`bertology train CONFIG --set KEY=null` sets KEY to None (it did before issue 41's one override
    rule, where None means "flag not given"): the YAML null reaches the loader as CLEAR."""
    import workbench.drivers.train as train_mod
    from workbench.config import load_train_config

    path = tmp_path / "bert_tiny.yaml"
    path.write_text("family: bert\npreset: tiny\nsteps: 20\ncorpus: {sources: [inaugural], max_documents: 12}\n")
    seen = []
    monkeypatch.setattr(train_mod, "train_from_config", lambda source, overrides, **kw: seen.append(load_train_config(source, overrides)) or [])
    train_mod.train_cli_main([str(path), "--set", "corpus.max_documents=null"])
    train_mod.train_cli_main([str(path), "--set", "corpus.max_documents=7"])
    train_mod.train_cli_main([str(path), "--set", "corpus={max_documents: null}"])  # a null inside a mapping too
    assert [c.corpus.max_documents for c in seen] == [None, 7, None]
    assert seen[-1].corpus.sources == ["inaugural"]  # the mapping merged: its other keys kept


def test_pretraining_config_reads_overrides_by_the_same_rule(tmp_path):
    from workbench.config import load_train_config

    path = tmp_path / "bert_tiny.yaml"
    path.write_text("family: bert\npreset: tiny\nsteps: 20\ncorpus: {sources: [inaugural], max_documents: 12}\n")
    a = load_train_config(path, {"corpus.max_documents": 5, "seeds": None})
    b = load_train_config(path, {"corpus": {"max_documents": 5}})
    assert a.to_dict() == b.to_dict()
    assert a.name == "bert_tiny" and a.corpus.max_documents == 5 and a.corpus.sources == ["inaugural"]
    assert load_train_config(path, {"tokens": 4096}).steps is None  # an override of tokens replaces the file's steps
