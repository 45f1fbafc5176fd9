"""Issue 42 measurements behind docs/evidence/real-probe-fit.md: the UPOS probe's fit options and
the half-precision cache on a real model's features.

  python experiments/diagnostics/real_probe_fit.py features MODEL TAG OUT_DIR
      extracts the benchmark's split (benchmarks/bench_real_probe.py: 1,000 EWT train sentences, 10%
      of them the stop set, 500 dev sentences, seed 0) and saves the UPOS fit / stop / eval feature
      arrays ([L, words, H] float32) and labels as OUT_DIR/TAG-*.npy|npz
  python experiments/diagnostics/real_probe_fit.py fits TAG OUT_DIR FIT[,FIT...]
      FIT = default (today's: Adam then the L-BFGS polish) | lbfgs (the default before issue 42:
      L-BFGS, early stopping) | converged (L-BFGS, no early stopping, to its tolerance or 1,000
      iterations; converged-N: N iterations at most) |
      adam-EPOCHS-LR-BATCH[-cK][-loss][-acc][-noes][-pN] (K dev checks per epoch, early stopping on
      the dev loss / accuracy, no early stopping, N polish iterations: without -pN no polish, so
      adam-6-0.005-128-loss is the default before issue 49's polish); prints seconds and accuracy,
      saves the per-layer eval accuracy as OUT_DIR/TAG-acc-FIT.npy, the per-word correctness as
      OUT_DIR/TAG-correct-FIT.npy and the layers fitted as OUT_DIR/TAG-layers-FIT.npy; prints each
      fit's per-layer difference from the saved converged fits (every run of `converged*`, matched
      by layer; converged-N replaces converged) with its paired standard error
  python experiments/diagnostics/real_probe_fit.py memory TAG OUT_DIR [FIT [FITTING_PY]]
      peak memory of one fit (default: `default`) of the saved fit features read lazily from their
      memmap (as the syntax probe's FeatureView reads the activation cache): VmHWM, RssAnon, RssFile
      beside the features' size; FITTING_PY: another probes/core/fitting.py to measure instead (the
      one before issue 42: `git show 688f2cb:probes/core/fitting.py > /tmp/old_fitting.py`)

  python experiments/diagnostics/real_probe_fit.py labels TAG OUT_DIR
      (issue 49) the other label sets of the same fit / stop / eval words, from the split alone (no
      model): XPOS (OUT_DIR/TAG-y-xpos.npz) and UPOS's control task (Hewitt & Liang 2019: one label
      per word type drawn from the UPOS train distribution, `baselines.control_labels`, seed 0;
      OUT_DIR/TAG-y-control.npz), in the format of TAG-y.npz
  RPF_LAYERS=0,3,6 (environment): `fits` and `mdl` fit only these layers (a busy machine)
  RPF_SUFFIX=-L0_1 (environment): appended to the names `fits` saves (runs on different layers)
  RPF_LABELS=-xpos | -control (environment): `fits` reads TAG-y$RPF_LABELS.npz and writes its
      outputs as TAG$RPF_LABELS-acc-FIT.npy (default: UPOS)
  python experiments/diagnostics/real_probe_fit.py mdl TAG OUT_DIR [FITTING_PY]
      (issue 49) the UPOS online codelength (`probes.core.mdl`, the syntax probe's defaults: 20,000
      examples at most, its fractions) on the fit words, per layer, printed in bits and saved as
      OUT_DIR/TAG-mdl-<name>.npy (<name>: "now", or FITTING_PY's file stem: another fitting.py)

Threads: RPF_THREADS (default 2; 1 is faster on a machine shared with other jobs).
  python experiments/diagnostics/real_probe_fit.py half TAG OUT_DIR
      the same Adam fit (6 epochs, lr 0.01) on the features as stored in fp32, bf16 and fp16

Example: HF_HUB_OFFLINE=1 python experiments/diagnostics/real_probe_fit.py features \\
             HuggingFaceTB/SmolLM2-135M-Instruct smol /tmp/rpf
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from workbench.io import atomic_path

ADAM = dict(optimizer="adam", epochs=6, lr=0.01, batch_size=256, min_steps=1)


def save_array(path: Path, array: np.ndarray) -> None:
    """`np.save` to a temporary file beside `path`, renamed when written (never half an array)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, array)


