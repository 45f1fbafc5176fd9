"""Behaviour check: the same weights and the same rows from two revisions of the workbench.

    .venv/bin/python experiments/diagnostics/behaviour_check.py --reference e783439 [--candidate HEAD] [--out DIR]

Why: a refactor (issue 41: packages, one driver contract, one way to run a model, rows with a
declared schema) must not change what the workbench computes. The weight-pin tests pin one revision's
numbers per CPU kind; this script instead runs BOTH revisions side by side on this machine, so it
needs no recorded pins and also covers the rows a probe, a pruning sweep and a distillation write.

What it does, with no change to the repository's state:

1. Materialises each revision with `git archive REV | tar -x` under `--out/trees/` (`--candidate
   WORKTREE` copies the working tree's tracked and untracked, not ignored, files instead: a check
   before a commit).
2. Runs a fixed job list with each tree as a subprocess (cwd = the tree, PYTHONPATH = the tree
   first, this interpreter, BERTOLOGY_DATA of the environment or /work/shared/data, a fresh runs
   root and corpus cache per tree and job, one thread). The trees are driven only through their
   command line (`python -m app.cli ...`, `app.cli.main`) and their tests' config helpers
   (`tests.training_helpers.tiny_config`), never through library modules whose paths moved.

   weights  every family's pinned tiny pretraining (the configs of
            tests/test_train_loop.py::test_tiny_run_of_every_family_keeps_its_pinned_weights, for
            each dropout-mask kind): sha256 of the training module's state dict, of the
            checkpoint's tensors, of the tokenizer files and of the loss log (without wall-clock
            times), all hashed here by one function for both trees;
            the fine-tuning pin test's three cases through `bertology finetune`
            (tests/training_helpers.tiny_finetune_config's settings: BERT on sentence polarity,
            two seeds; GPT with a frozen body; BERT on UPOS): each seed's best checkpoint's
            tensors, and the fine-tuning rows.
   rows     `bertology probe syntax` on a tiny pretrained BERT, a tiny `bertology prune` sweep (two
            methods x one sparsity x one seed) and a tiny `bertology distill` (one student); every
            row of each store read from the parquet files with pandas and compared value by value.

   The later jobs' inputs are shared: the reference tree's tiny BERT and GPT (and its fine-tuned
   classifier, the distillation's teacher) feed both trees, so a difference in a job is its own.

3. Compares: weights by hash; rows by their key columns (everything except value, n, ci_low,
   ci_high, extra and the run id), then value, n, the interval and every key of `extra`, exactly
   (NaN equals NaN). Absolute paths are rewritten to <TREE>/<WORK> first; the run id (a UTC time
   stamp), wall-clock extra keys and wall-clock metrics are ignored and listed in the output.

Output: one line per job (identical / expected / differs / failed, with the first differences),
`behaviour-check.json` under --out, exit 1 when anything differs or fails, 2 on bad arguments.

The one deliberate row change of issue 41 (only per-seed rows are stored; the old code also wrote
pre-aggregated seed means with seed NaN) is reported as "expected" when it is exactly what differs:
rows missing from the candidate, every one without a seed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKTREE = "WORKTREE"

# tests/test_train_loop.py: PIN_FAMILIES and the mask kinds of the pin test's parametrisation
FAMILIES = ["bert", "roberta", "spanbert", "albert", "electra", "deberta", "gpt", "t5", "bart", "elmo"]
MASKS = ["bernoulli", "pcg16_modules", "pcg16"]
BASE_CASE = "bert/pcg16"  # the tiny BERT the row jobs share (the default dropout masks)

# tests/training_helpers.tiny_finetune_config's settings (its `_cfg` in tests/test_finetune.py), seeds 0 and 1
FINETUNE = {"task": "sentence_polarity", "seeds": [0, 1], "epochs": 1, "lr": 1e-3, "max_train_examples": 64,
            "max_eval_examples": 32, "batch_size": 16, "progress": False, "baselines": False, "device": "cpu",
            "threads": 1}
# tests/test_finetune.py::test_finetune_keeps_its_pinned_weights's cases: (pretrained input, overrides)
FINETUNE_CASES = {"bert-polarity": (BASE_CASE, {}),
                  "gpt-polarity-frozen-body": ("gpt/pcg16", {"freeze_body": True, "epochs": 2, "seeds": [0]}),
                  "bert-upos": (BASE_CASE, {"task": "upos", "max_train_examples": 24, "max_eval_examples": 8,
                                            "seeds": [0]})}
TEACHER_CASE = "bert-polarity"  # seed 0 of it teaches the distillation job
# tests/test_compress_sweep.py's FT and `_config`, cut to two methods x one sparsity x one seed
PRUNE = {"methods": ["oneshot", "random"], "sparsities": [0.2], "progress": False}
# tests/test_distill.py's `_cfg`, one student of one layer (the tiny BERT has two)
DISTILL = {"depths": [1], "inits": ["teacher"], "temperatures": [2.0], "alphas": [0.5], "seeds": [0], "epochs": 1,
           "max_train_examples": 64, "max_eval_examples": 32, "batch_size": 16, "max_len": 32, "lr": 1e-3,
           "progress": False, "latency_repeats": 1, "latency_batch": 4}
SYNTAX_ARGS = ["--max-train-sentences", "200", "--max-eval-sentences", "100", "--n-boot", "100",
               "--structural-epochs", "5", "--threads", "1", "--quiet"]

# ---- what is legitimately run-specific --------------------------------------------------------
KEY_COLUMNS = ["model", "family", "seed", "step", "probe", "task", "split", "stack", "layer", "metric"]
VALUE_COLUMNS = ["value", "n", "ci_low", "ci_high"]
IGNORED_COLUMNS = {"run_id": "a UTC time stamp plus random hex (workbench store's new_run_id)"}
WALL_CLOCK = re.compile(r"(^|_)(elapsed|seconds|secs|wall|latency|time|timestamp|created|date|hostname|host|pid)"
                        r"(_|$)|_s$|_ms$|per_s(ec)?$|_at$", re.IGNORECASE)
# extra keys of a wall-clock metric's row that are computed from the timing (the distillation
# sweep's latency rows: the student's latency over the teacher's, and the teacher's latency)
TIMING_DERIVED_EXTRA = ("fraction_of_teacher", "teacher_value")
LOG_IGNORED_KEYS = ("elapsed",)  # tests/weight_pins.log_hash drops the same key


class Usage(Exception):
    """A bad argument: one line and exit code 2, before any work."""


# ---- hashing: one code for both trees ---------------------------------------------------------

def tensors_sha(named) -> str:
    """sha256 over (name, tensor) pairs in name order: name|dtype|shape then the raw bytes."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda item: item[0]):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def checkpoint_tensors_sha(folder: Path) -> str:
    """The tensors of every weight file of a checkpoint folder (safetensors or torch pickles,
    loaded with weights_only), names prefixed by the file's name."""
    import torch
    from safetensors.torch import load_file

    named = []
    for f in sorted(folder.iterdir()):
        if f.suffix == ".safetensors":
            named += [(f"{f.name}:{k}", v) for k, v in load_file(f).items()]
        elif f.suffix in (".bin", ".pt") and f.is_file():
            obj = torch.load(f, weights_only=True, map_location="cpu")
            if isinstance(obj, dict):
                named += [(f"{f.name}:{k}", v) for k, v in obj.items() if isinstance(v, torch.Tensor)]
    if not named:
        raise FileNotFoundError(f"{folder}: no weight files")
    return tensors_sha(named)


