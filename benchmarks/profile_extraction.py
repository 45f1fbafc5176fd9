"""Where extraction's CPU time goes (issue 30): the bare forward, tokenisation alone, word_states
without writes and the whole `extract`, each in getrusage user + sys time, best of $R repetitions.
Usage: N=1500 R=3 python benchmarks/profile_extraction.py   (run from the repository root)"""
import os, sys, time, tempfile, resource
sys.path.insert(0, "benchmarks")
import torch
torch.set_num_threads(1)
import numpy as np
from bench_extraction import build_random_bert, _bare_batches, run_bare
from workbench.activations import extract

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([r.ru_utime, r.ru_stime, time.perf_counter()])

handle, train = build_random_bert()
sents = [s for s in train[:int(os.environ.get("N", 1500))] if s]
batches, tokens = _bare_batches(handle, sents, 32)
run_bare(handle.model, batches[:2])
list(handle.word_states(sents[:64]))
res = {}
def keep(name, d):
    res[name] = np.minimum(res.get(name, d), d)
for rep in range(int(os.environ.get("R", 3))):
    t = cpu(); run_bare(handle.model, batches); keep("bare", cpu() - t)
    t = cpu(); handle._encode(sents, count=False); keep("encode all", cpu() - t)
    t = cpu()
    for _ in handle.word_states(sents, batch_size=32, chunk_size=32): pass
    keep("word_states (no writes)", cpu() - t)
    with tempfile.TemporaryDirectory() as d:
        t = cpu(); extract(handle, sents, "b", batch_size=32, cache_dir=d, progress=False); keep("extract", cpu() - t)
    print(rep, {k: " ".join(f"{x:.2f}" for x in v) for k, v in res.items()}, flush=True)
b = res["bare"][:2].sum()
for k, v in res.items():
    print(f"{k:28s} user {v[0]:.2f} sys {v[1]:.2f} cpu {v[:2].sum():.2f} wall {v[2]:.2f}  cpu vs bare {100*(v[:2].sum()/b-1):+.1f}%")
