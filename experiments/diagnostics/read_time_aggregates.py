"""Evidence for issue 41 (rows per seed only): on prune sweeps written by the code before it (their
`rows.csv` holds the per-seed rows AND the seed-less rows with the mean, 95% t-interval, sd and
`wins`), the statistics computed at read time from the per-seed rows alone
(`workbench.drivers.prune_rows.over_seeds`) equal what was stored, and the printed table
(`format_table`) is the table the old code printed from its stored rows.

    python experiments/diagnostics/read_time_aggregates.py RUNS_OR_ROWS_CSV [...]

Each argument is a rows.csv or a folder searched for */rows.csv. One line per sweep: the number of
stored seed-less rows checked, the largest absolute difference of value / ci_low / ci_high / sd /
sparsity_measured, wins equal or not, printed table identical or not. Exit 1 when anything
differs beyond 1e-12, 2 on a bad argument.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.drivers.prune_rows import format_table, over_seeds

TOL = 1e-12


def old_table(stored: pd.DataFrame) -> str:
    """The table the sweep printed before issue 41: read from its stored seed-less test rows."""
    agg = stored[stored["split"] == "test"]
    lines = [f"{'method':<18} {'amount':>7} {'sparsity':>8} {'test acc':>9} {'sd':>7} {'wins':>5}"]
    wins = {(r["model"], r["extra"]["amount"]): r["value"] for _, r in agg[agg["metric"] == "wins"].iterrows()}
    for _, r in agg[agg["metric"] == "accuracy"].iterrows():
        e, w = r["extra"], wins.get((r["model"], r["extra"]["amount"]))
        lines.append(f"{r['model']:<18} {e['amount']:>7.4g} {e['sparsity_measured']:>8.3f} {r['value']:>9.4f} "
                     f"{e['sd']:>7.4f} {'' if w is None else ('yes' if w else 'no'):>5}")
    return "\n".join(lines)


def check(path: Path) -> tuple[bool, str]:
    rows = pd.read_csv(path)
    rows["extra"] = rows["extra"].map(lambda e: json.loads(e) if isinstance(e, str) and e else {})
    stored = rows[rows["seed"].isna() & rows["extra"].map(lambda e: e.get("over") == "seeds")]
    per_seed = rows[rows["seed"].notna()]
    if stored.empty:
        return True, f"{path}: no stored seed-less rows (written per seed only): nothing to compare"
    worst = dict.fromkeys(("value", "ci_low", "ci_high", "sd", "sparsity_measured"), 0.0)
    wins_equal, n = True, 0
    for split in sorted(set(stored["split"])):
        acc = over_seeds(per_seed, split).set_index(["model", "amount"])
        won = over_seeds(per_seed, split, "wins").set_index(["model", "amount"])["value"]
        for _, r in stored[stored["split"] == split].iterrows():
            key, n = (r["model"], float(r["extra"]["amount"])), n + 1
            if r["metric"] == "wins":
                wins_equal &= key in won.index and float(won[key]) == float(r["value"])
                continue
            got = acc.loc[key]
            want = {"value": r["value"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "sd": r["extra"]["sd"],
                    "sparsity_measured": r["extra"]["sparsity_measured"]}
            for k, v in want.items():
                a, b = float(got[k]), float(v)
                d = 0.0 if (np.isnan(a) and np.isnan(b)) else abs(a - b)
                worst[k] = max(worst[k], d if np.isfinite(d) else np.inf)
    same_table = format_table(per_seed) == old_table(stored)
    ok = max(worst.values()) <= TOL and wins_equal and same_table
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
    return ok, (f"{path}: {n} stored seed-less rows; max |read-time - stored|: {diffs}; wins "
                f"{'equal' if wins_equal else 'DIFFER'}; printed table {'identical' if same_table else 'DIFFERS'}")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: read_time_aggregates.py RUNS_OR_ROWS_CSV [...]", file=sys.stderr)
        return 2
    paths = []
    for a in argv:
        p = Path(a)
        if not p.exists():
            print(f"read_time_aggregates: {a}: no such file or folder", file=sys.stderr)
            return 2
        paths += [p] if p.is_file() else sorted(p.rglob("rows.csv"))
    results = [check(p) for p in paths]
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
