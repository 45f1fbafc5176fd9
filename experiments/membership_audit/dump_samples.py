"""Dump the membership probe's default pretrain sample (texts, documents, labels) for 5 seeds, with
whichever code is on PYTHONPATH (main's or the worktree's): sampling is compared like for like."""
import json, sys
from probes import membership as mem
from workbench.running.models import ModelHandle

ckpt, out = sys.argv[1], sys.argv[2]
handle = ModelHandle.load(ckpt)
samples = {}
for seed in range(5):
    s = mem.pretrain_sample(ckpt, seed=seed, fits=lambda t: mem.fits_window(handle, t))
    samples[seed] = {"texts": s.texts, "doc_ids": s.doc_ids, "is_member": s.is_member.tolist()}
json.dump(samples, open(out, "w"))