def files_sha(folder: Path, names) -> str:
    h = hashlib.sha256()
    for name in sorted(names):
        p = folder / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def log_sha(path: Path) -> str:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = [{k: v for k, v in r.items() if k not in LOG_IGNORED_KEYS} for r in records]
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer_config.json",
                   "special_tokens_map.json")


def pretraining_hashes(final: Path) -> dict:
    """What the pin test pins (module state, checkpoint weights, log) plus the tokenizer files."""
    import torch

    module = torch.load(final / "trainer_state" / "model.pt", weights_only=True, map_location="cpu")
    return {"module": tensors_sha(module.items()), "checkpoint": checkpoint_tensors_sha(final),
            "tokenizer": files_sha(final, TOKENIZER_FILES), "log": log_sha(final.parent / "log.jsonl")}


def finetune_hashes(folder: Path) -> dict:
    """Each seed's best checkpoint: tensors (classifier head included) and tokenizer files."""
    out = {}
    for best in sorted(folder.glob("seed-*/best")):
        seed = best.parent.name
        out[f"{seed}/checkpoint"] = checkpoint_tensors_sha(best)
        out[f"{seed}/tokenizer"] = files_sha(best, TOKENIZER_FILES)
    if not out:
        raise FileNotFoundError(f"{folder}: no seed-*/best checkpoint")
    return out


