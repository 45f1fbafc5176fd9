"""The benchmark table of docs/benchmarks.md, generated from the benchmark records in benchmarks/results/*.json.

Takes the newest record of each benchmark (by its `finished` time; `--all` lists every record) and
prints one markdown row per headline figure: what was compared, our figure, the baseline's, the
ratio, the target, and the conditions (threads, load average at start/end of the run: on a shared
machine a high load means the figure is noisy). Nothing is typed in: a figure that is not in a
record is not in the table.

Usage: python benchmarks/report.py [--results benchmarks/results] [--all] [--readme docs/benchmarks.md]
`--readme FILE` replaces the text between FILE's `<!-- benchmarks-table:start -->` and
`<!-- benchmarks-table:end -->` markers with the table (atomically); nothing else in the file changes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
START, END = "<!-- benchmarks-table:start -->", "<!-- benchmarks-table:end -->"


def _load(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and rec.get("benchmark"):
            rec["_file"] = path.name
            out.append(rec)
    return out


def _rate(x: float) -> str:
    return f"{x:,.0f}"


def device_of(r: dict) -> str:
    """Where a record's figures were measured: the GPU's name ("cuda" when a GPU record did not name
    it), else the CPU model ("cpu" for older records without one). Targets hold per device kind, so
    each kind keeps its own rows: a newer record never replaces another machine's figure."""
    if r.get("gpu"):
        return r["gpu"]
    if str(r.get("device", "cpu")).startswith("cuda"):
        return "cuda"
    return (r.get("machine") or {}).get("model") or "cpu"


def _is_gpu(r: dict) -> bool:
    return bool(r.get("gpu")) or str(r.get("device", "cpu")).startswith("cuda")


