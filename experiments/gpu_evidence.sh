#!/usr/bin/env bash
# Every GPU evidence run of issues 27-30, in one call on one lent GPU (the session's device time is
# 15 minutes, so everything goes in one command):
#   1. the GPU records, alone on the machine (their timings are the point): benchmarks/bench_gpu.py
#      (the loop's bf16 MFU on the `base` BERT against the measured bf16 matmul peak, and HF Trainer
#      packed in bf16) and benchmarks/bench_extraction.py --device cuda (12 x 768: batched extraction
#      vs one sentence at a time);
#   2. the evidence jobs side by side, each its own process, log and time cap (CAP seconds): compression
#      sweep (docs/pruning.md), head pruning (docs/pruning.md), distillation grid
#      (docs/distillation.md), PEFT methods (docs/peft.md), NER + cost (docs/cost.md, docs/finetune.md),
#      extraction with canaries (docs/extraction.md). Each job's own script is the documented command;
#      this file only runs them together. A job cut by its cap leaves what it wrote (the sweeps are
#      resumable and write as they go).
# Everything lands in $OUT/evidence.tgz (weights deleted first: the rows, logs and manifests are kept).
# Needs: $OUT, $MINILM (a local all-MiniLM-L6-v2 folder), $BERTOLOGY_DATA (a data root holding the
# sources these jobs read: sentence_polarity, EWT, state_union, inaugural, conll2002 esp).
# EXTRACTION_RUN: the extraction experiment file (default experiments/extraction/gpt_small_canaries_run.yaml).
set -u
: "${OUT:?set OUT}" "${MINILM:?set MINILM}" "${BERTOLOGY_DATA:?set BERTOLOGY_DATA}"
EV=/tmp/ev
CAP=${CAP:-270}
mkdir -p "$EV"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi > "$EV/nvidia-smi.txt" 2>&1
python3 -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name())" > "$EV/versions.txt" 2>&1
t0=$(date +%s)

BERTOLOGY_RUNS=/tmp/bench-runs timeout 130 python3 benchmarks/bench_gpu.py --sources state_union inaugural --steps 40 \
  --json "$EV/bench_gpu.json" > "$EV/bench_gpu.log" 2>&1; echo "exit $?" >> "$EV/bench_gpu.log"
BERTOLOGY_RUNS=/tmp/bench-runs timeout 70 python3 benchmarks/bench_extraction.py --device cuda --layers 12 --hidden 768 \
  --skip-rss --sentences 1500 --json "$EV/bench_extraction.json" > "$EV/bench_extraction.log" 2>&1; echo "exit $?" >> "$EV/bench_extraction.log"
echo "benchmarks: $(( $(date +%s) - t0 )) s" >> "$EV/timeline.txt"

job() {  # job NAME COMMAND...: OUT=$EV/NAME, runs root inside it, capped at CAP seconds
  local name=$1; shift
  mkdir -p "$EV/$name"
  ( export OUT="$EV/$name" BERTOLOGY_RUNS="$EV/$name/runs"; s=$(date +%s)
    timeout "$CAP" "$@" > "$EV/$name.log" 2>&1; rc=$?
    echo "exit $rc after $(( $(date +%s) - s )) s" >> "$EV/$name.log" ) &
}
job prune python3 -m app.cli prune experiments/prune/minilm_polarity_gpu.yaml --checkpoint "$MINILM" \
  --output-dir "$EV/prune/prune" --device cuda
job heads bash -c 'python3 experiments/prune_heads.py "$MINILM" --seeds 0 1 2 --epochs 3 --importance-examples 512 --to-end --out "$OUT/curves" && timeout 100 python3 experiments/prune_heads.py "$MINILM" --seeds 0 1 2 --epochs 3 --importance-examples 512 --to-end --refinetune --refinetune-epochs 2 --out "$OUT/refinetune"'
job distill bash experiments/distill/gpu_grid.sh
job peft env TMPDIR="$EV/peft" bash experiments/peft/gpu_evidence.sh  # its runs root is under TMPDIR: kept if capped
job cost bash experiments/cost/gpu_evidence.sh
job extraction bash -c 'python3 -m app.cli run "${EXTRACTION_RUN:-experiments/extraction/gpt_small_canaries_run.yaml}" 2>&1 | grep -av "it/s\]\|step/s\]\|prompt/s\]"'
wait
echo "all: $(( $(date +%s) - t0 )) s" >> "$EV/timeline.txt"
find "$EV" \( -name '*.safetensors' -o -name '*.pt' -o -name '*.bin' -o -name '*.npy' \) -delete
find "$EV" -type d -name cache -prune -exec rm -rf {} +
tar czf "$OUT/evidence.tgz" -C /tmp ev
ls -la "$OUT"; cat "$EV/timeline.txt"; tail -n 5 "$EV"/*.log