def compare_hashes(ref: dict, cand: dict) -> dict:
    """{'status': identical|differs, 'differences': [...]}: every key of either side, hash against hash."""
    diffs = []
    for key in sorted(set(ref) | set(cand)):
        a, b = ref.get(key), cand.get(key)
        if a != b:
            diffs.append({"key": key, "reference": a, "candidate": b})
    return {"status": "differs" if diffs else "identical", "compared": len(set(ref) | set(cand)),
            "differences": diffs}


# ---- rows -------------------------------------------------------------------------------------

def read_store_rows(root: Path):
    """Every row of every run of a results store (`<root>/results/<run_id>/rows.parquet`, the layout
    of both revisions), read with pandas; hidden (temporary) folders skipped."""
    import pandas as pd

    frames = [pd.read_parquet(p) for p in sorted((root / "results").glob("*/rows.parquet"))
              if not p.parent.name.startswith(".")]
    if not frames:
        return pd.DataFrame(columns=["run_id", *KEY_COLUMNS, *VALUE_COLUMNS, "extra"])
    return pd.concat(frames, ignore_index=True)


def _replace_paths(text, replacements):
    if not isinstance(text, str):
        return text
    for old, new in replacements:
        text = text.replace(old, new)
    return text


def _plain(v):
    """A cell as a comparable Python value: pandas NA / NaN -> None-like markers, numpy scalars -> Python."""
    try:
        import pandas as pd

        if v is pd.NA or v is None:
            return None
    except ImportError:  # pragma: no cover
        pass
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return v


