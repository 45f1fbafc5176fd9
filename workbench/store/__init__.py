"""Where results live and what names them.

- `results`: the results store (one row schema; parquet shards + a catalog; atomic appends from
  concurrent writers) and the run manifests beside it (`manifest`).
- `checkpoints`: a checkpoint folder's files, lineage and validation; `identity`: every hash
  (weights, files, checkpoints, tokenizers) with one cache.
- `rowschema`: the declared `extra` keys of each probe and driver, checked at write time;
  `aggregate`: the one seed statistic every page and figure uses.
"""
