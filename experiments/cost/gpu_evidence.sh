#!/bin/bash
# GPU evidence for docs/finetune.md and docs/cost.md (about 2-3 minutes on one H100):
#  1. CoNLL-2002 Spanish NER on MiniLM: the full train split, 3 seeds x 3 epochs, conlleval span F1
#     on the shared task's testb, with the baselines (experiments/finetune_ner_es.yaml);
#  2. BERT small pretrained for 600 steps on the GPU (energy measured through NVML when pynvml is
#     there, else estimated: the manifest says which);
#  3. the cost table of both (bertology cost), the fine-tuned model's lineage included.
# Needs: $OUT (everything is written under it), $MINILM (a MiniLM folder or its Hub name),
# $BERTOLOGY_DATA (the data root). Run from the repository root:  bash experiments/cost/gpu_evidence.sh
# A CPU smoke test of the same script: DEVICE=cpu NER_ARGS="--seeds 0 --epochs 1 --max-train-examples 32
# --max-eval-examples 16" TRAIN_STEPS=4 OUT=/tmp/x MINILM=sentence-transformers/all-MiniLM-L6-v2 bash ...
set -euo pipefail
DEVICE=${DEVICE:-cuda}
TRAIN_STEPS=${TRAIN_STEPS:-600}
: "${OUT:?set OUT to an output folder}" "${MINILM:?set MINILM to the MiniLM folder}"
export BERTOLOGY_RUNS="$OUT/runs" HF_HUB_OFFLINE=1
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,power.draw,power.limit --format=csv > "$OUT/nvidia_smi.csv" 2>&1 || true
$PY -c "import pynvml" 2> /dev/null && echo "pynvml: yes" > "$OUT/pynvml.txt" || echo "pynvml: no" > "$OUT/pynvml.txt"
$PY -m app.cli finetune experiments/finetune_ner_es.yaml --checkpoint "$MINILM" --device "$DEVICE" --name ner-es-minilm ${NER_ARGS:-} \
    > "$OUT/finetune_ner_es.txt" 2> "$OUT/finetune_ner_es.progress.log"
$PY -m app.cli train experiments/cost/bert_small.yaml --device "$DEVICE" --steps "$TRAIN_STEPS" --name cost_bert_small_gpu \
    > "$OUT/train_small_gpu.txt" 2> "$OUT/train_small_gpu.progress.log"
$PY -m app.cli cost "$BERTOLOGY_RUNS/finetune/ner-es-minilm" "$BERTOLOGY_RUNS/train/cost_bert_small_gpu/seed-0" \
    --record > "$OUT/cost_table.txt"
$PY -m app.cli cost "$BERTOLOGY_RUNS/finetune/ner-es-minilm" "$BERTOLOGY_RUNS/train/cost_bert_small_gpu/seed-0" \
    --json > "$OUT/cost.json"
cat "$OUT/finetune_ner_es.txt" "$OUT/cost_table.txt"
# the weights stay out of $OUT (hundreds of MB): manifests, rows and the tables above are the evidence
find "$OUT/runs" -name "*.safetensors" -delete
rm -rf "$OUT/runs/cache"