def _walk_extra(obj, replacements):
    if isinstance(obj, dict):
        return {k: _walk_extra(v, replacements) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk_extra(v, replacements) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return "NaN"
    return _replace_paths(obj, replacements)


def normalise_rows(df, replacements) -> tuple[list[dict], dict]:
    """Rows as dicts with paths rewritten and run-specific fields dropped; returns (rows, ignored),
    `ignored` naming each column / extra key / metric left out and how many cells it covered."""
    ignored: dict[str, int] = {}
    rows = []
    for rec in df.to_dict("records"):
        row = {}
        for col, v in rec.items():
            if col in IGNORED_COLUMNS:
                ignored[f"column {col}"] = ignored.get(f"column {col}", 0) + 1
                continue
            if col == "extra":
                continue
            row[col] = _replace_paths(_plain(v), replacements)
        extra = rec.get("extra")
        extra = json.loads(extra) if isinstance(extra, str) and extra else {}
        extra = extra if isinstance(extra, dict) else {"<extra>": extra}
        metric = rec.get("metric")
        timed = isinstance(metric, str) and bool(WALL_CLOCK.search(metric))
        kept = {}
        for k, v in extra.items():
            if WALL_CLOCK.search(k) or (timed and k in TIMING_DERIVED_EXTRA):
                ignored[f"extra.{k}"] = ignored.get(f"extra.{k}", 0) + 1
            else:
                kept[k] = _walk_extra(v, replacements)
        row["extra"] = kept
        if timed:
            ignored[f"metric {metric} (value, interval)"] = ignored.get(f"metric {metric} (value, interval)", 0) + 1
            for c in ("value", "ci_low", "ci_high"):
                row[c] = "<wall clock>"
        rows.append(row)
    return rows, ignored


def _key(row) -> tuple:
    return tuple(json.dumps(row.get(c), default=str) for c in KEY_COLUMNS)


def _group(rows) -> dict:
    """Rows by key; rows sharing a key (e.g. one per example) keep a stable order by their content."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(_key(r), []).append(r)
    out = {}
    for k, rs in groups.items():
        rs = sorted(rs, key=lambda r: json.dumps(r, sort_keys=True, default=str))
        for i, r in enumerate(rs):
            out[k + (i,)] = r
    return out


def _row_diff(a: dict, b: dict) -> dict:
    d = {}
    for c in VALUE_COLUMNS:
        if a.get(c) != b.get(c):
            d[c] = {"reference": a.get(c), "candidate": b.get(c)}
    ea, eb = a.get("extra", {}), b.get("extra", {})
    for k in sorted(set(ea) | set(eb)):
        if ea.get(k, "<absent>") != eb.get(k, "<absent>"):
            d[f"extra.{k}"] = {"reference": ea.get(k, "<absent>"), "candidate": eb.get(k, "<absent>")}
    return d


def _describe(row: dict) -> dict:
    return {c: row.get(c) for c in KEY_COLUMNS if row.get(c) is not None}


def _no_seed(row: dict) -> bool:
    return row.get("seed") is None or row.get("seed") == "NaN"


# Seed statistics with no per-seed row of the same metric: the prune sweep's `wins` (1 when a
# method's mean over seeds reaches the full model's; now computed where it is shown,
# `workbench.drivers.prune_rows.over_seeds`, and checked against the old stored rows in
# tests/test_aggregate_per_unit.py). Such a stored row is expected to be gone if it is 0 or 1.
ZERO_ONE_STATISTICS = ("wins",)


def is_seed_aggregate(row: dict, rows: list[dict]) -> bool:
    """Whether `row` is a pre-aggregated seed statistic of `rows`: no seed, `extra.over == "seeds"`,
    per-seed rows with the same key otherwise (the step aside: fine-tuning rows carry each seed's
    step count, the mean none), and its value within their range (a mean is)."""
    if not _no_seed(row) or row.get("extra", {}).get("over") != "seeds":
        return False
    same = [c for c in KEY_COLUMNS if c not in ("seed", "step")]  # a per-seed row may carry its own step count
    values = [r.get("value") for r in rows
              if not _no_seed(r) and all(r.get(c) == row.get(c) for c in same)]
    values = [v for v in values if isinstance(v, (int, float))]
    v = row.get("value")
    if not values and row.get("metric") in ZERO_ONE_STATISTICS:  # no per-seed row of its own: 0 or 1
        return v in (0, 1)
    if not values or not isinstance(v, (int, float)):
        return False
    tol = 1e-12 * max(1.0, abs(v))
    return min(values) - tol <= v <= max(values) + tol


def compare_rows(ref_rows: list[dict], cand_rows: list[dict], show: int = 5) -> dict:
    """Match rows by key and compare their values exactly. Status: identical; expected (exactly
    the pre-aggregated seed statistics gone from the candidate, each `is_seed_aggregate` of the
    reference's per-seed rows: issue 41 stores per-seed rows only); differs otherwise. The first
    `show` differences of each kind are listed."""
    a, b = _group(ref_rows), _group(cand_rows)
    only_ref = [k for k in a if k not in b]
    only_cand = [k for k in b if k not in a]
    changed = [(k, _row_diff(a[k], b[k])) for k in a if k in b]
    changed = [(k, d) for k, d in changed if d]
    columns = sorted({c for _, d in changed for c in d})
    result = {"rows_reference": len(ref_rows), "rows_candidate": len(cand_rows), "matched": len(a) - len(only_ref),
              "only_in_reference": len(only_ref), "only_in_candidate": len(only_cand), "changed_rows": len(changed),
              "changed_columns": columns,
              "first_only_in_reference": [_describe(a[k]) for k in only_ref[:show]],
              "first_only_in_candidate": [_describe(b[k]) for k in only_cand[:show]],
              "first_changed": [{"row": _describe(a[k]), "differences": d} for k, d in changed[:show]]}
    if not (only_ref or only_cand or changed):
        result["status"] = "identical"
    elif only_ref and not only_cand and not changed and all(is_seed_aggregate(a[k], ref_rows) for k in only_ref):
        result["status"] = "expected"
        metrics = sorted({str(a[k].get("metric")) for k in only_ref})
        result["note"] = (f"expected: {len(only_ref)} pre-aggregated seed statistics (no seed, extra.over = seeds, "
                          f"within their per-seed rows' range; metrics {', '.join(metrics)}) are no longer stored "
                          f"(issue 41: per-seed rows only); every other row is identical")
    else:
        result["status"] = "differs"
    return result


# ---- the trees and the jobs ------------------------------------------------------------------

RUNNER = r'''
"""Runs inside one source tree (cwd and PYTHONPATH = the tree): tiny pretraining through the
tree's own tests.training_helpers.tiny_config and app.cli.main, every case in this one process
(as the pin test runs them)."""
import contextlib, io, json, sys
from pathlib import Path

import torch
import yaml

torch.set_num_threads(1)
spec = json.loads(Path(sys.argv[1]).read_text())
from tests.training_helpers import tiny_config
from app.cli import main

out = {}
for case in spec["cases"]:
    cfg = tiny_config(case["family"], 3, case["output_dir"],
                      corpus={"sources": ["inaugural"], "max_documents": 12, "heldout_fraction": 0.2, "seed": 0},
                      tokenizer={"vocab_size": 400}, max_len=32, batch_size=4, grad_accum=2,
                      **{"eval.batches": 1, "checkpoints.log_spaced": False, "dropout_masks": case["masks"]})
    path = Path(case["output_dir"] + ".yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=True))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["train", str(path)])
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    out[case["case"]] = {"rc": rc, "final": lines[-1] if lines else None}
    print(case["case"], rc, out[case["case"]]["final"], flush=True)
Path(spec["result"]).write_text(json.dumps(out))
'''


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def resolve(rev: str) -> str:
    if rev == WORKTREE:
        return WORKTREE
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise Usage(f"{rev!r} is not a commit of {REPO}")
    return r.stdout.strip()


def materialise(rev: str, dest: Path) -> None:
    """The tree of `rev` under `dest` (git archive | tar -x), or the working tree's files for WORKTREE."""
    dest.mkdir(parents=True)
    if rev == WORKTREE:
        files = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
        for f in filter(None, files):
            src = REPO / f
            if src.is_file():
                (dest / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / f)
        return
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", rev], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {rev} failed")


class Side:
    """One revision's tree and its working folders."""

    def __init__(self, name: str, rev: str, out: Path):
        self.name, self.rev = name, rev
        self.tree = out / "trees" / name
        self.work = out / "work" / name
        self.logs = out / "logs" / name

    def env(self, job: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTOLOGY_")}
        rest = os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""
        env.update(PYTHONPATH=str(self.tree) + rest,
                   BERTOLOGY_DATA=os.environ.get("BERTOLOGY_DATA", "/work/shared/data"),
                   BERTOLOGY_RUNS=str(self.work / job / "runs"), BERTOLOGY_CACHE=str(self.work / job / "cache"),
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0",
                   CUDA_VISIBLE_DEVICES="")
        return env

    def run(self, job: str, argv: list[str]) -> float:
        """`python argv...` in the tree; raises JobFailed with the log's tail on a non-zero exit."""
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.work / job).mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{job}.log"
        t0 = time.perf_counter()
        with log.open("w") as fh:
            rc = subprocess.run([sys.executable, *argv], cwd=self.tree, env=self.env(job), stdout=fh,
                                stderr=subprocess.STDOUT).returncode
        if rc != 0:
            tail = log.read_text().splitlines()[-15:]
            raise JobFailed(f"{self.name}: {' '.join(argv[:4])} ... exited {rc} (log {log}):\n  " + "\n  ".join(tail))
        return time.perf_counter() - t0

    def cli(self, job: str, *args: str) -> float:
        return self.run(job, ["-m", "app.cli", *args])


class JobFailed(Exception):
    pass


def write_yaml(path: Path, data: dict) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=True))
    return path


