#!/bin/bash
# The cost table's fine-tuning rows per method (docs/cost.md, "Fine-tuning methods and distillation"):
# BERT tiny pretrained (experiments/cost/bert_tiny.yaml), then sentence polarity fine-tuned from it with
# each method (1,000 training examples, 2 epochs, seed 0, one thread), then `bertology cost --json` of
# every run and the old count (3 x the forward for every method) beside the new one, from the same records.
# Run from the repository root:  BERTOLOGY_RUNS=/tmp/x bash experiments/cost/methods_cpu.sh
set -euo pipefail
: "${BERTOLOGY_RUNS:?set BERTOLOGY_RUNS to a runs root}"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
B=${BERTOLOGY:-bertology}
PY=${PYTHON:-python3}
$B train experiments/cost/bert_tiny.yaml
T=$BERTOLOGY_RUNS/train/cost_bert_tiny/seed-0
for m in ${METHODS:-full head bitfit lora adapter prompt}; do
  $B finetune --checkpoint "$T" --task sentence_polarity --seeds 0 --epochs 2 --max-train-examples 1000 \
      --max-eval-examples 500 --lr 1e-3 --threads 1 --method "$m" --name "polarity-cost_bert_tiny-$m"
done
$B cost "$BERTOLOGY_RUNS"/finetune/polarity-cost_bert_tiny-* "$T" --json > "$BERTOLOGY_RUNS/cost_methods.json"
$PY - "$BERTOLOGY_RUNS/cost_methods.json" <<'PYEOF'
import json, sys
from pathlib import Path
records = json.loads(Path(sys.argv[1]).read_text())
print("| checkpoint | method | trainable | tokens | FLOPs/token new | old (3x fwd) | own FLOPs new | old | new/old |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for path, rec in records.items():
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    basis = manifest.get("cost_basis")
    own = rec["own"]
    if not basis:
        print(f"| {path} | (pretraining) | | {own['tokens']:,} | {own['flops_per_token']:.4g} | same | {own['flops']:.3g} | same | 1 |")
        continue
    fwd = basis["flops"]["forward"]
    old = 3 * (fwd["body_weights"] + fwd["body_scores"] + fwd["head"])
    print(f"| {Path(path).parent.parent.name} | {basis['flops']['method']} | {manifest['trainable']['parameters']:,} | "
          f"{own['tokens']:,} | {own['flops_per_token']:.4g} | {old:.4g} | {own['flops']:.3g} | {old * own['tokens']:.3g} | "
          f"{own['flops'] / (old * own['tokens']):.3f} |")
PYEOF
