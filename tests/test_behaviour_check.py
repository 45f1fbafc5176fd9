"""experiments/diagnostics/behaviour_check.py's comparison logic on planted inputs (no training,
no git archive): a changed value, a missing row, a changed weight hash and a changed tensor byte
are found; paths, run ids and wall-clock cells are not differences; the dropped seed-mean rows of
issue 41 are "expected" only when they are exactly what differs; bad arguments exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "diagnostics" / "behaviour_check.py"


@pytest.fixture(scope="module")
def bc():
    spec = importlib.util.spec_from_file_location("behaviour_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(model="m", seed=0, metric="accuracy", split="test", value=0.5, extra=None, step=None):
    return {"run_id": "20261129T080000.000000Z-abcd", "model": model, "family": "bert", "seed": seed, "step": step,
            "probe": "finetune", "task": "sentence_polarity", "split": split, "stack": None, "layer": None,
            "metric": metric, "value": value, "n": 32, "ci_low": None, "ci_high": None,
            "extra": json.dumps(extra or {})}


def _frame(rows):
    df = pd.DataFrame(rows)
    for c in ("seed", "step", "layer", "n"):
        df[c] = df[c].astype("Int64")
    for c in ("value", "ci_low", "ci_high"):
        df[c] = df[c].astype("float64")
    return df


def _norm(bc, rows, replacements=()):
    return bc.normalise_rows(_frame(rows), list(replacements))[0]


def _per_seed(value0=0.5, value1=0.75, **extra):
    """Two seeds' rows, each with its own step count (as fine-tuning writes them)."""
    return [_row(seed=0, value=value0, extra={"epoch": 1, **extra}, step=4),
            _row(seed=1, value=value1, extra={"epoch": 1, **extra}, step=4)]


def _seed_mean(value=0.625):
    return _row(seed=None, value=value, extra={"interval": "t, 95%", "method": "full", "over": "seeds"})


def test_identical_rows_are_identical_whatever_their_order_and_run_ids(bc):
    rows = _per_seed() + [_seed_mean()]
    other = [dict(r, run_id="20261129T090000.000000Z-ffff") for r in reversed(rows)]
    res = bc.compare_rows(_norm(bc, rows), _norm(bc, other))
    assert res["status"] == "identical" and res["matched"] == 3 and res["changed_rows"] == 0


def test_a_changed_value_is_found_with_both_values(bc):
    res = bc.compare_rows(_norm(bc, _per_seed()), _norm(bc, _per_seed(value1=0.75 + 2**-40)))
    assert res["status"] == "differs" and res["changed_rows"] == 1 and res["changed_columns"] == ["value"]
    (change,) = res["first_changed"]
    assert change["row"]["seed"] == 1
    assert change["differences"]["value"] == {"reference": 0.75, "candidate": 0.75 + 2**-40}


def test_a_changed_extra_key_and_a_missing_extra_key_are_found(bc):
    cand = [_row(seed=0, value=0.5, extra={"epoch": 2, "best_epoch": 1}, step=4),
            _row(seed=1, value=0.75, extra={"epoch": 1}, step=4)]
    res = bc.compare_rows(_norm(bc, _per_seed(best_epoch=1)), _norm(bc, cand))
    assert res["status"] == "differs" and res["changed_columns"] == ["extra.best_epoch", "extra.epoch"]
    diffs = {c["row"]["seed"]: c["differences"] for c in res["first_changed"]}
    assert diffs[0] == {"extra.epoch": {"reference": 1, "candidate": 2}}
    assert diffs[1] == {"extra.best_epoch": {"reference": 1, "candidate": "<absent>"}}


def test_a_missing_per_seed_row_and_an_extra_row_are_found(bc):
    ref, cand = _per_seed(), _per_seed()[:1] + [_row(seed=0, split="dev", value=0.5, step=4)]
    res = bc.compare_rows(_norm(bc, ref), _norm(bc, cand))
    assert res["status"] == "differs" and (res["only_in_reference"], res["only_in_candidate"]) == (1, 1)
    assert res["first_only_in_reference"][0]["seed"] == 1 and res["first_only_in_candidate"][0]["split"] == "dev"


def test_dropped_seed_means_are_expected_only_when_they_are_all_that_differs(bc):
    ref = _norm(bc, _per_seed() + [_seed_mean()])
    res = bc.compare_rows(ref, _norm(bc, _per_seed()))
    assert res["status"] == "expected" and res["only_in_reference"] == 1 and "seed statistics" in res["note"]
    # plus one changed per-seed value: a real difference
    assert bc.compare_rows(ref, _norm(bc, _per_seed(value0=0.25)))["status"] == "differs"
    # a seedless row that is not a seed statistic of the per-seed rows (value out of their range,
    # or no `over: seeds`) is a real loss
    assert bc.compare_rows(_norm(bc, _per_seed() + [_seed_mean(0.9)]), _norm(bc, _per_seed()))["status"] == "differs"
    plain = _row(seed=None, metric="parameters", split=None, value=1000.0)
    assert bc.compare_rows(_norm(bc, _per_seed() + [plain]), _norm(bc, _per_seed()))["status"] == "differs"