def run_pretraining(side: Side, out: Path, families, masks) -> tuple[dict, float]:
    work = side.work / "pretrain"
    spec = {"cases": [{"case": f"{f}/{m}", "family": f, "masks": m, "output_dir": str(work / "train" / f"{f}-{m}")}
                      for f in families for m in masks], "result": str(work / "finals.json")}
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(json.dumps(spec))
    runner = out / "runner_pretrain.py"
    seconds = side.run("pretrain", [str(runner), str(work / "spec.json")])
    finals = json.loads((work / "finals.json").read_text())
    hashes, paths = {}, {}
    for case, r in finals.items():
        final = Path(r["final"])
        paths[case] = final
        for what, h in pretraining_hashes(final).items():
            hashes[f"{case}/{what}"] = h
    return {"hashes": hashes, "finals": {k: str(v) for k, v in paths.items()}}, seconds


def run_finetune(side: Side, finals: dict) -> tuple[dict, Path, float]:
    """The fine-tuning pin test's three cases (those whose pretrained input exists) into one store;
    returns (hashes, the BERT polarity run's folder: the distillation's teacher, seconds)."""
    hashes, seconds = {}, 0.0
    for case, (pretrained, overrides) in FINETUNE_CASES.items():
        if pretrained not in finals:
            continue
        folder = side.work / "finetune" / "runs" / "finetune" / case
        cfg = write_yaml(side.work / "finetune" / f"{case}.yaml",
                         {**FINETUNE, **overrides, "checkpoint": finals[pretrained], "output_dir": str(folder)})
        seconds += side.cli("finetune", "finetune", str(cfg))
        hashes.update({f"{case}/{k}": v for k, v in finetune_hashes(folder).items()})
    return hashes, side.work / "finetune" / "runs" / "finetune" / TEACHER_CASE, seconds


