"""Run the reproduction rows and write what they found: one table (Markdown and CSV) and one figure.

`reproduce(keys, full, quick, ...)` checks everything it can before any work (unknown rows, a real
row whose model is not in the Hugging Face cache, an unverified number under `strict`), then runs
each row with a row counter above the row's own bars; a row that raises is reported as `failed`
with its one-line reason and the other rows still run.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from app.reproduce.spec import FAILED, NOT_COMPARABLE, Measurement, Row, Verdict, fmt
from workbench.errors import ConfigError

COLUMNS = ["row", "finding", "paper", "where", "paper_value", "verified", "ours", "ci_low", "ci_high", "model",
           "data", "test", "verdict", "reason", "detail", "run_ids", "seconds"]


@dataclass
class Outcome:
    row: Row
    measurement: Measurement | None
    verdict: Verdict
    seconds: float


def select_rows(keys: list[str] | None, full: bool) -> list[Row]:
    """The rows asked for (default: every row that is not `full`-only, all with `full`); an unknown
    key is a ConfigError naming the known ones."""
    from app.reproduce.registry import registry

    known = registry()
    if keys:
        unknown = [k for k in keys if k not in known]
        if unknown:
            raise ConfigError(f"unknown reproduction row(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return [known[k] for k in keys]
    return [r for r in known.values() if full or not r.full]


def check_models(rows: list[Row]) -> None:
    """Every real row's models are in the local Hugging Face cache (nothing is downloaded)."""
    from workbench.errors import CheckpointError
    from workbench.store.checkpoints import resolve_checkpoint

    for row in rows:
        for name in row.models:
            try:
                resolve_checkpoint(name)
            except CheckpointError:
                raise ConfigError(f"row {row.key} needs {name} in the local Hugging Face cache "
                                  f"(shared/tools/install-pretrained installs it)") from None


def check_strict(rows: list[Row]) -> None:
    unverified = [r.key for r in rows if not r.paper.verified]
    if unverified:
        raise ConfigError(f"--strict: the paper numbers of {', '.join(unverified)} are unverified "
                          f"(app/reproduce/citations.yaml says why)")


def run_row(row: Row, context) -> Outcome:
    start = time.perf_counter()
    try:
        measurement = row.measure(context)
        verdict = row.test.decide(row.paper, measurement)
    except Exception as err:  # a failing row is a row of the table, not the end of the command
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return Outcome(row, None, Verdict(FAILED, f"{type(err).__name__}: {reason}"), time.perf_counter() - start)
    return Outcome(row, measurement, verdict, time.perf_counter() - start)


def row_unit(key: str, runs_root: str, quick: bool, models: dict[str, str], threads: int | None,
             progress: bool) -> tuple[Measurement | None, Verdict, float]:
    """One row as a unit of the executor (module level, plain arguments and results: it pickles into
    a local process or a Slurm job, where the row is looked up again by its key)."""
    from app.reproduce.registry import registry
    from app.reproduce.rows import Context
    from workbench.store.results import ResultsStore

    context = Context(store=ResultsStore(runs_root), quick=quick, models=models, threads=threads, progress=progress)
    outcome = run_row(registry()[key], context)
    return outcome.measurement, outcome.verdict, outcome.seconds


def reproduce(keys: list[str] | None = None, full: bool = False, quick: bool = False, strict: bool = False,
              store=None, threads: int | None = None, progress: bool = True, executor=None) -> list[Outcome]:
    """Run the rows (module docstring) through the executor (`ExecutorOptions`; default: one after the
    other in this process, a row counter above each row's own bars); their outcomes in order."""
    from app.reproduce.rows import REAL_MODELS, quick_models
    from workbench.drivers.executor import ExecutorOptions, Unit, run_units
    from workbench.store.results import ResultsStore

    rows = select_rows(keys, full)
    if strict:
        check_strict(rows)
    if not quick:
        check_models(rows)
    options = (executor or ExecutorOptions(progress=progress)).validate()
    store = store or ResultsStore()
    models = quick_models(store.root, progress) if quick else dict(REAL_MODELS)
    root = str(store.root)
    row_progress = progress and options.runs_in_process(len(rows))  # bars of parallel rows would interleave
    units = [Unit(row_unit, (r.key, root, quick, models, threads, row_progress), name=f"row {r.key}") for r in rows]
    results = run_units(units, options, desc="reproduce")
    return [Outcome(row, measurement, verdict, seconds) for row, (measurement, verdict, seconds) in zip(rows, results)]


def table(outcomes: list[Outcome]) -> pd.DataFrame:
    """One row per reproduction, then the findings not comparable here."""
    from app.reproduce.registry import NOT_COMPARABLE_HERE

    records = []
    for o in outcomes:
        m, c = o.measurement, o.row.paper.citation
        records.append({
            "row": o.row.key, "finding": o.row.finding, "paper": c.paper, "where": c.where,
            "paper_value": o.row.paper.value, "verified": c.verified,
            "ours": None if m is None else m.value, "ci_low": None if m is None else m.low,
            "ci_high": None if m is None else m.high, "model": "" if m is None else m.model,
            "data": "" if m is None else m.data, "test": o.row.test.description, "verdict": o.verdict.status,
            "reason": o.verdict.reason, "detail": "" if m is None else m.detail,
            "run_ids": "" if m is None else ",".join(m.run_ids), "seconds": round(o.seconds, 1)})
    for nc in NOT_COMPARABLE_HERE:
        records.append({"row": nc.key, "finding": nc.finding, "paper": nc.paper, "verdict": NOT_COMPARABLE,
                        "reason": nc.reason})
    return pd.DataFrame.from_records(records, columns=COLUMNS)


