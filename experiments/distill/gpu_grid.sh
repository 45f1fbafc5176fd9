#!/usr/bin/env bash
# The full distillation grid on one GPU (issue 28), everything under $OUT:
#   1. the teacher: all-MiniLM-L6-v2 ($MINILM, a local folder) fine-tuned on all of sentence_polarity's
#      train split (8,530 sentences), 3 epochs, one seed;
#   2. bertology distill experiments/distill/polarity_minilm_grid.yaml (84 student runs);
#   3. the rows as CSV and the table as text ($OUT/distill_rows.csv, $OUT/distill_table.txt).
# Student checkpoints stay under $OUT/runs (too large to copy back; the rows hold every number).
# Resumable: rerunning continues with the unfinished points.
set -euo pipefail
: "${OUT:?set OUT}" "${MINILM:?set MINILM (the all-MiniLM-L6-v2 folder)}"
export BERTOLOGY_RUNS="$OUT/runs" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m app.cli finetune --checkpoint "$MINILM" --task sentence_polarity --seeds 0 --epochs 3 --lr 1e-4 \
  --batch-size 32 --max-len 64 --name teacher --device cuda 2>&1 | grep -v "step/s\|it/s" | tee "$OUT/teacher.log"
python3 -m app.cli distill experiments/distill/polarity_minilm_grid.yaml \
  --teacher "$BERTOLOGY_RUNS/finetune/teacher/seed-0/best" --device cuda 2>&1 | tee "$OUT/distill_table.txt"
python3 - <<'PY'
import os
from workbench.results import ResultsStore
store = ResultsStore(os.environ["BERTOLOGY_RUNS"])
run_id = store.runs(probe="distill")["run_id"].iloc[-1]
store.read(run_id).to_csv(os.path.join(os.environ["OUT"], "distill_rows.csv"), index=False)
print(f"rows of run {run_id} -> $OUT/distill_rows.csv")
PY
