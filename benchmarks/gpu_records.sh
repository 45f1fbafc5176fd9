#!/usr/bin/env bash
# Issue 30's GPU records in one call on a lent GPU (the session's device time is short, so all in one
# command; run from the repository root, $OUT set, $BERTOLOGY_DATA a data root holding state_union,
# inaugural and UD EWT). Timings first, each alone on the machine:
#   1. bench_gpu.py at its defaults (BERT base, 64 x 128, bf16, deterministic) with the HF Trainer
#      baseline and a torch.profiler run of 10 steps (device-busy fraction, host-device waits, top ops);
#   2. the same without deterministic algorithms (ours only);
#   3. batch 256 x 128 with the HF baseline (how much of the gap is the small step; 14 steps: the
#      packed baseline's blocks of state_union + inaugural run out beyond that);
#   4. bench_extraction.py --device cuda (12 x 768 random BERT: batched vs bare vs one sentence at a time);
#   5. profile_extraction.py on the GPU with a cProfile of one extract (where the host's time goes).
# Records land in $OUT (JSON + logs).
set -u
: "${OUT:?set OUT}" "${BERTOLOGY_DATA:?set BERTOLOGY_DATA}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false BERTOLOGY_RUNS=${BERTOLOGY_RUNS:-/tmp/bench-runs}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the repository, also where the package is not installed
PY=${PY:-python3}
t0=$(date +%s)
step() {  # step NAME CAP COMMAND...
  local name=$1 cap=$2; shift 2
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1; echo "exit $? after $(( $(date +%s) - t0 )) s" >> "$OUT/$name.log"
  grep -av "it/s\]" "$OUT/$name.log" | tail -n 25
}
step gpu_default 150 $PY benchmarks/bench_gpu.py --sources state_union inaugural --steps 40 --profile-steps 10 --json "$OUT/bench_gpu_default.json"
step gpu_nodet 90 $PY benchmarks/bench_gpu.py --sources state_union inaugural --steps 40 --no-deterministic --skip-hf --json "$OUT/bench_gpu_nodet.json"
step gpu_b256 150 $PY benchmarks/bench_gpu.py --sources state_union inaugural --steps 14 --batch-size 256 --json "$OUT/bench_gpu_b256.json"
step extraction 90 $PY benchmarks/bench_extraction.py --device cuda --layers 12 --hidden 768 --skip-rss --sentences 1500 --json "$OUT/bench_extraction_cuda.json"
step profile_extraction 90 env DEVICE=cuda LAYERS=12 HIDDEN=768 N=1500 R=2 PROFILE=1 $PY benchmarks/profile_extraction.py
echo "all: $(( $(date +%s) - t0 )) s"
