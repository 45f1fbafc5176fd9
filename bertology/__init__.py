"""The BERTology workbench from Python, for notebooks (load, probe, compare and plot; train and the drivers).

Probe a model layer by layer and plot the curve, in five lines:

    import bertology
    model = bertology.load("sentence-transformers/all-MiniLM-L6-v2")   # a folder, training folder or Hub name
    result = bertology.probe(model, "syntax", tasks=["upos"])          # one run in the results store
    result.summary()                                                    # the CLI's table, as a DataFrame
    result.plot()                                                       # the per-layer curve (plotly)

The API is a thin layer over what the command line runs, with no second implementation: `load` is
the workbench's model handle (`workbench.running.models.ModelHandle`), `probe` the one probe runner
(`probes.core.runner.run_probe`: same rows, run ids, resume and settings validation as `bertology
probe`; a finished run is reused), `train`/`finetune`/`prune`/`distill`/`peft` the drivers, `reproduce`
the literature's findings beside ours (`bertology reproduce`), `runs`
/ `rows` the results store, `figure` the shipped figures (`app.figures`). Errors are the CLI's
one-line `workbench.errors.ConfigError` / `CheckpointError`. Results live under the runs root
(`$BERTOLOGY_RUNS`, default ./runs), data under the data root (`$BERTOLOGY_DATA`). Guide:
docs/python.md.

Functions: load, probe, runs, rows, figure, train, finetune, prune, distill, peft, reproduce.
Classes: Model (what `load` returns), ProbeResult (what `probe` returns).
"""

from __future__ import annotations

from bertology.drivers import distill, finetune, peft, prune, reproduce, train
from bertology.models import Model, load
from bertology.probing import ProbeResult, probe
from bertology.store import figure, rows, runs
from workbench import __version__
from workbench.errors import CheckpointError, ConfigError

__all__ = ["load", "probe", "runs", "rows", "figure", "train", "finetune", "prune", "distill", "peft", "reproduce",
           "Model", "ProbeResult", "ConfigError", "CheckpointError", "__version__"]
