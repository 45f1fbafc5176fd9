#!/usr/bin/env bash
# The full PEFT evidence on one GPU (docs/peft.md): all-MiniLM-L6-v2 on the whole sentence_polarity
# train split, 2 epochs, 3 seeds, the six methods, CKA per layer on 500 EWT dev sentences; then
# with BENCH=1 the step-time / peak-memory benchmark of each method on the same GPU.
# Run from the repository root:  MINILM=/path/to/all-MiniLM-L6-v2 OUT=/some/folder bash experiments/peft/gpu_evidence.sh
# Needs $MINILM (a local model folder) and $OUT; reads the data root from $BERTOLOGY_DATA.
# Writes under $OUT: peft.log (the summary table), results/ (the results store: every run's rows
# and manifest), finetune/*/config.json, splits.json and seed-*/result.json (no weights), bench_peft.json (BENCH=1).
set -euo pipefail
: "${MINILM:?set MINILM to the all-MiniLM-L6-v2 folder}" "${OUT:?set OUT}"
export BERTOLOGY_RUNS="${TMPDIR:-/tmp}/peft-runs-$$" HF_HUB_OFFLINE=1
mkdir -p "$OUT" "$BERTOLOGY_RUNS"
python3 -m app.cli peft experiments/peft/minilm_polarity.yaml --checkpoint "$MINILM" --device cuda 2>&1 \
    | tee "$OUT/peft.log"
cp -r "$BERTOLOGY_RUNS/results" "$OUT/results"
(cd "$BERTOLOGY_RUNS" && find finetune -name "*.json" ! -path "*/best/*" ! -path "*/resume/*" -print0 \
    | xargs -0 -I{} cp --parents {} "$OUT/")
if [ "${BENCH:-0}" = 1 ]; then  # about 1.5 minutes more: six fresh processes
    python3 benchmarks/bench_peft.py --checkpoint "$MINILM" --device cuda --threads 4 --steps 20 \
        --json "$OUT/bench_peft.json" 2>&1 | tee "$OUT/bench_peft.log"
fi
