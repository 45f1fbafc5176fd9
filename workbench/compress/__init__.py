"""Compression: smaller networks inside the trained ones, each point a checkpoint the probes read.

- `masks`: pruning masks as {parameter name: bool tensor}; saved beside a checkpoint
  (`masks.safetensors`), hashed, re-applied after every optimizer step, sparsity counted as zeros.
- `unstructured`: the prunable set (dense matrices of every transformer block, found by module
  structure), global magnitude and random masks, the IMP schedule of lottery tickets (Chen et al.
  2020; Frankle & Carbin 2019).
- `quantize`: k-bit per-channel fake quantization of weights (k = 8 ... 1) and real int8 dynamic
  quantization on CPU for latency and size.
- `lowrank`: truncated SVD of each block matrix (rank-r product in the same shapes, or two smaller
  Linear layers) and the sparsity with the same parameter count.
The drivers built on these primitives live in `workbench.drivers`: `head_pruning` (head and MLP
importance, masking and physical slicing; Michel et al. 2019, Prasanna et al. 2020), `prune_sweep`
(`bertology prune CONFIG.yaml`, the grid method x amount x seed over a fine-tuned classifier, every
point a derived checkpoint), `pretraining_ticket`.
"""