def features(model: str, tag: str, out: Path) -> None:
    from probes.syntax.features import FeatureView
    from probes.syntax.items import build_items
    from probes.syntax.prepare import plan_splits
    from probes.syntax.settings import SyntaxSettings
    from probes.syntax.tasks import encode_labels
    from workbench.activations import extract
    from workbench.running.models import ModelHandle

    out.mkdir(parents=True, exist_ok=True)
    d = SyntaxSettings()
    plan = plan_splits("en_ewt", "train", "dev", max_train_sentences=1000, max_eval_sentences=500,
                       early_stopping_fraction=d.early_stopping_fraction, holdout_fraction=d.holdout_fraction, seed=0)
    handle = ModelHandle.load(model)
    cache = out / f"cache-{tag}"
    train = extract(handle, [s.words for s in plan.train], "upos-train", batch_size=32, cache_dir=cache)
    ev = extract(handle, [s.words for s in plan.eval], "upos-eval", batch_size=32, cache_dir=cache)
    items = {"fit": build_items("upos", plan.train, train.sentence_offsets, plan.fit, 0, d.deprel_subtypes),
             "stop": build_items("upos", plan.train, train.sentence_offsets, plan.stop, 0, d.deprel_subtypes),
             "ev": build_items("upos", plan.eval, ev.sentence_offsets, None, 0, d.deprel_subtypes)}
    vocab = {label: i for i, label in enumerate(sorted(set(items["fit"].labels)))}
    for name, acts in (("fit", train), ("stop", train), ("ev", ev)):
        save_array(out / f"{tag}-x{name}.npy", np.asarray(FeatureView(acts.layers, items[name].cols)[:]))
    with atomic_path(out / f"{tag}-y.npz") as tmp, open(tmp, "wb") as fh:
        np.savez(fh, c=len(vocab), **{k: encode_labels(v.labels, vocab) for k, v in items.items()})


LABELS = os.environ.get("RPF_LABELS", "")  # "", "-xpos" or "-control": the label set `fits` reads
# RPF_LAYERS=0,3,6 (environment): fit and score only these layers (`fits`, `mdl`; default all)
LAYERS = [int(v) for v in os.environ["RPF_LAYERS"].split(",")] if os.environ.get("RPF_LAYERS") else None
# RPF_SUFFIX=-L2_8 (environment): appended to the names `fits` saves (several runs of one fit on
# different layers side by side; `fits` compares against every saved converged-* run, layer by layer)
SUFFIX = os.environ.get("RPF_SUFFIX", "")


def labels(tag: str, out: Path) -> None:
    """XPOS and UPOS control labels of the words `features` saved (see the module docstring)."""
    from probes.core import baselines
    from probes.syntax.items import build_items
    from probes.syntax.prepare import plan_splits
    from probes.syntax.settings import SyntaxSettings
    from probes.syntax.tasks import encode_labels

    d = SyntaxSettings()
    plan = plan_splits("en_ewt", "train", "dev", max_train_sentences=1000, max_eval_sentences=500,
                       early_stopping_fraction=d.early_stopping_fraction, holdout_fraction=d.holdout_fraction, seed=0)
    offsets = {"train": np.concatenate([[0], np.cumsum([len(s.words) for s in plan.train])]),
               "eval": np.concatenate([[0], np.cumsum([len(s.words) for s in plan.eval])])}
    upos = np.load(out / f"{tag}-y.npz")
    for task in ("upos", "xpos"):
        items = {"fit": build_items(task, plan.train, offsets["train"], plan.fit, 0, d.deprel_subtypes),
                 "stop": build_items(task, plan.train, offsets["train"], plan.stop, 0, d.deprel_subtypes),
                 "ev": build_items(task, plan.eval, offsets["eval"], None, 0, d.deprel_subtypes)}
        if len(items["fit"]) != len(upos["fit"]) or len(items["ev"]) != len(upos["ev"]):
            sys.exit(f"real_probe_fit labels: the split does not match {tag}-y.npz")
        vocab = {label: i for i, label in enumerate(sorted(set(items["fit"].labels)))}
        y = {k: encode_labels(v.labels, vocab) for k, v in items.items()}
        if task == "xpos":
            sets = {"-xpos": (len(vocab), y)}
        else:  # the control task of UPOS, drawn as probes.syntax.tasks draws it (seed 0)
            dist = baselines.label_distribution(y["fit"], len(vocab))
            sets = {"-control": (len(vocab), {k: baselines.control_labels(v.types, dist, 0) for k, v in items.items()})}
        for suffix, (c, ys) in sets.items():
            with atomic_path(out / f"{tag}-y{suffix}.npz") as tmp, open(tmp, "wb") as fh:
                np.savez(fh, c=c, **ys)
            print(f"{tag}-y{suffix}.npz: {c} classes, {len(ys['fit'])} fit words", flush=True)


