# usage: probe.sh CODE_DIR LABEL   (old = /tmp/membership-old, new = /work/wt-membership)
set -e
export BERTOLOGY_RUNS=/tmp/runs-membership HF_HUB_OFFLINE=1 BERTOLOGY_DATA=/work/shared/data OMP_NUM_THREADS=1
G=/tmp/runs-membership/train/gpt_tiny_6src/seed-0
REF=/tmp/runs-membership/train/mia-ref-gpt-tiny/seed-0/step-0000300
ATT=loss,zlib,mink,minkpp,reference
[ "$2" = new ] && ATT=loss,zlib,mink,minkpp,reference_diff,reference_ratio
cd $1 && PYTHONPATH=$1 nice -n 10 /work/main/.venv/bin/python -m app.cli probe membership \
  --checkpoint $G/step-0000000,$G/step-0001000 --tasks attacks,layers --attacks $ATT --reference $REF \
  --n-examples 1000 --n-boot 1000 --threads 1 --name mia-remeasure-$2
