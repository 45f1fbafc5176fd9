"""`bertology.probe` and its `ProbeResult`, one probe run in the results store as the CLI makes it.

`probe(...)` is `bertology probe NAME` from Python: the same `probes.core.runner.run_probe` (the
same rows, manifest and run id in the same store; an interrupted run resumes from its finished
units), the same `Settings` validation (a bad value is the CLI's one-line `ConfigError`, raised
before any data or model is loaded). One addition, what a notebook re-executed top to bottom
needs: a finished run is found again instead of recomputed. The run is named `<name>:<key>`, its
key `probes.core.runner.run_key` of the probe, the checkpoints (folders, or the tensors' hash of a
model in memory) and the settings that decide the rows (`Settings.resume_key`: not threads, batch
size or progress), the way `bertology run` keys an experiment's runs.
"""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from bertology.models import Model


class ProbeResult:
    """A probe run in the results store: `.run_id`, `.rows` (the tidy rows, declared schema),
    `.summary()` (the CLI's table as a DataFrame), `.text()` (the table as the CLI prints it),
    `.plot(kind=...)` (a shipped plotly figure), `.manifest` (what produced it), `.reused`
    (True when the run was already in the store). In Jupyter it shows as an HTML table.
    """

    def __init__(self, run_id: str, probe: str, store, reused: bool = False):
        self.run_id, self.probe, self.store, self.reused = run_id, probe, store, reused
        self._rows: pd.DataFrame | None = None

    @property
    def spec(self):
        from probes import get_probe

        return get_probe(self.probe)

    @property
    def rows(self) -> pd.DataFrame:
        """The run's rows as stored (`workbench.store.results.RESULT_COLUMNS`, their dtypes)."""
        if self._rows is None:
            self._rows = self.store.read(self.run_id)
        return self._rows

    @property
    def manifest(self) -> dict[str, Any]:
        return self.store.manifest(self.run_id)

    def summary(self) -> pd.DataFrame:
        """The numbers of the table the CLI prints, one row per (model, stack, layer): the probe's
        own (`ProbeSpec.summary_frame`, e.g. syntax's UPOS accuracy with its CI, selectivity, UUAS
        and baselines), else the generic layers x "task metric" table (`runner.layer_frame`)."""
        from probes.core.runner import layer_frame

        return (self.spec.summary_frame or layer_frame)(self.rows)

    def text(self) -> str:
        """The summary exactly as `bertology probe` prints it."""
        from probes.core.runner import format_layer_table

        return (self.spec.summary or format_layer_table)(self.rows)

    def plot(self, kind: str = "layer_curves", title: str | None = None, **options: Any):
        """A plotly figure of this run's rows by one of the shipped plot kinds (`app.figures.PLOTS`:
        layer_curves, depth_summary, depth_ci, training_heatmap, roc_curves, auc_over_steps, and the
        kinds pages add); `options` are the figure spec's (e.g. `baselines=["control"]`, for
        training_heatmap `task="upos", metric="accuracy"`). Shown inline in Jupyter.

        >>> result.plot()                                         # doctest: +SKIP
        >>> result.plot("training_heatmap", task="upos")          # doctest: +SKIP
        """
        from app.figures import all_plots
        from workbench.errors import ConfigError

        plots = all_plots()
        if kind not in plots:
            raise ConfigError(f"plot kind must be one of {sorted(plots)}, got {kind!r}")
        return plots[kind](self.rows, title or f"{self.probe} ({self.run_id})", options).figure

    def __repr__(self) -> str:
        state = "reused from the store" if self.reused else "new"
        return f"{self.probe} run {self.run_id} ({len(self.rows)} rows, {state})\n{self.text()}"

    def _repr_html_(self) -> str:
        state = "reused from the store" if self.reused else "new"
        head = (f"<p><b>{html.escape(self.probe)}</b> run <code>{html.escape(self.run_id)}</code>: "
                f"{len(self.rows)} rows ({state})</p>")
        return head + self.summary().to_html(index=False, float_format=lambda x: f"{x:.3f}", na_rep="-")


def checkpoint_items(models: Any) -> list[Any]:
    """What `run_probe` takes for what the caller gave: a `Model`'s checkpoints (its handle attached,
    nothing loaded twice) or its in-memory handle; paths and Hub names as they are."""
    items = models if isinstance(models, (list, tuple)) else [models]
    out: list[Any] = []
    for item in items:
        if isinstance(item, Model):
            out.extend(item.checkpoints if item.checkpoints else [item.handle])
        else:
            out.append(item)
    return out


def _identity(checkpoint) -> str:
    """A checkpoint's part of the run key: its folder, or the tensors' hash of a model in memory."""
    path = getattr(checkpoint, "path", None)
    if path is not None:
        return str(Path(path).resolve())
    handle = getattr(checkpoint, "handle", None) or checkpoint
    return f"sha256:{handle.checkpoint_hash}"


def probe(model: Any, probe: str = "syntax", tasks: Sequence[str] | str | None = None, *, reuse: bool = True,
          **settings: Any) -> ProbeResult:
    """Probe a model (a `bertology.load` model, a folder, a training folder, a Hub name, or a list
    of them) layer by layer, as `bertology probe NAME --checkpoint ...` does, into the results store
    (`$BERTOLOGY_RUNS`, default ./runs). `settings` are the probe's options with underscores
    (`bertology probe syntax --help`: `max_train_sentences=2000`, `pooling="mean"`, `seed=1`, ...);
    a bad one raises the CLI's one-line `ConfigError` before anything loads. With `reuse` (default)
    a run already made with the same checkpoints and settings is returned instead of recomputed.

    >>> import bertology                                                              # doctest: +SKIP
    >>> model = bertology.load("sentence-transformers/all-MiniLM-L6-v2")             # doctest: +SKIP
    >>> result = bertology.probe(model, "syntax", tasks=["upos"])                     # doctest: +SKIP
    >>> result.summary()[["layer", "UPOS acc", "rand-init UPOS"]]                     # doctest: +SKIP
    >>> result.plot()                                                                 # doctest: +SKIP
    """
    from probes import get_probe
    from probes.core.runner import resolve_settings, run_key, run_probe
    from workbench.store.checkpoints import expand_checkpoints
    from workbench.store.results import ResultsStore

    spec = get_probe(probe)
    values = dict(settings)
    if tasks is not None:
        values["tasks"] = [tasks] if isinstance(tasks, str) else list(tasks)
    resolved = resolve_settings(spec, values, f"probe {spec.name}")  # the CLI's validation, before any work
    checkpoints = expand_checkpoints(checkpoint_items(model))
    key = run_key(spec.name, [_identity(c) for c in checkpoints], resolved.resume_key())
    name = f"{resolved.name or spec.name}:{key}"
    store = ResultsStore()
    if reuse:
        found = store.runs(name=name)
        if not found.empty:
            return ProbeResult(str(found["run_id"].iloc[-1]), spec.name, store, reused=True)
    run_id, _ = run_probe(spec, checkpoints, dataclasses.replace(resolved, name=name), store=store)
    return ProbeResult(run_id, spec.name, store)