def mdl(tag: str, out: Path, fitting_py: str | None) -> None:
    """Per-layer UPOS online codelength with this checkout's fitting.py or another (module docstring)."""
    name = "now"
    if fitting_py:
        _use_fitting(fitting_py)
        name = Path(fitting_py).stem
    from probes.core import mdl as mdl_module
    from probes.syntax.settings import SyntaxSettings

    x, y, c = _load(tag, out)
    rng = np.random.default_rng(0)
    cap = SyntaxSettings().mdl_max_examples
    idx = np.sort(rng.choice(len(y["fit"]), cap, replace=False)) if len(y["fit"]) > cap else np.arange(len(y["fit"]))
    t = time.perf_counter()
    code = mdl_module.mdl_online_code(torch.from_numpy(x[0][:, idx]), y["fit"][idx], num_classes=c, seed=0,
                                      layers=LAYERS)
    bits = code.online_codelength
    print(f"{tag} mdl ({name}): {time.perf_counter() - t:.1f}s, {len(idx)} examples, uniform {code.uniform_codelength:.0f} bits; "
          f"online codelength per layer (bits): {np.round(bits).astype(int).tolist()}", flush=True)
    save_array(out / f"{tag}-mdl-{name}.npy", bits)


def _use_fitting(fitting_py: str) -> None:
    """Import another probes/core/fitting.py in place of this checkout's (before anything imports it)."""
    import importlib.util

    import probes.core

    spec = importlib.util.spec_from_file_location("probes.core.fitting", fitting_py)
    module = importlib.util.module_from_spec(spec)
    sys.modules["probes.core.fitting"] = probes.core.fitting = module
    spec.loader.exec_module(module)


def _load(tag: str, out: Path):
    y = np.load(out / f"{tag}-y{LABELS}.npz")
    return [np.load(out / f"{tag}-x{k}.npy") for k in ("fit", "stop", "ev")], y, int(y["c"])


def _fit_and_score(x, y, c, **config):
    from probes.core import fitting

    t = time.perf_counter()
    res = fitting.fit_probe(torch.from_numpy(x[0]), y["fit"], torch.from_numpy(x[1]), y["stop"], num_classes=c + 1,
                            layers=LAYERS, **config)
    seconds = time.perf_counter() - t
    return res.correct(x[2], y["ev"]) & (y["ev"] < c)[None], seconds, res.steps


def fit_config(name: str) -> dict:
    """The fit_probe keywords of a FIT name (see the module docstring)."""
    if name == "default":
        return {}
    if name == "lbfgs":
        return dict(optimizer="lbfgs")
    if name == "converged":
        return dict(optimizer="lbfgs", early_stopping=False, max_iter=1000)
    if name.startswith("converged-") and name[10:].isdigit():  # a larger iteration cap
        return dict(optimizer="lbfgs", early_stopping=False, max_iter=int(name[10:]))
    parts = name.split("-")
    if parts[0] != "adam" or len(parts) < 4:
        sys.exit(f"real_probe_fit: unknown fit {name!r} (default | lbfgs | converged | adam-EPOCHS-LR-BATCH[-cK][-loss][-noes])")
    config = dict(optimizer="adam", epochs=int(parts[1]), lr=float(parts[2]), batch_size=int(parts[3]), min_steps=1, polish=0)
    for part in parts[4:]:
        if part.startswith("c"):
            config["checks_per_epoch"] = int(part[1:])
        elif part == "loss":
            config["stop_on"] = "loss"
        elif part == "acc":
            config["stop_on"] = "accuracy"
        elif part.startswith("p") and part[1:].isdigit():
            config["polish"] = int(part[1:])
        elif part == "noes":
            config["early_stopping"] = False
        else:
            sys.exit(f"real_probe_fit: unknown fit option {part!r} in {name!r}")
    return config


