# an old-code checkpoint (no corpus_recipe in its manifest) copied alone, probed by the new code: rebuilt from its corpus record
set -e
rm -rf /tmp/mia/alone && mkdir -p /tmp/mia/alone && cp -r /tmp/runs-membership/train/gpt_tiny_6src/seed-0/step-0001000 /tmp/mia/alone/ckpt
export BERTOLOGY_RUNS=/tmp/mia/alone/runs HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
cd /work/wt-membership && PYTHONPATH=. nice -n 10 /work/main/.venv/bin/python -c "
from probes import membership as mem
c, p = mem.corpus_of('/tmp/mia/alone/ckpt'); print('rebuilt', p)
from workbench.data.corpus import CorpusSplit
import glob; o = CorpusSplit.load(glob.glob('/tmp/runs-membership/cache/corpus/*/')[0])
print('same doc ids:', all(c.doc_ids(s) == o.doc_ids(s) for s in ('train','heldout')), len(c.doc_ids('heldout')))
"