def _rows(r: dict) -> list[tuple[str, str, str, str, str]]:
    """(what, ours, baseline, ratio, target) rows of one record."""
    b = r["benchmark"]
    if b == "bench_gpu":
        peak = r["bf16_matmul_peak"]["flops_per_s"] / 1e12
        # the step's shape leads the label: a row per shape (the default 64 x 128 and a larger step)
        shape = f"{r['batch_size']}x{r['max_len']}"
        return [(f"training tokens/s {shape}, BERT {r['preset']}, bf16, vs HF Trainer packed in bf16",
                 _rate(r["ours_tokens_per_s"]), _rate(r["hf_packed_tokens_per_s"]), f"{r['ratio_vs_packed']:.2f}x", ""),
                (f"training MFU {shape} (bf16 matmul peak {peak:.0f} TFLOP/s measured), HF packed as baseline",
                 f"{100 * r['mfu_ours']:.1f}%", f"{100 * r['mfu_hf_packed']:.1f}%", "", "")]
    if b == "bench_train":
        shape = f"BERT {r['preset']}, {r['batch_size']}x{r['max_len']}"
        peak = r["matmul_peak_flops_per_s"] / 1e9
        rows = [
            (f"training tokens/s, {shape}, vs HF Trainer one sentence per example", _rate(r["ours_tokens_per_s"]),
             _rate(r["hf_padded_tokens_per_s"]), f"{r['ratio_vs_padded']:.2f}x", ">= 1.5x"),
            (f"training tokens/s, {shape}, vs HF Trainer packed (run_mlm group_texts)", _rate(r["ours_tokens_per_s"]),
             _rate(r["hf_packed_tokens_per_s"]), f"{r['ratio_vs_packed']:.2f}x", ">= 1.5x"),
            (f"training MFU ({r['flops_per_token']['ours']['total'] / 1e6:.1f} MFLOP/token; fp32 matmul peak "
             f"{peak:.0f} GFLOP/s), HF packed as baseline", f"{100 * r['mfu_ours']:.0f}%",
             f"{100 * r['mfu_hf_packed']:.0f}%", "", ">= 60%"),
        ]
        if "ours_bf16_tokens_per_s" in r:  # CPUs with native bf16
            rows.append((f"training tokens/s, {shape}, precision bf16 vs our fp32 loop", _rate(r["ours_bf16_tokens_per_s"]),
                         _rate(r["ours_tokens_per_s"]), f"{r['ratio_bf16_vs_fp32']:.2f}x", ""))
            rows.append((f"training MFU, precision bf16 (bf16 matmul peak {r['bf16_matmul_peak_flops_per_s'] / 1e9:.0f} GFLOP/s; "
                         f"of the fp32 peak: {100 * r['mfu_ours_bf16_vs_fp32_peak']:.0f}%)", f"{100 * r['mfu_ours_bf16']:.0f}%",
                         "", "", ""))
        if "step_matmul_ceiling" in r:  # records since 2026-11-27 (after the bf16 rows: a row's place is part of its key)
            c = r["step_matmul_ceiling"]
            rows.append((f"training MFU against the step's own matmul shapes timed alone ({c['flops_per_s'] / 1e9:.0f} GFLOP/s, "
                         f"{100 * r['step_matmul_ceiling_vs_peak']:.0f}% of the 2048^2 peak)",
                         f"{100 * r['mfu_ours_vs_step_matmul_ceiling']:.0f}%", "", "", ""))
        if "paired_step_mfu" in r:  # records since 2026-11-27 14:08 (last: a row's place is part of its key)
            m = r["paired_step_mfu"]
            rows.append((f"training MFU of the loop's step, peak re-measured beside each of {len(m['mfu_windows'])} windows "
                         f"(median; quartiles {' - '.join(f'{100 * q:.0f}%' for q in m['mfu_quartiles'])})",
                         f"{100 * m['mfu_median']:.0f}%", "", "", ">= 60%"))
            if "ratio_vs_hf_packed_step_median" in m:
                q = m["ratio_vs_hf_packed_step_quartiles"]
                rows.append((f"training step vs the packed baseline's BertForMaskedLM step, same driver, paired by window "
                             f"(median; quartiles {q[0]:.2f}x - {q[1]:.2f}x)", "", "",
                             f"{m['ratio_vs_hf_packed_step_median']:.2f}x", ">= 1.5x"))
        return rows
    if b == "bench_extraction" and "speed" in r:
        s = r["speed"]
        paired = s.get("overhead_vs_bare_paired_median") or {}  # records since 2026-11-27: each repetition's own ratio

        def overhead(clock: str) -> str:
            best = f"{100 * s['overhead_vs_bare'][clock]:+.1f}%"
            return f"{best} best vs best, {100 * paired[clock]:+.1f}% median of repetitions" if clock in paired else best

        rows = [(f"extraction overhead over the bare forward ({clock} time)", _rate(s["tokens_per_s"][clock]["ours"]),
                 _rate(s["tokens_per_s"][clock]["bare"]), overhead(clock), "<= +5%") for clock in ("wall", "cpu")]
        rows.append(("extraction vs one sentence at a time (wall)", _rate(s["tokens_per_s"]["wall"]["ours"]),
                     _rate(s["tokens_per_s"]["wall"]["naive"]), f"{s['speedup_vs_naive']['wall']:.1f}x", ">= 10x"))
        for label, (small, big) in (r.get("rss") or {}).items():
            key = "peak_during_extract_mb" if small.get("peak_during_extract_mb") else "peak_rss_mb"
            rows.append((f"extraction peak RSS, {small['words']:,} -> {big['words']:,} words ({label})",
                         f"{big[key]:.0f} MB", f"{small[key]:.0f} MB", f"{big[key] - small[key]:+.0f} MB for "
                         f"{big['cache_mb'] - small['cache_mb']:+.0f} MB cache", "flat"))
        return rows
    if b == "bench_probe_fit":
        tasks = "+".join(r.get("tasks", ["upos"]))
        rows = []
        if "speedup_same_heads" in r:
            rows.append((f"probe fit: {tasks} x {r['layers']} layers, {r['train_words']:,} words, one program vs sklearn "
                         f"(same heads; CPU {r['speedup_same_heads_cpu']:.1f}x)", f"{r['ours_one_seed_seconds']:.1f} s",
                         f"{r['sklearn_seconds']:.1f} s", f"{r['speedup_same_heads']:.1f}x", ">= 20x"))
        what = (f"probe fit: {r['seeds']} seeds x {tasks} x {r['layers']} layers in one program vs sklearn's "
                f"one fit per layer and label set")
        return rows + [(what, f"{r['ours_seconds']:.1f} s", f"{r['sklearn_seconds']:.1f} s", f"{r['speedup']:.1f}x", ""),
                ("probe fit: max dev accuracy gap to sklearn", f"{r['max_gap_pt']:.2f} pt", "", "", "<= 0.5 pt")]
    if b == "bench_real_probe":  # issue 42: per model, fit time / extraction time of the same features
        rows = []
        for model, m in r["models"].items():
            name = model.rstrip("/").split("/")[-1]
            n_layers = f"{len(m['layers'])} of {m['num_hidden_states']} layers"
            u, s, e = m["upos"], m["structural_distance"], m["extraction"]
            rows += [(f"real probe {name}: UPOS fit / extraction, {n_layers}, {u['train_words']:,} words "
                      f"(CPU {u['ratio_cpu']:.2f}x)", f"{u['fit']['wall_s']:.0f} s", f"{e['upos']['wall_s']:.0f} s",
                      f"{u['ratio_wall']:.2f}x", "<= 1x"),
                     (f"real probe {name}: {'standardised ' if s['settings'].get('standardize') else ''}"
                      f"structural-distance fit / extraction, {n_layers}, {s['trees']:,} trees "
                      f"(CPU {s['ratio_cpu']:.2f}x)", f"{s['fit']['wall_s']:.0f} s", f"{e['structural']['wall_s']:.0f} s",
                      f"{s['ratio_wall']:.2f}x", "<= 2x")]
            mem = u["memory"]
            if mem.get("rss_peak"):  # what the fit adds to the process (the model is freed before it)
                grown = mem["rss_peak"] - mem["rss_before"]
                rows.append((f"real probe {name}: UPOS fit's RSS growth (peak {mem['rss_peak'] / 2**20:,.0f} MB) over "
                             f"the fp32 features it reads", f"{grown / 2**20:,.0f} MB",
                             f"{u['feature_bytes'] / 2**20:,.0f} MB", f"{grown / u['feature_bytes']:.2f}x", "<= 1.5x"))
        return rows
    if b == "bench_pll":
        return [("pseudo-log-likelihood, batched vs one forward per token (wall)", _rate(r["batched"]["tokens_per_s"]),
                 _rate(r["per_token"]["tokens_per_s"]), f"{r['ratio_wall']:.1f}x", "")]
    return []