def fits(tag: str, out: Path, names: list[str]) -> None:
    x, y, c = _load(tag, out)
    for name in names:
        config = fit_config(name)
        correct, seconds, steps = _fit_and_score(x, y, c, **config)
        acc = correct.mean(1)
        print(f"{name}{LABELS}: {seconds:.1f}s steps={steps} mean={acc.mean():.4f} min={acc.min():.4f}\n"
              f"  per layer: {np.round(acc, 4).tolist()}", flush=True)
        layers = np.array(LAYERS if LAYERS is not None else range(len(acc)))
        stem = f"{tag}{LABELS}-%s-{name}{SUFFIX}.npy"
        save_array(out / (stem % "acc"), acc)
        save_array(out / (stem % "correct"), correct)
        save_array(out / (stem % "layers"), layers)
        if name != "converged":
            compare(out, tag, layers, correct)


def reference_rows(out: Path, tag: str) -> dict[int, np.ndarray]:
    """Layer -> per-word correctness of every saved `converged` fit of TAG (RPF_LABELS): the fit of
    all layers, and any runs of some layers (TAG-correct-converged-L0_1.npy with its -layers- file)."""
    rows: dict[int, np.ndarray] = {}
    # a run with a larger cap (converged-N) replaces the 1,000-iteration one on its layers
    paths = sorted(out.glob(f"{tag}{LABELS}-correct-converged*.npy"), key=lambda p: (p.name.startswith(f"{tag}{LABELS}-correct-converged-") and p.name[len(f"{tag}{LABELS}-correct-converged-"):][:1].isdigit(), p.name))
    for path in paths:
        lpath = path.with_name(path.name.replace("-correct-", "-layers-"))
        correct = np.load(path)
        layers = np.load(lpath) if lpath.exists() else np.arange(len(correct))
        rows.update({int(layer): row for layer, row in zip(layers, correct)})
    return rows


def compare(out: Path, tag: str, layers: np.ndarray, correct: np.ndarray) -> None:
    """Print a fit's per-layer gap to the converged reference (where one is saved) with its paired s.e."""
    ref = reference_rows(out, tag)
    have = [i for i, layer in enumerate(layers) if int(layer) in ref]
    if not have:
        return
    diff = correct[have].astype(np.float64) - np.stack([ref[int(layers[i])] for i in have])
    gap, se = diff.mean(1) * 100, diff.std(1) / np.sqrt(diff.shape[1]) * 100
    worst = int(np.argmin(gap))
    print(f"  layers {[int(layers[i]) for i in have]} minus converged (points): {np.round(gap, 2).tolist()}\n"
          f"  paired s.e.: {np.round(se, 2).tolist()}\n"
          f"  lowest {gap[worst]:+.2f} at layer {int(layers[have[worst]])} (paired s.e. {se[worst]:.2f}); "
          f"layers more than 0.3 below: {[int(layers[have[i]]) for i in np.flatnonzero(gap < -0.3)]}", flush=True)


def _status_mb() -> dict[str, float]:
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


