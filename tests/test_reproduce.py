"""`bertology reproduce` (app/reproduce): the row registry refuses a row without a citation or a
test, verdicts are computed from each row's stated test (checked on planted numbers), bad input is
one line and exit 2 before any work, a failing row is a `failed` row of the table while the others
run, and `--quick` runs every default row's code path on tiny models trained here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.reproduce import registry as reproduction_registry
from app.reproduce import report, rows as reproduction_rows
from app.reproduce.spec import (DIFFERS, FAILED, REPRODUCED, AllOf, Citation, InRange, IntervalsAbove, Measurement,
                                PaperValue, Row, RowSpecError, Test, WithinTolerance, build_registry)

CITED = PaperValue(Citation(paper="Planted et al. 2020, A Paper", where="Table 1", quote="the number is 10.0",
                            verified=True), 10.0, "score")


def measured(value, low=math.nan, high=math.nan, **components):
    return Measurement(value=value, low=low, high=high, components=components)


def test_a_row_without_a_citation_or_a_test_is_refused():
    with pytest.raises(RowSpecError, match="no citation"):
        Row("r", "f", paper=None, paper_setting="", our_setting="", test=WithinTolerance(1.0), measure=measured)
    with pytest.raises(RowSpecError, match="no stated test"):
        Row("r", "f", paper=CITED, paper_setting="", our_setting="", test=None, measure=measured)
    with pytest.raises(RowSpecError, match="no stated test"):
        Row("r", "f", paper=CITED, paper_setting="", our_setting="", test=Test(), measure=measured)
    with pytest.raises(RowSpecError, match="quotes its source"):
        Citation(paper="P", where="Table 1", quote="", verified=True)
    with pytest.raises(RowSpecError, match="names its paper"):
        Citation(paper="P", where="", quote="q", verified=False)
    row = Row("r", "f", paper=CITED, paper_setting="", our_setting="", test=WithinTolerance(1.0), measure=measured)
    with pytest.raises(RowSpecError, match="two rows named 'r'"):
        build_registry([row, row])


def test_verdicts_come_from_the_stated_test():
    within = WithinTolerance(0.05, relative=True)
    assert within.decide(CITED, measured(10.4)).status == REPRODUCED
    verdict = within.decide(CITED, measured(11.0))
    assert verdict.status == DIFFERS and "ours - paper = 1" in verdict.reason
    above = IntervalsAbove(("a", "b"), 0.0)
    assert above.decide(CITED, measured(0, a=(1.0, 0.2, 1.8), b=(0.5, 0.1, 0.9))).status == REPRODUCED
    verdict = above.decide(CITED, measured(0, a=(1.0, 0.2, 1.8), b=(0.5, -0.1, 0.9)))
    assert verdict.status == DIFFERS and "b" in verdict.reason.split(":")[1].split("(")[0]
    middle = InRange(1 / 3, 2 / 3, "depth")
    assert middle.decide(CITED, measured(0, depth=(0.5, 0.5, 0.5))).status == REPRODUCED
    assert middle.decide(CITED, measured(0, depth=(0.9, 0.9, 0.9))).status == DIFFERS
    both = AllOf((above, middle))
    assert both.decide(CITED, measured(0, a=(1, .1, 2), b=(1, .1, 2), depth=(0.9, 0.9, 0.9))).status == DIFFERS
    with pytest.raises(RowSpecError, match="lacks"):
        above.decide(CITED, measured(0, a=(1.0, 0.2, 1.8)))


def test_every_citation_names_its_source_and_every_row_resolves():
    entries = reproduction_rows.citations()
    assert entries
    for key, entry in entries.items():
        Citation(paper=entry["paper"], where=entry["where"], quote=entry.get("quote") or "",
                 verified=bool(entry.get("verified")))  # refuses an entry without paper, place or quote
        if not entry.get("verified"):
            assert entry.get("note"), f"{key}: an unverified number says why"
    registry = reproduction_registry.registry()
    assert {"tenney2019", "hewitt_manning2019", "strubell2019"} <= set(registry)


def test_the_strubell_row_recomputes_their_energy_from_their_inputs():
    """Their Table 3 inputs through the cost module's own formula (kWh = PUE x hours x W / 1000)."""
    value = reproduction_rows.cited_value
    power, hours = value("strubell2019_bert_base_power_w"), value("strubell2019_bert_base_hours")
    pue, lbs_per_kwh = value("strubell2019_pue_coefficient"), value("strubell2019_co2_per_kwh")
    out = report.reproduce(["strubell2019"], progress=False)
    kwh = pue * hours * power / 1000
    assert out[0].measurement.value == pytest.approx(kwh, rel=1e-9)
    assert out[0].measurement.components["CO2e lbs"][0] == pytest.approx(lbs_per_kwh * kwh, rel=1e-9)
    assert out[0].verdict.status in (REPRODUCED, DIFFERS)