def test_paths_run_ids_and_wall_clock_cells_are_ignored_and_listed(bc, tmp_path):
    def side(root, latency, elapsed):
        return [_row(seed=0, extra={"checkpoint": f"{root}/finetune/seed-0/best", "elapsed_s": elapsed}),
                _row(seed=None, metric="latency_ms", split=None, value=latency,
                     extra={"role": "student", "fraction_of_teacher": latency / 10, "teacher_value": 10.0 + latency})]

    ref_job, cand_job = "/tmp/x/work/reference/job", "/tmp/x/work/candidate/job"
    a, ignored = bc.normalise_rows(_frame(side(ref_job, 3.0, 1.5)), [(ref_job, "<JOB>")])
    b, _ = bc.normalise_rows(_frame(side(cand_job, 7.0, 2.5)), [(cand_job, "<JOB>")])
    assert a[0]["extra"]["checkpoint"] == "<JOB>/finetune/seed-0/best"
    assert bc.compare_rows(a, b)["status"] == "identical"
    assert ignored == {"column run_id": 2, "extra.elapsed_s": 1, "metric latency_ms (value, interval)": 1,
                       "extra.fraction_of_teacher": 1, "extra.teacher_value": 1}
    # an unrelated path left as it is still differs
    c, _ = bc.normalise_rows(_frame(side("/tmp/x/work/candidate/job", 3.0, 1.5)), [])
    assert bc.compare_rows(a, c)["changed_columns"] == ["extra.checkpoint"]


def test_a_changed_weight_hash_is_found(bc):
    ref = {"bert/pcg16/module": "a" * 64, "bert/pcg16/log": "b" * 64}
    assert bc.compare_hashes(ref, dict(ref))["status"] == "identical"
    res = bc.compare_hashes(ref, {**ref, "bert/pcg16/module": "c" * 64})
    assert res["status"] == "differs" and res["differences"] == [{"key": "bert/pcg16/module", "reference": "a" * 64,
                                                                  "candidate": "c" * 64}]
    missing = bc.compare_hashes(ref, {"bert/pcg16/log": "b" * 64})
    assert missing["differences"][0]["candidate"] is None


def test_tensor_hash_sees_one_ulp_and_a_dtype_but_not_the_order(bc):
    state = {"w": torch.linspace(-1, 1, 12).reshape(3, 4), "b": torch.zeros(4)}
    h = bc.tensors_sha(state.items())
    assert h == bc.tensors_sha(reversed(list(state.items())))
    nudged = state["w"].clone()
    nudged[1, 2] = torch.nextafter(nudged[1, 2], torch.tensor(2.0))
    assert bc.tensors_sha({**state, "w": nudged}.items()) != h
    assert bc.tensors_sha({**state, "b": torch.zeros(4, dtype=torch.float64)}.items()) != h


def test_checkpoint_and_log_hashes_read_the_files(bc, tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.ones(3)}, tmp_path / "model.safetensors")
    h = bc.checkpoint_tensors_sha(tmp_path)
    save_file({"x": torch.tensor([1.0, 1.0, 1.5])}, tmp_path / "model.safetensors")
    assert bc.checkpoint_tensors_sha(tmp_path) != h
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 1, "loss": 2.5, "elapsed": 0.1}) + "\n")
    h = bc.log_sha(log)
    log.write_text(json.dumps({"step": 1, "loss": 2.5, "elapsed": 9.9}) + "\n")
    assert bc.log_sha(log) == h  # wall clock is not behaviour
    log.write_text(json.dumps({"step": 1, "loss": 2.5000001, "elapsed": 0.1}) + "\n")
    assert bc.log_sha(log) != h


def test_store_rows_are_read_from_every_run_and_temporary_folders_skipped(bc, tmp_path):
    for run, rows in (("20261129T1", _per_seed()), (".20261129T2.x.tmp", [_seed_mean()])):
        (tmp_path / "results" / run).mkdir(parents=True)
        _frame(rows).to_parquet(tmp_path / "results" / run / "rows.parquet")
    df = bc.read_store_rows(tmp_path)
    assert sorted(df["seed"].tolist()) == [0, 1]


@pytest.mark.parametrize("argv, message", [
    (["--reference", "no-such-revision-xyz"], "'no-such-revision-xyz' is not a commit"),
    (["--reference", "HEAD", "--families", "bert,bort"], "--families: bort not among"),
    (["--reference", "HEAD", "--jobs", "syntax", "--families", "gpt"], "need the tiny BERT bert/pcg16"),
])
def test_bad_arguments_are_one_line_and_exit_2_before_any_work(bc, tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert bc.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_dropped_zero_one_seed_statistic_without_per_seed_rows_is_expected_only_as_zero_or_one(bc):
    wins = _row(seed=None, metric="wins", value=1.0, extra={"method": "imp", "over": "seeds"})
    res = bc.compare_rows(_norm(bc, _per_seed() + [wins]), _norm(bc, _per_seed()))
    assert res["status"] == "expected" and res["only_in_reference"] == 1
    half = _row(seed=None, metric="wins", value=0.5, extra={"method": "imp", "over": "seeds"})
    assert bc.compare_rows(_norm(bc, _per_seed() + [half]), _norm(bc, _per_seed()))["status"] == "differs"
    other = _row(seed=None, metric="sparsity", value=1.0, extra={"method": "imp", "over": "seeds"})
    assert bc.compare_rows(_norm(bc, _per_seed() + [other]), _norm(bc, _per_seed()))["status"] == "differs"
