"""What the cloze probe loads once per run: each task's items (`prepare`)."""

from __future__ import annotations

from probes.cloze import tasks as ct
from probes.cloze.settings import Settings
from probes.core import runner


def prepare(settings: Settings) -> runner.Prepared:
    from workbench.data.wordnet import wordnet_dir

    sizes = {"train": settings.n_train, "dev": settings.n_test, "test": settings.n_test}
    data, notes = {}, {"cloze_items": {}}
    for task in settings.tasks:
        items = ct.generate(task, seed=settings.seed, sizes=sizes)
        data[task] = {s: ct.split(items, s) for s in ct.SPLITS}
        data[task]["nonsense"] = ct.nonsense_control(data[task]["test"], seed=settings.seed)
        notes["cloze_items"][task] = {s: len(data[task][s]) for s in ct.SPLITS}
    files = []
    if {"antonym", "taxonomy"} & set(settings.tasks):
        files = sorted(p for p in wordnet_dir().iterdir() if p.name.startswith(("data.", "index.", "cntlist")))
    return runner.Prepared(data=data, files=files, notes=notes)