def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, monkeypatch, capsys):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    assert main(["reproduce", "--rows", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown reproduction row(s) nosuch; known: tenney2019" in err[0]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert main(["reproduce", "--rows", "hewitt_manning2019"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs sentence-transformers/all-mpnet-base-v2 in the local Hugging Face cache" in err[0]
    unverified = [k for k, r in reproduction_registry.registry().items() if not r.paper.verified]
    if unverified:
        assert main(["reproduce", "--rows", unverified[0], "--strict"]) == 2
        assert "--strict: the paper numbers of" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing was run or written


def test_a_failing_row_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(context):
        raise ValueError("planted failure\nsecond line")

    planted = Row("planted_failure", "a row that raises", paper=CITED, paper_setting="", our_setting="",
                  test=WithinTolerance(1.0), measure=broken)
    fine = Row("planted_fine", "a row that works", paper=CITED, paper_setting="", our_setting="",
               test=WithinTolerance(1.0), measure=lambda context: measured(10.5, 10.0, 11.0))
    monkeypatch.setattr(reproduction_registry, "registry", lambda: {r.key: r for r in (planted, fine)})
    outcomes = report.reproduce(["planted_failure", "planted_fine"], store=None, progress=False)
    assert [o.verdict.status for o in outcomes] == [FAILED, REPRODUCED]
    assert outcomes[0].verdict.reason == "ValueError: planted failure"
    text = report.format_outcomes(outcomes)
    assert "| planted_failure |" in text and "**failed**: ValueError: planted failure" in text
    paths = report.write(outcomes, tmp_path / "out", "bertology reproduce", quick=False, png=False)
    assert {p.name for p in paths} == {"reproduce.md", "reproduce.csv", "reproduce.json", "reproduce.html",
                                       "manifest.json"}


@pytest.mark.slow
def test_quick_runs_every_default_row_on_tiny_models(tmp_path, monkeypatch, capsys):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    code = main(["reproduce", "--quick", "--threads", "1", "--quiet", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    default = [k for k, r in reproduction_registry.registry().items() if not r.full]
    for key in default:
        line = next(l for l in printed.splitlines() if l.startswith(f"| {key} |"))
        assert "**failed**" not in line, line
        assert "**reproduced**" in line or "**differs**" in line
    assert code == 0
    csv = (tmp_path / "out" / "reproduce.csv").read_text()
    assert all(key in csv for key in default)


@pytest.mark.slow
def test_the_reproductions_page_shows_the_latest_table(tmp_path, monkeypatch):
    """An empty runs root names the command; after a run the page shows every row and its verdict."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    app = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    at = AppTest.from_file(app, default_timeout=120)
    at.query_params["page"] = "reproduce"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("bertology reproduce" in i.value for i in at.info)

    fine = Row("planted_fine", "a planted finding", paper=CITED, paper_setting="", our_setting="",
               test=WithinTolerance(1.0), measure=lambda context: measured(10.5, 10.0, 11.0))
    monkeypatch.setattr(reproduction_registry, "registry", lambda: {fine.key: fine})
    outcomes = report.reproduce(["planted_fine"], progress=False)
    report.write(outcomes, report.latest_folder(tmp_path / "runs", quick=False), "bertology reproduce", quick=False,
                 png=False)
    at = AppTest.from_file(app, default_timeout=120)
    at.query_params["page"] = "reproduce"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    shown = at.dataframe[0].value
    assert list(shown["row"][:1]) == ["planted_fine"] and list(shown["verdict"][:1]) == ["reproduced"]


# --------------------------------------------------------------------------- rows 4, 5, 6, 8 (issue 50)
def test_the_codelength_row_compares_compression_and_accuracy_ratios_on_planted_numbers():
    """Voita & Titov's comparison: compression ratio trained / twin against the accuracy ratio's
    paired-bootstrap CI; their own ELMo numbers (compression 58.8 vs 38.5, accuracy 97.8 vs 95.7)
    reproduce, a twin that compresses as well as the model does not."""
    row = reproduction_registry.registry()["voita_titov2020"]
    assert row.paper.value == pytest.approx(294 / 192) and row.paper.verified
    boot_t, boot_r = np.array([0.977, 0.978, 0.979]), np.array([0.956, 0.957, 0.958])
    parts = reproduction_rows.codelength_components((58.8, 38.5), ((0.978, boot_t), (0.957, boot_r)))
    assert parts["compression ratio"][0] == pytest.approx(58.8 / 38.5)
    a, lo, hi = parts["accuracy ratio"]
    assert a == pytest.approx(0.978 / 0.957) and lo <= a <= hi
    c, c_lo, c_hi = parts["compression ratio - accuracy ratio"]
    assert c == pytest.approx(58.8 / 38.5 - a) and c_lo == pytest.approx(58.8 / 38.5 - hi)
    assert row.test.decide(row.paper, measured(58.8 / 38.5, **parts)).status == REPRODUCED
    same = reproduction_rows.codelength_components((40.0, 40.0), ((0.978, boot_t), (0.957, boot_r)))
    assert row.test.decide(row.paper, measured(1.0, **same)).status == DIFFERS
    no_ci = reproduction_rows.codelength_components((58.8, 38.5), ((0.978, None), (0.957, None)))
    assert math.isnan(no_ci["accuracy ratio"][1])


def test_the_coref_head_and_gap_rows_decide_on_planted_numbers():
    head = reproduction_registry.registry()["clark2019"]
    key = "best head - nearest mention (CI: head's low - rule's high)"
    middle = measured(0.6, 0.55, 0.65, **{key: (0.3, 0.2, 0.4), "relative depth of the best head": (5 / 12,) * 3})
    assert head.test.decide(head.paper, middle).status == REPRODUCED
    late = measured(0.6, 0.55, 0.65, **{key: (0.3, 0.2, 0.4), "relative depth of the best head": (11 / 12,) * 3})
    assert head.test.decide(head.paper, late).status == DIFFERS
    weak = measured(0.3, 0.25, 0.35, **{key: (0.02, -0.05, 0.09), "relative depth of the best head": (0.5,) * 3})
    assert head.test.decide(head.paper, weak).status == DIFFERS
    gap = reproduction_registry.registry()["webster2018"]
    assert gap.paper.value == pytest.approx(0.669) and gap.paper.verified
    margin = reproduction_rows.GAP_MARGIN
    at_level = measured(0.68, 0.65, 0.71, **{margin: (0.1, 0.02, 0.18)})
    assert gap.test.decide(gap.paper, at_level).status == REPRODUCED
    beyond = measured(0.80, 0.77, 0.83, **{margin: (0.22, 0.14, 0.3)})
    verdict = gap.test.decide(gap.paper, beyond)
    assert verdict.status == DIFFERS and "ours - paper = 0.131" in verdict.reason
    no_better_than_rules = measured(0.66, 0.62, 0.70, **{margin: (0.01, -0.05, 0.08)})
    assert gap.test.decide(gap.paper, no_better_than_rules).status == DIFFERS


def test_the_cka_row_reads_a_monotone_layer_map_and_resamples_cka_by_sentence():
    from probes.core.statistics import resample_counts
    from workbench.geometry import cka_matrix_bootstrap, linear_cka

    spearman = reproduction_rows.best_match_spearman
    diagonal = np.eye(4) + 0.1
    assert spearman(diagonal) == pytest.approx(1.0)
    assert spearman(diagonal[::-1]) == pytest.approx(-1.0)
    assert spearman(np.tile([0.1, 0.9, 0.2], (3, 1))) == 0.0  # every layer matches the same one
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(30, 5)) for _ in range(2)]
    ys = [xs[0] @ rng.normal(size=(5, 3)), rng.normal(size=(30, 4))]
    units = np.repeat(np.arange(10), 3)  # ten sentences of three words
    counts = list(resample_counts(10, 3, seed=1))
    boot = cka_matrix_bootstrap(xs, ys, units, iter(counts))
    assert boot.shape == (3, 2, 2)
    for b, c in enumerate(counts[0]):  # the Gram route equals linear_cka on the resampled rows
        idx = np.concatenate([np.repeat(np.flatnonzero(units == u), int(k)) for u, k in enumerate(c)])
        for i in range(2):
            for j in range(2):
                assert boot[b, i, j] == pytest.approx(linear_cka(xs[i][idx], ys[j][idx]), rel=1e-5)
    row = reproduction_registry.registry()["kornblith2019"]
    name = "Spearman(layer, best-matching layer)"
    assert row.test.decide(row.paper, measured(0.95, **{name: (0.95, 0.8, 1.0)})).status == REPRODUCED
    assert row.test.decide(row.paper, measured(0.6, **{name: (0.6, 0.2, 0.9)})).status == DIFFERS


@pytest.mark.slow
def test_quick_runs_the_encoder_rows_of_issue_50(tmp_path, monkeypatch, capsys):
    """The codelength, coreference-head, GAP and CKA rows' code paths on the tiny models: a verdict,
    never `failed`, with finite numbers and the run ids behind them."""
    keys = ["voita_titov2020", "clark2019", "webster2018", "kornblith2019"]
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    from workbench.store.results import ResultsStore

    outcomes = report.reproduce(keys, quick=True, store=ResultsStore(tmp_path / "runs"), threads=1, progress=False)
    for o in outcomes:
        assert o.verdict.status in (REPRODUCED, DIFFERS), (o.row.key, o.verdict)
        assert math.isfinite(o.measurement.value) and o.measurement.run_ids, o.row.key
    by_key = {o.row.key: o.measurement for o in outcomes}
    assert -1.0 <= by_key["kornblith2019"].value <= 1.0
    assert by_key["kornblith2019"].low <= by_key["kornblith2019"].high
    assert 0.0 <= by_key["clark2019"].value <= 1.0 and 0.0 <= by_key["webster2018"].value <= 1.0
    assert by_key["voita_titov2020"].value > 0
