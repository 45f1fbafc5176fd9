"""Documents behind the default sample (1,000 + 1,000 passages of 32 words, no model window) for
corpus recipe 1 vs 2 on the default 6-source corpus, seed 0; webtext files among the non-members."""
import numpy as np
from probes import membership as mem
from probes.membership import attacks as ma
from probes.core.statistics import auc_bootstrap
from workbench.data.corpus import build_corpus, default_pretraining_sources

def main() -> None:
    for recipe in (1, 2):
        c = build_corpus(default_pretraining_sources(), f"/tmp/mia/corpus-r{recipe}", recipe=recipe)
        s = mem.pretrain_sample(None, corpus_dir=c.dir, seed=0)
        docs = np.array(s.doc_ids); y = s.is_member
        web = sorted({d.split("#")[0] for d in docs[~y] if d.startswith("webtext/")})
        print(f"recipe {recipe}: cap {s.info.get('passages_per_document_cap')}, held-out documents {len(c.doc_ids('heldout'))}, sample documents {s.info['documents_per_group']}, "
              f"webtext non-member passages {sum(d.startswith('webtext/') for d in docs[~y])} from files {web}")
        aucs = []
        for seed in range(5):
            s = mem.pretrain_sample(None, corpus_dir=c.dir, seed=seed)
            docs = np.array(s.doc_ids); y = s.is_member
            train = ma.grouped_split(docs, y, seed)
            a, lo, hi = auc_bootstrap(ma.tfidf_control_scores(s.texts, y, train, seed), y[~train], units=docs[~train], seed=seed)
            aucs.append(a); print(f"  seed {seed}: TF-IDF control, split by document: {a:.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"  mean {np.mean(aucs):.3f}")


if __name__ == "__main__":
    main()