def _number(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def _cell(x: Any) -> str:
    """A Markdown cell: empty for a missing value, pipes escaped."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return str(x).replace("|", "\\|").replace("\n", " ")


def markdown(frame: pd.DataFrame) -> str:
    """The table as Markdown: paper number (marked unverified), ours with its CI, the test, the verdict."""
    lines = ["| row | finding | paper | paper's number | ours [95% CI] | model | test | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples(index=False):
        paper_number = _number(r.paper_value)
        if paper_number and r.verified is False:
            paper_number += " (unverified)"
        ours = _number(r.ours)
        if ours and _number(r.ci_low):
            ours += f" [{_number(r.ci_low)}, {_number(r.ci_high)}]"
        where = f"{r.paper}, {r.where}" if _cell(r.where) else r.paper
        verdict = f"**{r.verdict}**: {_cell(r.reason)}" if _cell(r.reason) else f"**{r.verdict}**"
        lines.append(f"| {r.row} | {_cell(r.finding)} | {_cell(where)} | {paper_number} | {ours} | {_cell(r.model)} | "
                     f"{_cell(r.test)} | {verdict} |")
    return "\n".join(lines) + "\n"


VERDICT_COLOURS = {"reproduced": "#2ca02c", "differs": "#d62728", "failed": "#7f7f7f", NOT_COMPARABLE: "#bcbd22"}


def figure(outcomes: list[Outcome]):
    """Panel 1: relative depth per task on our model beside the paper's markers; panel 2: each numeric
    row as ours / paper with its CI, coloured by verdict."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Where in depth (relative layer)", "Ours / paper"))
    for o in outcomes:
        if o.measurement is None:
            continue
        for task, (ours, paper) in o.measurement.depths.items():
            name = f"{o.row.key}: {task}"
            fig.add_trace(go.Scatter(x=[ours], y=[name], mode="markers", marker=dict(symbol="circle", size=11,
                                     color=VERDICT_COLOURS.get(o.verdict.status)), name="ours", showlegend=False,
                                     hovertext=f"ours {ours:.2f}"), row=1, col=1)
            if paper is not None:
                fig.add_trace(go.Scatter(x=[paper], y=[name], mode="markers", marker=dict(symbol="x", size=11, color="black"),
                                         name="paper", showlegend=False, hovertext=f"paper {paper:.2f}"), row=1, col=1)
        if o.row.ratio and o.row.paper.value:
            m, p = o.measurement, o.row.paper.value
            low = None if math.isnan(m.low) else (m.value - m.low) / p
            high = None if math.isnan(m.high) else (m.high - m.value) / p
            fig.add_trace(go.Scatter(x=[m.value / p], y=[o.row.key], mode="markers",
                                     error_x=None if low is None else dict(type="data", symmetric=False, array=[high], arrayminus=[low]),
                                     marker=dict(size=11, color=VERDICT_COLOURS.get(o.verdict.status)),
                                     showlegend=False, hovertext=o.verdict.reason), row=1, col=2)
    fig.add_vline(x=1.0, line_dash="dot", row=1, col=2)
    fig.update_xaxes(range=[0, 1], title_text="layer / number of layers", row=1, col=1)
    fig.update_xaxes(title_text="ours / paper", row=1, col=2)
    fig.update_layout(height=420, width=1100, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def latest_folder(store_root: Path, quick: bool) -> Path:
    """Where every `bertology reproduce` leaves its table and figure in the runs root, for the app's
    Reproductions page: `reproduce/latest` (the real models) or `reproduce/quick`."""
    return Path(store_root) / "reproduce" / ("quick" if quick else "latest")


def write(outcomes: list[Outcome], out: Path, command: str, quick: bool, png: bool = True) -> list[Path]:
    """The table (Markdown, CSV), the figure (plotly JSON, HTML, and PNG unless `png` is False) and a
    manifest saying what produced them; each file written whole, then renamed."""
    from app.figures import export_timeout, static_images
    from workbench.io import atomic_write_bytes, atomic_write_json, atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    frame = table(outcomes)
    paths = [atomic_write_text(out / "reproduce.md", markdown(frame)),
             atomic_write_text(out / "reproduce.csv", frame.to_csv(index=False))]
    fig = figure(outcomes)
    paths.append(atomic_write_text(out / "reproduce.json", fig.to_json()))
    paths.append(atomic_write_text(out / "reproduce.html", fig.to_html(include_plotlyjs="cdn")))
    images = static_images(fig, ["png"], export_timeout()) if png else None  # the figures' own export (kaleido)
    if images is not None:
        paths.append(atomic_write_bytes(out / "reproduce.png", images["png"]))
    manifest = {"command": command, "quick": quick, "rows": [o.row.key for o in outcomes],
                "verdicts": {o.row.key: o.verdict.status for o in outcomes},
                "run_ids": {o.row.key: list(o.measurement.run_ids) for o in outcomes if o.measurement},
                "seconds": {o.row.key: round(o.seconds, 1) for o in outcomes},
                "png": "written" if images is not None else ("not asked for" if not png else
                                                             "static export timed out: HTML only")}
    from workbench.store.manifest import environment, git_state, package_versions

    manifest.update(environment=environment(), git=git_state(), packages=package_versions())
    paths.append(atomic_write_json(out / "manifest.json", manifest))
    return paths


def format_outcomes(outcomes: list[Outcome]) -> str:
    """The table printed by the CLI (the Markdown table: readable in a terminal and pasteable)."""
    return markdown(table(outcomes))
