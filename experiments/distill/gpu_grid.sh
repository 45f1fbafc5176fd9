#!/usr/bin/env bash
# The full task-distillation grid of issue 28 on one GPU, everything under $OUT:
#   1. the teacher: all-MiniLM-L6-v2 ($MINILM, a local folder) fine-tuned on all of sentence_polarity's
#      train split (8,530 sentences), 3 epochs, one seed (dev/test: 1,066 each, split seed 0);
#   2. experiments/distill/polarity_minilm_grid.yaml: 3- and 2-layer students, teacher-initialised and
#      random, T in {1, 2, 4} x alpha in {0.5, 0.9} plus alpha 0 (plain CE), 3 seeds = 84 runs, as four
#      processes side by side (one per depth x init: the models are small, the GPU has room);
#   3. $OUT/distill_rows.csv (every row of the four sweeps) and $OUT/distill_L*.txt (their tables).
# Student checkpoints stay under $OUT/runs (too large to copy back; the rows hold every number).
# Resumable: rerunning skips finished points.
set -euo pipefail
: "${OUT:?set OUT}" "${MINILM:?set MINILM (the all-MiniLM-L6-v2 folder)}"
# (GRID, DEVICE and TEACHER_FLAGS exist for a CPU smoke test of this script with a tiny model)
GRID="${GRID:-experiments/distill/polarity_minilm_grid.yaml}" DEVICE="${DEVICE:-cuda}"
export BERTOLOGY_RUNS="$OUT/runs" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m app.cli finetune --checkpoint "$MINILM" --task sentence_polarity --seeds 0 --epochs 3 --lr 1e-4 \
  --batch-size 32 --max-len 64 --name teacher --device "$DEVICE" ${TEACHER_FLAGS:-} > "$OUT/teacher.log" 2>&1
grep -aE "^\S+ +(dev|test) +[0-9.]+" "$OUT/teacher.log" || true
teacher="$BERTOLOGY_RUNS/finetune/teacher/seed-0/best"
pids=()
for depth in 3 2; do
  for init in teacher random; do
    python3 -m app.cli distill "$GRID" --teacher "$teacher" --device "$DEVICE" \
      --depths $depth --inits $init --name "grid-L$depth-$init" > "$OUT/distill_L$depth-$init.txt" 2>&1 &
    pids+=($!)
  done
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
tail -n 12 "$OUT"/distill_L*.txt
python3 - <<'PY'
import os
import pandas as pd
from workbench.store.results import ResultsStore
store = ResultsStore(os.environ["BERTOLOGY_RUNS"])
ids = store.runs(probe="distill")["run_id"].tolist()
rows = pd.concat([store.read(r).assign(run_id=r) for r in ids], ignore_index=True)
rows.to_csv(os.path.join(os.environ["OUT"], "distill_rows.csv"), index=False)
print(f"{len(rows)} rows of runs {ids} -> $OUT/distill_rows.csv")
PY
exit $status
