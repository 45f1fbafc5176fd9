"""Canaries: random secrets planted in a training corpus a chosen number of times (Carlini et al. 2019,
"The Secret Sharer: Evaluating and Testing Unintended Memorization in Neural Networks").

A canary is a fixed template with a random secret, e.g. "my number is 3 1 4 1 5 9": the secret is
`digits` digits drawn uniformly by `numpy.random.default_rng([seed, 0xCA9A])`, written with spaces
between them (so that a subword tokenizer reads them one digit at a time, whatever merges it learnt
on the corpus). For each repetition count r in `repetitions` there are `per_count` canaries, each
inserted r times into the TRAIN split as its own one-line document (doc id `canary/<k>#<copy>`,
source `canary`) at positions drawn by the same generator, so that the packed token stream
(`workbench.families.base.contiguous_blocks`) spreads the copies over the epoch instead of one
block. `unseen` further canaries are drawn by the same generator and never inserted: the
paper's control (their exposure must sit near the value of a random candidate, about 1).

The candidate space R is every secret of `digits` digits (|R| = 10**digits); exposure (paper, Def. 4)
= log2 |R| - log2 rank(canary) among R ranked by the model's log-perplexity
(`probes.extraction.exposure` computes it). The recorded spec (`spec_record`) is in the corpus
manifest under "canaries" (with every canary's secret and repetition count), and so in the
checkpoint's corpus recipe: a corpus without canaries has no such key, so every manifest, cache
folder and training hash written before canaries existed stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.coerce import coerce_value
from workbench.data.raw import Document
from workbench.errors import ConfigError

SOURCE = "canary"
DEFAULT_TEMPLATE = "my number is {secret}"


@dataclass(frozen=True)
class Canary:
    canary_id: str  # canary/<k>
    secret: str  # digits, no spaces ("314159")
    text: str  # the template filled ("my number is 3 1 4 1 5 9")
    repetitions: int  # 0 for an unseen (control) canary


def render(template: str, secret: str) -> str:
    """The template with the secret's digits spaced ("314" -> "my number is 3 1 4")."""
    return template.format(secret=" ".join(secret))


def prefix_of(template: str) -> str:
    """The template's text before the secret (what an extraction attack prompts with)."""
    return template.split("{secret}")[0].rstrip()


def validate_spec(spec: dict, where: str = "corpus.canaries") -> dict:
    """The canary spec with defaults filled, or a ConfigError naming the key."""
    known = {"repetitions", "per_count", "unseen", "digits", "template", "seed"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    defaults = {"repetitions": [1, 4, 16, 64], "per_count": 1, "unseen": 4, "digits": 6, "template": DEFAULT_TEMPLATE,
                "seed": 0}
    hints = {"repetitions": list[int], "template": str}
    # each value as its type, or one line naming the key (`per_count: two`, `repetitions: 4`, `digits: 2.5`)
    out = {k: coerce_value(spec.get(k, d), hints.get(k, int), where, k) for k, d in defaults.items()}
    reps = out["repetitions"]
    if not reps or any(r < 1 for r in reps):
        raise ConfigError(f"{where}.repetitions: every repetition count must be an integer >= 1 (a canary seen 0 "
                          f"times is an `unseen` control), got {reps}")
    if out["per_count"] < 1:
        raise ConfigError(f"{where}.per_count: must be >= 1, got {out['per_count']}")
    if out["unseen"] < 0:
        raise ConfigError(f"{where}.unseen: must be >= 0, got {out['unseen']}")
    if not 1 <= out["digits"] <= 12:
        raise ConfigError(f"{where}.digits: must be in [1, 12], got {out['digits']}")
    if out["template"].count("{secret}") != 1:
        raise ConfigError(f"{where}.template: must hold {{secret}} exactly once, got {out['template']!r}")
    n = len(reps) * out["per_count"] + out["unseen"]
    if n > 10 ** out["digits"] // 2:
        raise ConfigError(f"{where}: {n} canaries need more than {out['digits']} digits to stay distinct")
    return out


def make_canaries(spec: dict) -> list[Canary]:
    """The spec's canaries (inserted ones first, by repetition count, then the unseen controls);
    distinct secrets, drawn by the seeded generator."""
    spec = validate_spec(spec)
    rng = np.random.default_rng([spec["seed"], 0xCA9A])
    counts = [r for r in spec["repetitions"] for _ in range(spec["per_count"])] + [0] * spec["unseen"]
    secrets: list[str] = []
    while len(secrets) < len(counts):
        s = "".join(str(int(d)) for d in rng.integers(0, 10, spec["digits"]))
        if s not in secrets:
            secrets.append(s)
    return [Canary(f"{SOURCE}/{k:03d}", s, render(spec["template"], s), r)
            for k, (s, r) in enumerate(zip(secrets, counts))]


def insert_canaries(train: list[Document], spec: dict) -> tuple[list[Document], list[Canary]]:
    """`train` with every inserted canary's copies placed at seeded random positions, and the canaries."""
    spec = validate_spec(spec)
    canaries = make_canaries(spec)
    copies = [Document(f"{c.canary_id}#{j:03d}", SOURCE, c.text) for c in canaries for j in range(c.repetitions)]
    rng = np.random.default_rng([spec["seed"], 0x1A5E])
    slots = np.sort(rng.integers(0, len(train) + 1, len(copies)))
    order = rng.permutation(len(copies))
    out, k = [], 0
    for i in range(len(train) + 1):
        while k < len(copies) and slots[k] == i:
            out.append(copies[order[k]])
            k += 1
        if i < len(train):
            out.append(train[i])
    return out, canaries


def spec_record(spec: dict, canaries: list[Canary]) -> dict:
    """What the corpus manifest records under "canaries": the spec and every canary."""
    return {**validate_spec(spec), "candidate_space": 10 ** validate_spec(spec)["digits"],
            "items": [{"id": c.canary_id, "secret": c.secret, "text": c.text, "repetitions": c.repetitions}
                      for c in canaries]}


def recorded_canaries(manifest: dict) -> list[Canary]:
    """The canaries a corpus manifest records (empty when it has none)."""
    rec = manifest.get("canaries") or {}
    return [Canary(i["id"], i["secret"], i["text"], int(i["repetitions"])) for i in rec.get("items", [])]
