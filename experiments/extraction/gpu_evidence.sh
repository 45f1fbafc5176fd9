#!/usr/bin/env bash
# One GPU run for docs/extraction.md (estimated 3 minutes on an H100, not yet measured): train the small GPT
# with canaries on the GPU, run the extraction probe on its three saved steps, print the summary; everything under $OUT.
# Run from the repository root:  OUT=/tmp/out bash experiments/extraction/gpu_evidence.sh
set -euo pipefail
: "${OUT:?set OUT to the output folder}"
export BERTOLOGY_RUNS="$OUT/runs" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/device.txt" 2>/dev/null || echo cpu > "$OUT/device.txt"
start=$(date +%s)
python3 -m app.cli run experiments/extraction/gpt_small_canaries_run.yaml 2>&1 | grep -v "it/s\]\|step/s\]\|prompt/s\]" | tee "$OUT/run.log"
echo "wall seconds: $(( $(date +%s) - start ))" | tee -a "$OUT/run.log"
rm -rf "$OUT/runs/cache"   # activation/tokenised-corpus caches: rebuilt on demand