def memory(tag: str, out: Path, fit: str, fitting_py: str | None) -> None:
    from probes.syntax.features import FeatureView

    if fitting_py:  # measure another version of the fitting module
        _use_fitting(fitting_py)
    from probes.core import fitting

    y = np.load(out / f"{tag}-y.npz")
    c = int(y["c"])
    base = np.load(out / f"{tag}-xfit.npy", mmap_mode="r")
    x_fit = FeatureView(base, [np.arange(base.shape[1])])
    x_stop = np.load(out / f"{tag}-xstop.npy")
    size = base.size * 4 / 2**20
    fitting.fit_probe(x_stop[:, :500], y["stop"][:500], num_classes=c + 1, optimizer="adam", epochs=1,
                      min_steps=1)  # the optimiser's one-off imports, outside the measurement
    before = _status_mb()
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM (Linux)
        f.write("5")
    peak_anon = peak_file = 0.0
    stop = threading.Event()

    def sample():  # RssAnon and RssFile have no peak counter of their own: sample them
        nonlocal peak_anon, peak_file
        while not stop.is_set():
            now = _status_mb()
            peak_anon, peak_file = max(peak_anon, now["RssAnon"]), max(peak_file, now["RssFile"])
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    res = fitting.fit_probe(x_fit, y["fit"], x_stop, y["stop"], num_classes=c + 1, **fit_config(fit))
    seconds = time.perf_counter() - t
    stop.set()
    sampler.join()
    after = _status_mb()
    print(f"{tag}, {fit} ({fitting_py or 'this checkout'}): features {size:.0f} MB; fit {seconds:.1f}s "
          f"({res.config.optimizer}); before the fit VmRSS {before['VmRSS']:.0f} MB (RssAnon {before['RssAnon']:.0f}, "
          f"RssFile {before['RssFile']:.0f}); during the fit VmHWM {after['VmHWM']:.0f} MB = +{after['VmHWM'] - before['VmRSS']:.0f} MB "
          f"({(after['VmHWM'] - before['VmRSS']) / size:.2f}x the features), sampled peaks RssAnon {peak_anon:.0f} MB "
          f"(+{(peak_anon - before['RssAnon']) / size:.2f}x), RssFile {peak_file:.0f} MB "
          f"(+{(peak_file - before['RssFile']) / size:.2f}x)", flush=True)


def half(tag: str, out: Path) -> None:
    from workbench.activations import FLOAT16_MAX, bfloat16_to_float32, float32_to_bfloat16

    x, y, c = _load(tag, out)
    print(f"{tag}: largest |activation| {float(np.abs(x[0]).max()):.1f}")
    stored = {"fp32": lambda a: a, "bf16": lambda a: bfloat16_to_float32(float32_to_bfloat16(a)),
              "fp16": lambda a: a.astype(np.float16).astype(np.float32)}
    acc = {}
    for name, conv in stored.items():
        if name == "fp16" and max(float(np.abs(a).max()) for a in x) > FLOAT16_MAX:
            print("fp16: the features overflow float16 (the cache refuses them)")
            continue
        correct, seconds, _ = _fit_and_score([conv(a) for a in x], y, c, **ADAM)
        acc[name] = correct.mean(1)
        print(f"{name}: {seconds:.1f}s mean {acc[name].mean():.4f}", flush=True)
    for name in acc:
        if name != "fp32":
            diff = (acc[name] - acc["fp32"]) * 100
            print(f"{name} - fp32 per layer (points): {np.round(diff, 2).tolist()}; largest |change| {np.abs(diff).max():.2f}")


def main(argv: list[str]) -> None:
    torch.set_num_threads(int(os.environ.get("RPF_THREADS", "2")))
    if len(argv) >= 4 and argv[0] == "features":
        features(argv[1], argv[2], Path(argv[3]).resolve())
    elif len(argv) == 4 and argv[0] == "fits":
        fits(argv[1], Path(argv[2]), argv[3].split(","))
    elif 3 <= len(argv) <= 5 and argv[0] == "memory":
        memory(argv[1], Path(argv[2]), argv[3] if len(argv) > 3 else "default", argv[4] if len(argv) > 4 else None)
    elif len(argv) == 3 and argv[0] == "labels":
        labels(argv[1], Path(argv[2]))
    elif len(argv) in (3, 4) and argv[0] == "mdl":
        mdl(argv[1], Path(argv[2]), argv[3] if len(argv) > 3 else None)
    elif len(argv) == 3 and argv[0] == "half":
        half(argv[1], Path(argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