def run_syntax(side: Side, base: Path) -> float:
    return side.cli("syntax", "probe", "syntax", "--checkpoint", str(base), *SYNTAX_ARGS)


def run_prune(side: Side, base: Path) -> float:
    ft = {**FINETUNE, "seeds": [0], "checkpoint": str(base)}
    cfg = write_yaml(side.work / "prune" / "prune.yaml",
                     {**PRUNE, "finetune": ft, "output_dir": str(side.work / "prune" / "runs" / "prune" / "tiny")})
    return side.cli("prune", "prune", str(cfg))


def run_distill(side: Side, teacher: Path) -> float:
    folder = side.work / "distill" / "runs" / "distill" / "tiny"
    cfg = write_yaml(side.work / "distill" / "distill.yaml",
                     {**DISTILL, "teacher": str(teacher), "output_dir": str(folder)})
    return side.cli("distill", "distill", str(cfg), "--threads", "1")


def store_rows(side: Side, job: str, out: Path):
    """A job's rows with its own folder written <JOB>, the tree <TREE> and the rest of --out <OUT>
    (the shared inputs under the reference's folder then read the same on both sides)."""
    df = read_store_rows(side.work / job / "runs")
    replacements = [(str(side.work / job), "<JOB>"), (str(side.tree), "<TREE>"), (str(out), "<OUT>")]
    return normalise_rows(df, replacements)


def merge_counts(a: dict, b: dict) -> dict:
    """Ignored cells of both sides, summed."""
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted(set(a) | set(b))}


