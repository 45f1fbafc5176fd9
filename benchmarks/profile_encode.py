"""CPU time of `ModelHandle._encode` (tokenisation + word alignment) over 1,503 EWT sentences in chunks of
32 (best of 5), and a sha256 of its outputs, to compare two trees: PYTHONPATH=TREE python
benchmarks/profile_encode.py TREE (needs sentence-transformers/all-MiniLM-L6-v2 in the HF cache)."""
import resource, sys, numpy as np
from workbench.running.models import ModelHandle
from workbench.data.conllu import load_treebank
h = ModelHandle.load("sentence-transformers/all-MiniLM-L6-v2")
sents = [s.words for s in load_treebank("en_ewt", "train")[:1500]] + [[], ["\u00ad"], ["a", "\u200b", "b"]]
def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
best = 9
for _ in range(5):
    t = cpu()
    for i in range(0, len(sents), 32): out = h._encode(sents[i:i+32], count=False)
    best = min(best, cpu() - t)
encs = h._encode(sents, count=False)
import hashlib
d = hashlib.sha256()
for e in encs: d.update(np.ascontiguousarray(e.ids).tobytes()); d.update(np.ascontiguousarray(e.first).tobytes()); d.update(np.ascontiguousarray(e.last).tobytes()); d.update(np.ascontiguousarray(e.own).tobytes())
print(sys.argv[1], f"_encode CPU {best:.3f}s", d.hexdigest()[:16])
