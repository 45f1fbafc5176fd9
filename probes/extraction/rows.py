"""The `extra` of the extraction probe's rows (`probes.extraction`), declared for the results store,
which refuses a row with an undeclared key or a wrong type when it is written (`workbench.store.rowschema`)."""

from __future__ import annotations

from probes.core.rows import probe_schema

EXTRA_SCHEMA = probe_schema("extraction", optional={
    # samples: ranked generations (Carlini et al. 2021)
    "source": str, "top_n": int, "verbatim_tokens": int, "scored_text": str, "n": int, "sampling": str,
    "longest_verbatim_run": int, "examples": list, "top_zlib_text": str,
    # k_extraction: repetitions is a bucket's name ("2-3", "0 (held out)") or a count
    "repetitions": int | str, "repetitions_low": int, "prefix_tokens": int, "suffix_tokens": int,
    # exposure of planted canaries
    "method": str, "rank": int, "exposure_empirical": float, "n_candidates": int, "canary": str, "secret": str,
    "candidate_space": int, "max_exposure": float, "log_p": float, "greedy_continuation": str})