def summarise(name: str, res: dict) -> str:
    status = res["status"]
    if status == "failed":
        return f"{name:<10} failed: {res['error']}"
    if "compared" in res:
        line = f"{name:<10} {status:<9} {res['compared']} hashes, {len(res['differences'])} differ"
        for d in res["differences"][:3]:
            line += f"\n{'':<11}{d['key']}: reference {str(d['reference'])[:12]}, candidate {str(d['candidate'])[:12]}"
        if "rows" in res:
            line += "\n" + summarise(f"{name} rows", res["rows"]).replace("\n", "\n" + " " * 11)
        return line
    line = (f"{name:<10} {status:<9} rows {res['rows_reference']} / {res['rows_candidate']}, "
            f"matched {res['matched']}, changed {res['changed_rows']}, only reference {res['only_in_reference']}, "
            f"only candidate {res['only_in_candidate']}")
    if res.get("note"):
        line += f"\n{'':<11}{res['note']}"
    if status == "differs":
        for c in res["first_changed"][:3]:
            first = next(iter(c["differences"].items()))
            line += f"\n{'':<11}{c['row']}: {first[0]} {first[1]['reference']!r} -> {first[1]['candidate']!r}"
        for r in res["first_only_in_reference"][:2]:
            line += f"\n{'':<11}only reference: {r}"
        for r in res["first_only_in_candidate"][:2]:
            line += f"\n{'':<11}only candidate: {r}"
    return line


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True, help="the revision before the change (a commit)")
    p.add_argument("--candidate", default="HEAD",
                   help=f"the revision after it (default HEAD; {WORKTREE}: the working tree's files)")
    p.add_argument("--out", default=None, help="folder for the trees, runs, logs and behaviour-check.json "
                   "(default /tmp/behaviour-check-<UTC time>; must not exist or be empty)")
    p.add_argument("--families", default=",".join(FAMILIES), help="pretraining families (default: every pinned one)")
    p.add_argument("--masks", default=",".join(MASKS),
                   help="dropout-mask kinds of the pretraining runs (default: all three)")
    p.add_argument("--jobs", default="weights,finetune,syntax,prune,distill",
                   help="which jobs (default all: weights,finetune,syntax,prune,distill)")
    args = p.parse_args(argv)
    for name, value, allowed in (("--families", args.families, FAMILIES), ("--masks", args.masks, MASKS),
                                 ("--jobs", args.jobs, ["weights", "finetune", "syntax", "prune", "distill"])):
        items = [x.strip() for x in value.split(",") if x.strip()]
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            raise Usage(f"{name}: {', '.join(bad) or 'empty'} not among {', '.join(allowed)}")
        setattr(args, name.lstrip("-"), items)
    if BASE_CASE.split("/")[0] not in args.families or BASE_CASE.split("/")[1] not in args.masks:
        needs = {"finetune", "syntax", "prune", "distill"} & set(args.jobs)
        if needs:
            raise Usage(f"--families/--masks: the jobs {', '.join(sorted(needs))} need the tiny BERT {BASE_CASE}")
    args.out = Path(args.out or f"/tmp/behaviour-check-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}").resolve()
    if args.out.exists() and any(args.out.iterdir()):
        raise Usage(f"--out {args.out}: exists and is not empty")
    args.reference_sha, args.candidate_sha = resolve(args.reference), resolve(args.candidate)
    return args


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except Usage as err:
        print(f"behaviour_check: {err}", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "runner_pretrain.py").write_text(RUNNER)
    ref = Side("reference", args.reference_sha, out)
    cand = Side("candidate", args.candidate_sha, out)
    for side in (ref, cand):
        materialise(side.rev, side.tree)
    report = {"reference": {"rev": args.reference, "commit": args.reference_sha},
              "candidate": {"rev": args.candidate, "commit": args.candidate_sha},
              "python": sys.executable, "data": os.environ.get("BERTOLOGY_DATA", "/work/shared/data"),
              "started": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}",
              "ignored": {"columns": IGNORED_COLUMNS, "extra keys and metrics matching": WALL_CLOCK.pattern,
                          "extra keys of a wall-clock metric's row": list(TIMING_DERIVED_EXTRA),
                          "paths": "the job's folder, the tree and --out rewritten to <JOB>, <TREE>, <OUT>",
                          "log keys": list(LOG_IGNORED_KEYS)},
              "jobs": {}, "seconds": {}}
    jobs = report["jobs"]
    t_start = time.perf_counter()

    def record(name, fn):
        try:
            jobs[name] = fn()
        except (JobFailed, FileNotFoundError, KeyError, ValueError) as err:
            jobs[name] = {"status": "failed", "error": str(err)}
        print(summarise(name, jobs[name]), flush=True)

    pre = {}

    def weights():
        for side in (ref, cand):
            pre[side.name], seconds = run_pretraining(side, out, args.families, args.masks)
            report["seconds"][f"weights/{side.name}"] = seconds
        res = compare_hashes(pre["reference"]["hashes"], pre["candidate"]["hashes"])
        res["cases"] = sorted(pre["reference"]["finals"])
        return res

    if "weights" in args.jobs:
        record("weights", weights)
    else:  # the other jobs need the reference's tiny BERT (and GPT) only
        with_gpt = ["bert", "gpt"] if "gpt" in args.families else ["bert"]
        pre["reference"], _ = run_pretraining(ref, out, with_gpt, ["pcg16"])
    finals = pre.get("reference", {}).get("finals", {})
    base = Path(finals[BASE_CASE]) if BASE_CASE in finals else None
    teacher = None
    if base is not None and set(args.jobs) & {"finetune", "distill"}:
        def finetune():
            nonlocal teacher
            hashes = {}
            for side in (ref, cand):
                hashes[side.name], folder, report["seconds"][f"finetune/{side.name}"] = run_finetune(side, finals)
                if side is ref:
                    teacher = folder / "seed-0" / "best"
            res = compare_hashes(hashes["reference"], hashes["candidate"])
            rows = {s.name: store_rows(s, "finetune", out) for s in (ref, cand)}
            res["rows"] = compare_rows(rows["reference"][0], rows["candidate"][0])
            res["rows"]["ignored"] = merge_counts(rows["reference"][1], rows["candidate"][1])
            if res["status"] == "identical" and res["rows"]["status"] != "identical":
                res["status"] = res["rows"]["status"]
                if res["rows"].get("note"):
                    res["note"] = res["rows"]["note"]
            return res

        record("finetune", finetune)

    def row_job(name, fn, inp):
        def go():
            for side in (ref, cand):
                report["seconds"][f"{name}/{side.name}"] = fn(side, inp)
            rows = {s.name: store_rows(s, name, out) for s in (ref, cand)}
            res = compare_rows(rows["reference"][0], rows["candidate"][0])
            res["ignored"] = merge_counts(rows["reference"][1], rows["candidate"][1])
            return res
        return go

    if base is not None:
        for name, fn in (("syntax", run_syntax), ("prune", run_prune)):
            if name in args.jobs:
                record(name, row_job(name, fn, base))
    if "distill" in args.jobs:
        if teacher is not None:
            record("distill", row_job("distill", run_distill, teacher))
        else:
            jobs["distill"] = {"status": "failed", "error": "no teacher (the fine-tuning job failed)"}
    for name in args.jobs:
        if name not in jobs:
            jobs[name] = {"status": "failed", "error": "not run: the reference's tiny BERT (its input) is missing"}
            print(summarise(name, jobs[name]), flush=True)
    report["seconds"]["total"] = round(time.perf_counter() - t_start, 1)
    report["seconds"] = {k: round(v, 1) for k, v in report["seconds"].items()}
    from_ok = {"identical", "expected"}
    report["verdict"] = "same behaviour" if all(j["status"] in from_ok for j in jobs.values()) else "differs"
    tmp = out / ".behaviour-check.json.tmp"  # written whole, then renamed: never half a report
    tmp.write_text(json.dumps(report, indent=2, default=str))
    os.replace(tmp, out / "behaviour-check.json")
    print(f"\n{report['verdict']}: reference {args.reference} ({args.reference_sha[:9]}), candidate {args.candidate} "
          f"({args.candidate_sha[:9]}); {report['seconds']['total']:.0f} s; report {out / 'behaviour-check.json'}")
    return 0 if report["verdict"] == "same behaviour" else 1


if __name__ == "__main__":
    sys.exit(main())