def _load_text(r: dict) -> str:
    m = r.get("machine", {})
    start = m.get("loadavg_at_start", [None])[0]
    end = (m.get("loadavg_at_end") or [None])[0]
    return f"{start:.1f} -> {end:.1f}" if start is not None and end is not None else (f"-> {end:.1f}" if end else "")


def table(records: list[dict], latest_only: bool = True) -> str:
    """Markdown rows; with `latest_only`, each row kind comes from the newest record that has it
    (a speed-only extraction run replaces the speed rows and keeps the older peak-RSS rows)."""
    records = sorted(records, key=lambda r: (r["benchmark"], r.get("finished", "")))
    rows: dict = {}
    for n, r in enumerate(records):
        device = device_of(r)
        for k, row in enumerate(_rows(r)):
            kind = (r["benchmark"], device, row[0].split(",")[0].split("(")[0] if latest_only else n, k)
            rows[kind] = (row, r)
    # with records of several devices, each row names its device
    several = len({device_of(r) for _, r in rows.values()}) > 1
    rows = {kind: ("| " + " | ".join([f"[{device_of(r)}] {row[0]}" if several else row[0], *row[1:],
                                      str(r.get("threads", "")), _load_text(r), r["_file"]]) + " |", r)
            for kind, (row, r) in rows.items()}
    lines = ["| figure | ours | baseline | ratio | target | threads | load avg start -> end | record |",
             "|---|---|---|---|---|---|---|---|", *(text for text, _ in rows.values())]
    # the machine of every record in the table (records from different machines are not comparable)
    cpus: dict[str, list[str]] = {}
    for _, r in rows.values():
        m = r.get("machine", {})
        label = (f"{m['model']}, {m['cpus']} cores ({', '.join(m.get('flags', []))})" if m.get("model")
                 else "not recorded (an older record)")
        if _is_gpu(r):
            label = f"GPU {device_of(r)} (host CPU {label})"
        cpus.setdefault(label, [])
        if r["_file"] not in cpus[label]:
            cpus[label].append(r["_file"])
    if cpus:
        lines.append("")
        for label, files in cpus.items():
            which = "" if len(cpus) == 1 else f" for {', '.join(files)}"
            lines.append(f"Machine{which}: {label}.")
    return "\n".join(lines)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--all", action="store_true", help="every record, not only the newest of each benchmark")
    p.add_argument("--readme", type=Path, help="write the table between the benchmarks-table markers of this file (docs/benchmarks.md)")
    args = p.parse_args(argv)
    text = table(_load(args.results), latest_only=not args.all)
    print(text)
    if args.readme:
        from workbench.io import atomic_write_text

        doc = args.readme.read_text(encoding="utf-8")
        if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
            raise SystemExit(f"{args.readme}: needs one {START} ... {END} pair")
        head, rest = doc.split(START)
        _, tail = rest.split(END)
        atomic_write_text(args.readme, f"{head}{START}\n{text}\n{END}{tail}")
        print(f"wrote the table into {args.readme}")
    return text


if __name__ == "__main__":
    main()
