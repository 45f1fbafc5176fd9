"""Reading a UD treebank: the workbench's own CoNLL-U reader vs the `conllu` package, same file.

`workbench.data.conllu.read_conllu` (a line parser that validates every tree on read) against
`conllu.parse_incr` (the reference the tests cross-check it with; it does not validate trees).
Both read EWT train (12,544 sentences, 204,577 words) from the data root; each side's best of
`--repeats` runs is reported with the ratio. The unit tests check counts and values only; speed
is measured here (it used to be a wall-clock assertion in tests/test_data_conllu.py).

Usage: python benchmarks/bench_conllu.py [--treebank en_ewt] [--split train] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    import conllu  # a dev dependency (pip install -e .[dev])

    from workbench.data.conllu import read_conllu, treebank_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--treebank", default="en_ewt")
    p.add_argument("--split", default="train")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    path = treebank_path(args.treebank, args.split)

    def theirs():
        with open(path, encoding="utf-8") as f:
            return list(conllu.parse_incr(f))

    t_ours, ours_sents = best_of(lambda: read_conllu(path), args.repeats)
    t_theirs, their_sents = best_of(theirs, args.repeats)
    assert len(ours_sents) == len(their_sents), (len(ours_sents), len(their_sents))
    words = sum(len(s.words) for s in ours_sents)
    print(f"{path.name}: {len(ours_sents):,} sentences, {words:,} words (best of {args.repeats})")
    print(f"workbench read_conllu   {t_ours:7.2f} s")
    print(f"conllu.parse_incr       {t_theirs:7.2f} s")
    print(f"ratio (conllu / ours)   {t_theirs / t_ours:7.2f}x")


if __name__ == "__main__":
    main()
