"""Forward latency of a physically sliced model vs the masked one, at 50% of heads removed, and
at 50% of heads plus 50% of the MLP blocks removed.

Model: a pretrained encoder (default all-MiniLM-L6-v2, 6 x 12 heads, from the local Hugging Face
cache). Half the heads of every layer are removed, chosen by a seeded permutation:
- masked: `workbench.drivers.head_pruning.apply_mask` (the removed heads' output-projection columns are
  zero; the model keeps its full shape: what a saved pruned checkpoint runs);
- sliced: `slice_heads` on the same mask (Q/K/V rows and O columns cut out).
The outputs must agree (max abs difference reported; checked <= 1e-4). Both run the same batch
(`--batch` EWT dev sentences padded to `--tokens`), interleaved, `--repeats` times after a warm-up;
the median CPU (process) and wall time per forward pass are reported, and the ratio masked/sliced
(target >= 1.3x).

Two settings, each masked vs sliced on the same batch:
- `heads`: half the heads of every layer; the MLPs are untouched, so the ceiling is set by the
  attention's share of the FLOPs;
- `heads_and_mlps`: the same heads and, in addition, the MLPs of half the layers (a seeded choice)
  removed: masked = their last projection zeroed, sliced = cut to zero width
  (`slice_heads(..., mlps_kept)`; Prasanna et al. 2020 prune MLPs with heads).
For each, the analytic multiply-adds of the transformer blocks per forward pass (`block_macs`:
every dense layer's weight x tokens, plus the attention products 2 x T x (heads x head_dim) per
token, counted on the modules' actual shapes) give the share of the work slicing removes and the
speed-up bound it implies (masked MACs / sliced MACs, the embeddings and pooling excluded), printed
and written next to the measured speed-up.

Usage: python benchmarks/bench_head_slicing.py [--model NAME_OR_FOLDER] [--batch 16] [--tokens 128] [--repeats 15]
Writes benchmarks/results/bench_head_slicing-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def block_macs(model, tokens: int) -> int:
    """Multiply-adds of one sequence of `tokens` tokens through the transformer blocks of `model`,
    counted on the modules as they are (a sliced model has smaller matrices): every dense layer of
    a block (Q/K/V, output, MLP projections) costs its weight's size per token, and the attention
    products (Q K^T and the weighted sum of V) 2 x T x (heads x head_dim) per token."""
    from workbench.drivers import head_pruning as H
    from workbench.compress.unstructured import dense_layers

    macs = sum(m.weight.numel() for m in dense_layers(model).values()) * tokens
    for site in H.attention_sites(model):
        width = site.attention.all_head_size if hasattr(site.attention, "all_head_size") else site.num_heads * site.head_dim
        macs += 2 * tokens * tokens * int(width)
    return int(macs)


def main(argv=None) -> dict:
    from transformers import AutoModel

    from results_io import record_start, write_result
    from workbench.running.model_loading import load_weights, read_tokenizer
    from workbench.store.checkpoints import resolve_checkpoint
    from workbench.drivers import head_pruning as H
    from workbench.data.conllu import load_treebank

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--fraction", type=float, default=0.5, help="share of each layer's heads removed")
    p.add_argument("--mlp-fraction", type=float, default=0.5, help="share of the layers whose MLP is removed "
                                                                    "(second setting)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = record_start()

    path = resolve_checkpoint(args.model)
    base = load_weights(AutoModel, path).eval()
    tok = read_tokenizer(path)
    sentences = [" ".join(s.words) for s in load_treebank("en_ewt", "dev")[: args.batch]]
    batch = tok(sentences, padding="max_length", truncation=True, max_length=args.tokens, return_tensors="pt")
    Ln, Hn = H.head_shape(base)
    rng = np.random.default_rng(args.seed)
    kept = np.ones((Ln, Hn), bool)
    for layer in range(Ln):
        kept[layer, rng.permutation(Hn)[: int(round(Hn * args.fraction))]] = False
    mlps = np.ones(Ln, bool)
    mlps[rng.permutation(Ln)[: int(round(Ln * args.mlp_fraction))]] = False

    def run(model):
        with torch.inference_mode():
            return model(**batch).last_hidden_state

    def measure(mlps_kept):
        masked = H.apply_mask(copy.deepcopy(base), kept, mlps_kept)
        sliced = H.slice_heads(copy.deepcopy(base), kept, mlps_kept)
        diff = float((run(masked) - run(sliced)).abs().max())
        assert diff <= 1e-4, f"sliced and masked outputs differ by {diff}"
        times = {"masked": [], "sliced": []}
        for _ in range(args.repeats):
            for name, model in (("masked", masked), ("sliced", sliced)):
                c, w = time.process_time(), time.perf_counter()
                run(model)
                times[name].append((time.process_time() - c, time.perf_counter() - w))
        med = {name: {"cpu_s": statistics.median(t[0] for t in v), "wall_s": statistics.median(t[1] for t in v)}
               for name, v in times.items()}
        macs = {"masked": block_macs(masked, args.tokens) * args.batch, "sliced": block_macs(sliced, args.tokens) * args.batch}
        return {"parameters": {"masked": H.parameter_count(masked), "sliced": H.parameter_count(sliced)},
                "max_abs_diff": diff, "median": med,
                "speedup_cpu": round(med["masked"]["cpu_s"] / med["sliced"]["cpu_s"], 3),
                "speedup_wall": round(med["masked"]["wall_s"] / med["sliced"]["wall_s"], 3),
                "block_macs": macs, "macs_fraction_removed": round(1 - macs["sliced"] / macs["masked"], 4),
                "speedup_bound_from_macs": round(macs["masked"] / macs["sliced"], 3),
                "mlps_kept": None if mlps_kept is None else mlps_kept.tolist()}

    settings = {"heads": measure(None), "heads_and_mlps": measure(mlps)}
    report = {
        "model": args.model, "layers_heads": [Ln, Hn], "heads_removed": int(kept.size - kept.sum()),
        "mlps_removed_in_heads_and_mlps": int(Ln - mlps.sum()),
        "batch": args.batch, "tokens": args.tokens, "repeats": args.repeats, "threads": torch.get_num_threads(),
        **settings["heads"],  # the heads-only numbers at the top level, as before
        "settings": settings, "heads_kept": kept.tolist(), "target": "speedup >= 1.3",
    }
    for name, r in settings.items():
        print(f"{name}: masked {r['median']['masked']} | sliced {r['median']['sliced']} | speedup cpu "
              f"{r['speedup_cpu']}x wall {r['speedup_wall']}x | block MACs removed {r['macs_fraction_removed']:.1%}, "
              f"bound {r['speedup_bound_from_macs']}x | max |diff| {r['max_abs_diff']:.2e} | params {r['parameters']}")
    write_result("bench_head_slicing", report, start, args.json)
    return report


if __name__ == "__main__":
    main()
