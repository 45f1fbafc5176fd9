"""Where extraction's CPU time goes (issue 30): the bare forward, tokenisation alone, word_states
without writes and the whole `extract`, each in getrusage user + sys time, best of $R repetitions;
for `extract` also the main thread's own time and page faults (RUSAGE_THREAD), so what the
tokenizer and writer threads add shows apart from what the forward pass' thread spends.
On a GPU (DEVICE=cuda; LAYERS/HIDDEN set the random BERT, default 4 x 256) the host's time is the
question: PROFILE=1 adds a cProfile of one `extract`, its top functions by own time.
Usage: N=1500 R=3 [DEVICE=cuda LAYERS=12 HIDDEN=768 PROFILE=1] python benchmarks/profile_extraction.py
(run from the repository root)"""
import cProfile, io, os, pstats, resource, sys, tempfile, time
sys.path.insert(0, "benchmarks")
import torch
torch.set_num_threads(1)
import numpy as np
from bench_extraction import build_random_bert, bare_batches, run_bare
from workbench.activations import extract

def cpu(who=resource.RUSAGE_SELF):
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()
    r = resource.getrusage(who)
    return np.array([r.ru_utime, r.ru_stime, time.perf_counter(), r.ru_minflt])

DEVICE = os.environ.get("DEVICE", "cpu")
handle, train = build_random_bert(int(os.environ.get("LAYERS", 4)), int(os.environ.get("HIDDEN", 256)), device=DEVICE)
sents = [s for s in train[:int(os.environ.get("N", 1500))] if s]
batches, tokens = bare_batches(handle, sents, 32)
run_bare(handle.model, batches[:2])
list(handle.word_states(sents[:64]))
res, faults = {}, {}
def keep(name, d):  # best time of the repetitions; page faults: every repetition's, the median printed
    res[name] = np.minimum(res.get(name, d), d)
    faults.setdefault(name, []).append(d[3])
by_length = sorted(sents, key=len, reverse=True)  # extract's batch order (longest first), so word_states pads alike
for rep in range(int(os.environ.get("R", 3))):
    t = cpu(); run_bare(handle.model, batches); keep("bare", cpu() - t)
    t = cpu(); handle._encode(sents, count=False); keep("encode all", cpu() - t)
    t = cpu()
    for _ in handle.word_states(by_length, batch_size=32, chunk_size=32): pass
    keep("word_states (no writes)", cpu() - t)
    with tempfile.TemporaryDirectory() as d:
        t, m = cpu(), cpu(resource.RUSAGE_THREAD)
        extract(handle, sents, "b", batch_size=32, cache_dir=d, progress=False)
        keep("extract", cpu() - t)
        keep("extract: main thread", cpu(resource.RUSAGE_THREAD) - m)
    print(rep, {k: " ".join(f"{x:.2f}" for x in v[:3]) for k, v in res.items()}, flush=True)
b = res["bare"][:2].sum()
for k, v in res.items():
    print(f"{k:28s} user {v[0]:.2f} sys {v[1]:.2f} cpu {v[:2].sum():.2f} wall {v[2]:.2f} minor faults {np.median(faults[k]):.0f}  "
          f"cpu vs bare {100*(v[:2].sum()/b-1):+.1f}%")
if os.environ.get("PROFILE"):
    with tempfile.TemporaryDirectory() as d:
        prof = cProfile.Profile()
        prof.enable()
        extract(handle, sents, "b", batch_size=32, cache_dir=d, progress=False)
        if DEVICE.startswith("cuda"):
            torch.cuda.synchronize()
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue())
