"""The reproduction rows on causal LMs (app/reproduce/rows_lm.py: oLMpics, the Secret Sharer) and the
test kinds they brought (`IntervalsContain`, `IntervalsBelow`): verdicts on planted numbers, the
measure functions on planted probe rows, and a finished run found again whatever its name. Their
`--quick` code path runs in tests/test_reproduce.py's quick test with every default row."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from app.reproduce import registry as reproduction_registry
from app.reproduce import rows as reproduction_rows, rows_lm
from app.reproduce.spec import (DIFFERS, REPRODUCED, Citation, IntervalsBelow, IntervalsContain, Measurement,
                                PaperValue, RowSpecError)

CITED = PaperValue(Citation(paper="Planted et al. 2020, A Paper", where="Table 1", quote="q", verified=True), None)


def measured(**components):
    return Measurement(value=0.0, components=components)


def test_intervals_contain_and_below_decide_on_planted_numbers():
    contain = IntervalsContain(("a - chance", "b - chance"), 0.0)
    assert contain.decide(CITED, measured(**{"a - chance": (0.01, -0.1, 0.12), "b - chance": (0, -0.2, 0.2)})).status == REPRODUCED
    verdict = contain.decide(CITED, measured(**{"a - chance": (0.2, 0.1, 0.3), "b - chance": (0, -0.2, 0.2)}))
    assert verdict.status == DIFFERS and verdict.reason.startswith("not containing 0: a - chance (")
    assert contain.decide(CITED, measured(**{"a - chance": (0, 0.0, 0.1), "b - chance": (0, -0.1, 0.0)})).status == REPRODUCED
    below = IntervalsBelow(("exposure",), math.log2(20))
    assert below.decide(CITED, measured(exposure=(1.4, 0.5, 3.0))).status == REPRODUCED
    verdict = below.decide(CITED, measured(exposure=(2.3, 0.1, 5.8)))
    assert verdict.status == DIFFERS and "not below 4.32: exposure" in verdict.reason
    for test in (contain, below):
        with pytest.raises(RowSpecError, match="lacks"):
            test.decide(CITED, measured())
    assert "contains 0" in contain.description and "below 4.32" in below.description


def test_the_lm_rows_are_registered_with_citations_and_tests():
    registry = reproduction_registry.registry()
    for key in ("talmor2020", "carlini2019"):
        row = registry[key]
        assert row.paper.citation.paper and row.test.description and not row.full
    assert registry["talmor2020"].models == (reproduction_rows.SMOLLM,)
    assert registry["carlini2019"].models == ()  # trained here


def cloze_rows(scores: dict[str, tuple[float, float, float]], chance: float, task: str) -> pd.DataFrame:
    records = [{"model": "m", "task": task, "metric": "random_acc", "value": chance, "ci_low": np.nan, "ci_high": np.nan}]
    for metric in ("zero_shot_acc", "zero_shot_contextual_acc", "zero_shot_pmi_dc_acc", "nonsense_acc"):
        v, lo, hi = scores.get(metric, scores["zero_shot_acc"])
        records.append({"model": "m", "task": task, "metric": metric, "value": v, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame.from_records(records)


def test_the_olmpics_row_decides_on_the_raw_rule_against_chance(monkeypatch):
    planted = {"antonym": cloze_rows({"zero_shot_acc": (0.70, 0.63, 0.76), "zero_shot_pmi_dc_acc": (0.5, 0.44, 0.57)}, 0.5, "antonym"),
               "always-never": cloze_rows({"zero_shot_acc": (0.2, 0.04, 0.36)}, 0.2, "always-never"),
               "multihop": cloze_rows({"zero_shot_acc": (0.333, 0.27, 0.40)}, 1 / 3, "multihop")}
    asked = []

    def fake(ctx, probe, checkpoint, settings):
        asked.append((probe, checkpoint, settings))
        return f"run-{settings['tasks'][0]}", planted[settings["tasks"][0]]

    monkeypatch.setattr(rows_lm, "probe_reusing", fake)
    ctx = SimpleNamespace(models={"causal": "planted-causal"}, quick=False)
    m = rows_lm.measure_olmpics(ctx)
    assert [a[2]["tasks"] for a in asked] == [["antonym"], ["always-never"], ["multihop"]]
    assert all(a[2]["scoring"] == ["raw", "contextual", "pmi_dc"] and a[2]["n_test"] == 200 for a in asked)
    assert m.components["antonym - chance"] == pytest.approx((0.2, 0.13, 0.26))
    assert (m.value, m.low, m.high) == pytest.approx((0.70, 0.63, 0.76))
    assert m.run_ids == ("run-antonym", "run-always-never", "run-multihop")
    assert "pmi_dc 0.500" in m.detail
    assert rows_lm.olmpics_test().decide(CITED, m).status == REPRODUCED
    planted["multihop"] = cloze_rows({"zero_shot_acc": (0.45, 0.39, 0.52)}, 1 / 3, "multihop")
    verdict = rows_lm.olmpics_test().decide(CITED, rows_lm.measure_olmpics(ctx))
    assert verdict.status == DIFFERS and "multihop - chance" in verdict.reason


def test_the_secret_sharer_row_on_planted_exposures(monkeypatch):
    import json

    reps = [0] * 8 + [1] * 4 + [4] * 4 + [16] * 4 + [64] * 4
    rng = np.random.default_rng(0)
    values = [float(rng.exponential(1 / np.log(2))) if r == 0 else 0.5 + 0.15 * r for r in reps]
    frame = pd.DataFrame({"task": "exposure", "metric": "exposure", "value": values,
                          "extra": [json.dumps({"repetitions": r, "candidate_space": 10_000, "method": "exact"}) for r in reps]})
    monkeypatch.setattr(rows_lm, "train_canary_model", lambda ctx: "planted-gpt")
    monkeypatch.setattr(rows_lm, "probe_reusing", lambda ctx, probe, ck, settings: ("run-x", frame))
    m = rows_lm.measure_secret_sharer(SimpleNamespace(quick=False))
    rho = m.components["Spearman rho (exposure, repetitions)"]
    assert rho[0] == pytest.approx(1.0) and rho[1] > 0.5
    unseen = m.components["unseen canaries' mean exposure"]
    assert unseen[0] == pytest.approx(np.mean(values[:8])) and unseen[1] <= unseen[0] <= unseen[2]
    assert rows_lm.secret_sharer_test().decide(CITED, m).status == REPRODUCED
    assert "|R| = 10,000 (exact)" in m.data


def test_spearman_bootstrap_matches_scipy_and_spans_zero_on_noise():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(1)
    x = np.repeat([1, 4, 16, 64], 4)
    y = rng.normal(size=16)
    rho, low, high = rows_lm.spearman_bootstrap(x, y)
    assert rho == pytest.approx(spearmanr(x, y).statistic) and low < 0 < high


def test_a_finished_run_with_the_same_settings_is_read_again_under_any_name(tmp_path, monkeypatch):
    """`probe_reusing` finds a run a documented command made (another name, other threads), skips one
    whose settings decide other rows, and runs the probe when none matches."""
    from workbench.store import checkpoints
    from workbench.store.results import ResultsStore

    store = ResultsStore(tmp_path / "runs")
    monkeypatch.setattr(checkpoints, "expand_checkpoints", lambda items: [SimpleNamespace(path="/planted/ck", name="ck")])

    def publish(settings, version=None):
        from probes import get_probe

        version = get_probe("cloze").version if version is None else version
        from probes import get_probe
        from probes.core.runner import resolve_settings

        config = {"probe": "cloze", "checkpoints": ["/planted/ck"],
                  **resolve_settings(get_probe("cloze"), settings, "planted").as_config()}
        with store.start_run("probe", config, name=settings.get("name")) as run:
            run.note("probe_version", version)
            run.add([{"probe": "cloze", "task": settings["tasks"][0], "metric": "zero_shot_acc", "value": 0.5}])
            return run.finish()

    wanted = dict(rows_lm.CLOZE_SETTINGS, tasks=["antonym"])
    publish(dict(wanted, n_test=100, name="other-settings"))
    same = publish(dict(wanted, name="cloze-smollm2-calibration", threads=3))
    ran = []
    ctx = reproduction_rows.Context(store=store, quick=False, models={}, threads=1, progress=False)
    monkeypatch.setattr(reproduction_rows.Context, "probe", lambda self, *a: ran.append(a) or ("new", pd.DataFrame()))
    run_id, rows = rows_lm.probe_reusing(ctx, "cloze", "planted", wanted)
    assert run_id == same and list(rows["metric"]) == ["zero_shot_acc"] and not ran
    assert rows_lm.probe_reusing(ctx, "cloze", "planted", dict(wanted, n_test=50))[0] == "new" and ran
    # a run of another version of the probe's code is not reused, whatever its settings
    ran.clear()
    from probes import get_probe

    stale = publish(dict(wanted, n_test=77, name="older-code"), version=get_probe("cloze").version - 1)
    assert stale and rows_lm.probe_reusing(ctx, "cloze", "planted", dict(wanted, n_test=77))[0] == "new" and ran


def test_a_row_asking_again_re_reads_its_keyed_run_and_a_new_probe_version_recomputes(tmp_path, monkeypatch):
    """`Context.probe` names each run by its key (probe, checkpoints, settings, code version): the second
    call re-reads the first run; after the probe's version changes, the same call runs again."""
    from probes import get_probe
    from probes.core import runner
    from workbench.store.results import ResultsStore

    store = ResultsStore(tmp_path / "runs")
    calls = []

    def fake_run_probe(spec, checkpoints, settings, store):
        calls.append(settings.name)
        with store.start_run("probe", {"probe": spec.name}, name=settings.name) as run:
            run.add([{"probe": spec.name, "task": "antonym", "metric": "zero_shot_acc", "value": 0.5 + len(calls)}])
        return run.run_id, store.read(run.run_id)

    monkeypatch.setattr(runner, "run_probe", fake_run_probe)
    ctx = reproduction_rows.Context(store=store, quick=False, models={}, threads=1, progress=False)
    settings = dict(rows_lm.CLOZE_SETTINGS, tasks=["antonym"])
    first, _ = ctx.probe("cloze", "planted-model", settings)
    again, rows = ctx.probe("cloze", "planted-model", dict(settings, threads=4))  # threads decide no row
    assert again == first and len(calls) == 1 and rows["value"].tolist() == [1.5]
    assert calls[0].startswith("reproduce-cloze:")
    # the probe's code version goes up (what a probe's `version` bump does to every key)
    monkeypatch.setattr(type(get_probe("cloze")), "key_material", lambda self: {"probe_version": self.version + 1})
    newer, rows = ctx.probe("cloze", "planted-model", settings)
    assert newer != first and len(calls) == 2 and calls[1] != calls[0] and rows["value"].tolist() == [2.5]
