"""Dump the membership probe's default pretrain sample (texts, documents, labels) for 5 seeds, with
whichever code is on PYTHONPATH (main's or the worktree's): sampling is compared like for like."""
import json
import os
import sys

from probes import membership as mem
from workbench.running.models import ModelHandle


def main(ckpt: str, out: str) -> None:
    handle = ModelHandle.load(ckpt)
    samples = {}
    for seed in range(5):
        s = mem.pretrain_sample(ckpt, seed=seed, fits=lambda t: mem.fits_window(handle, t))
        samples[seed] = {"texts": s.texts, "doc_ids": s.doc_ids, "is_member": s.is_member.tolist()}
    with open(out + ".tmp", "w") as fh:  # written whole, then renamed (runs against older trees too)
        json.dump(samples, fh)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python experiments/membership_audit/dump_samples.py CHECKPOINT OUT.json")
    main(sys.argv[1], sys.argv[2])
