"""Model-free TF-IDF + LR control on dumped samples: the old random-passage split (membership.py before
issue 26: half of each group's passages at random, seeded) vs the split by document (grouped_split)."""
import json, sys
import numpy as np
from probes.membership import attacks as ma
from probes.core.statistics import auc_bootstrap

def main(paths: list[str]) -> None:
    for path in paths:
        samples = json.load(open(path))
        res = {"passage": [], "document": []}
        for seed, s in samples.items():
            seed = int(seed)
            y = np.array(s["is_member"]); docs = np.array(s["doc_ids"])
            rng = np.random.default_rng(seed)  # the old layer_probe_rows split, verbatim
            old = np.zeros(len(y), bool)
            for cls in (0, 1):
                idx = rng.permutation(np.nonzero(y == cls)[0]); old[idx[: len(idx) // 2]] = True
            new = ma.grouped_split(docs, y, seed)
            for name, train in (("passage", old), ("document", new)):
                sc = ma.tfidf_control_scores(s["texts"], y, train, seed=seed)
                a, lo, hi = auc_bootstrap(sc, y[~train], units=docs[~train], n_boot=1000, seed=seed)
                _, plo, phi = auc_bootstrap(sc, y[~train], units=None, n_boot=1000, seed=seed)
                res[name].append(a)
                print(f"{path} seed {seed} split by {name:8s}: AUC {a:.3f} doc-CI [{lo:.3f}, {hi:.3f}] passage-CI [{plo:.3f}, {phi:.3f}]"
                      f" docs m/n {len(set(docs[y])) }/{len(set(docs[~y]))}")
        for name, v in res.items():
            print(f"{path}: split by {name}: mean AUC {np.mean(v):.3f} over {len(v)} seeds ({', '.join(f'{x:.3f}' for x in v)})")


if __name__ == "__main__":
    main(sys.argv[1:])
