"""The corpus builder: named raw sources -> a recorded, seeded, document-level train/held-out split.

The manifest is the ground truth of membership (which documents a model trained on saw), as a
membership-inference experiment needs (Shokri et al., 2017; Carlini et al., 2021): it lists the
doc ids of each split, the seed and fraction, the sha256 of every source file, and counts.

Splitting is per source (stratified): source s's documents are permuted by a generator seeded
with (seed, crc32(s)) and the first round(fraction * n_s) (half up) are held out. So every source appears in
both splits in proportion, and adding a source does not change the split of the others.
The manifest has no timestamp: the same sources, seed and data give byte-identical files, so a
tokenised-corpus cache can key on the manifest's hash.

Recipes (how a manifest says which split it is; `corpus_recipe` records one in a checkpoint):
- recipe 1 (manifests without a "recipe" key, every corpus built before 2026-11-26): documents as
  `workbench.data.raw` defines them, split per source as above. A webtext document is a whole file
  (6 files), so the held-out split holds one file out and every webtext non-member of a membership
  sample comes from it (issue 26's audit).
- recipe 2 ("recipe": 2 in the manifest): the same, except that sources whose documents are whole
  files of independent lines (`BLOCK_LINES`: webtext's forum posts, personal ads, reviews, quotes,
  scripts) are cut into blocks of consecutive lines, and those blocks are held out per file
  (stratum `<source>/<file>`, generator seeded with (seed, crc32 of the file's document id)): every
  file is in both splits, and a held-out webtext passage can come from any of them.
Recipe 1 stays the default of `build_corpus` (existing configs keep their splits and weights);
recipe 2 is asked for by name.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.data.canaries import insert_canaries, spec_record, validate_spec
from workbench.data.fake_language import base_source, is_shifted, shifted_documents
from workbench.data.raw import LANGUAGE, RAW_CORPORA, Document, count_words, load_documents, source_files
from workbench.errors import ConfigError, DataFormatError
from workbench.io import atomic_dir, sha256_file
from workbench.paths import data_root
from workbench.progress import progress

SPLITS = ("train", "heldout")
MANIFEST_FORMAT = 1
RECIPES = (1, 2)
BLOCK_LINES = {"webtext": 20}  # recipe 2: lines per document block of a whole-file source

# English raw text for pretraining. EWT and GUM raw text (`ewt_raw`, `gum_raw`) are left out on
# purpose: the syntax and coreference probes are scored on those treebanks, and probing a model
# on sentences it was pretrained on measures memorisation as much as what it learned. Pass
# `include_probe_text=True` (or name the sources) when a study wants that overlap.
PRETRAINING_SOURCES = ("brown", "abc", "webtext", "state_union", "inaugural", "wikitext2")
PROBE_TEXT_SOURCES = ("ewt_raw", "gum_raw")


def default_pretraining_sources(include_probe_text: bool = False) -> list[str]:
    """The English pretraining sources (about 3.1M words); see PRETRAINING_SOURCES for why
    EWT/GUM raw text is excluded unless asked for."""
    return list(PRETRAINING_SOURCES) + (list(PROBE_TEXT_SOURCES) if include_probe_text else [])


def text_counts(docs: list[Document]) -> dict[str, int]:
    """Documents, lines, characters and words (`count_words`) of `docs`: a corpus manifest's counts."""
    return {
        "documents": len(docs),
        "lines": sum(d.text.count("\n") + 1 for d in docs if d.text),
        "characters": sum(len(d.text) for d in docs),
        "words": sum(count_words(d.text) for d in docs),
    }


# The split method texts of `build_corpus`: a corpus manifest with one can be rebuilt from the data
# root by its recipe; shadow-set corpora (workbench.drivers.shadows) record other methods.
_RECIPE_1_METHOD = ("per source: permutation by numpy default_rng([seed, crc32(source)]); "
                    "first round(fraction * n) held out")
_RECIPE_2_METHOD = ("per source, and per file of a source in block_lines (its files cut into blocks of that many "
                    "lines, ids <file doc id>#k): permutation by numpy default_rng([seed, crc32(source or file doc id)]); "
                    "first round(fraction * n) held out")


def split_documents(
    source: str, docs: list[Document], heldout_fraction: float, seed: int, max_documents: int | None = None
) -> tuple[list[Document], list[Document]]:
    """(train, heldout) of one source's documents, both in their original order."""
    rng = np.random.default_rng([seed, zlib.crc32(source.encode())])
    order = rng.permutation(len(docs))
    if max_documents is not None:
        order = order[:max_documents]
    n_held = int(np.floor(heldout_fraction * len(order) + 0.5))  # round half up
    held = set(order[:n_held].tolist())
    keep = set(order.tolist())
    train = [d for i, d in enumerate(docs) if i in keep and i not in held]
    heldout = [d for i, d in enumerate(docs) if i in held]
    return train, heldout


def line_blocks(doc: Document, n_lines: int) -> list[Document]:
    """A document cut into consecutive blocks of `n_lines` lines (recipe 2), ids `<doc id>#<k>` (k from 1)."""
    lines = doc.text.split("\n")
    return [Document(f"{doc.doc_id}#{k // n_lines + 1:04d}", doc.source, "\n".join(lines[k: k + n_lines]))
            for k in range(0, len(lines), n_lines)]


def split_source(source: str, docs: list[Document], heldout_fraction: float, seed: int,
                 max_documents: int | None, recipe: int) -> tuple[list[Document], list[Document]]:
    """(train, heldout) of one source by the recipe (module docstring); recipe 2 cuts the documents of a
    `BLOCK_LINES` source into blocks and splits each file's blocks on their own (max_documents: per file)."""
    n_lines = BLOCK_LINES.get(base_source(source)) if recipe == 2 else None
    if n_lines is None:
        return split_documents(source, docs, heldout_fraction, seed, max_documents)
    train, held = [], []
    for doc in docs:
        t, h = split_documents(doc.doc_id, line_blocks(doc, n_lines), heldout_fraction, seed, max_documents)
        train += t
        held += h
    return train, held


def build_corpus(
    sources: list[str],
    out_dir: str | Path,
    heldout_fraction: float = 0.1,
    seed: int = 0,
    max_documents: int | None = None,
    recipe: int = 1,
    canaries: dict | None = None,
) -> "CorpusSplit":
    """Write out_dir/{train,heldout}.jsonl ({"doc_id", "source", "text"} per line) and
    out_dir/manifest.json, atomically (a crash leaves no half-built corpus).

    `max_documents` caps the documents taken from each source (a seeded sample, before the
    split), for small experiments and tests. `recipe`: 1 (documents as the sources define them) or
    2 (whole-file sources held out by blocks of lines, per file); see the module docstring.
    `canaries`: a canary spec (`workbench.data.canaries`): random secrets inserted into the train
    split with chosen repetition counts, recorded under the manifest's "canaries" (absent otherwise).
    """
    if recipe not in RECIPES:
        raise ConfigError(f"unknown corpus recipe {recipe!r}; known: {list(RECIPES)}")
    if not sources:
        raise ConfigError("build_corpus needs at least one source")
    # `shifted:<name>`: the fake-language copy of a raw corpus (K et al. 2020; workbench.data.fake_language)
    unknown = [s for s in sources if base_source(s) not in RAW_CORPORA]
    if unknown:
        raise ConfigError(f"unknown corpus sources {unknown}; known: {sorted(RAW_CORPORA)}")
    if len(set(sources)) != len(sources):
        raise ConfigError(f"a source is named twice in {sources}")
    if not 0.0 <= heldout_fraction < 1.0:
        raise ConfigError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    if max_documents is not None and max_documents < 1:
        raise ConfigError(f"max_documents must be positive, got {max_documents}")
    if canaries is not None:
        validate_spec(canaries)

    root = data_root()
    splits: dict[str, list[Document]] = {"train": [], "heldout": []}
    by_source: dict[str, dict] = {}
    checksums: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for source in progress(sources, desc="corpus sources", unit="source"):
        docs = shifted_documents(source) if is_shifted(source) else load_documents(source)
        dup = [d.doc_id for d in docs if d.doc_id in seen]
        if dup or len({d.doc_id for d in docs}) != len(docs):
            raise DataFormatError(source, None, f"duplicate document ids, e.g. {dup[:3]}")
        seen.update(d.doc_id for d in docs)
        train, held = split_source(source, docs, heldout_fraction, seed, max_documents, recipe)
        splits["train"] += train
        splits["heldout"] += held
        by_source[source] = {"train": text_counts(train), "heldout": text_counts(held), "language": LANGUAGE[base_source(source)] + ("-shifted" if is_shifted(source) else "")}
        checksums[source] = {str(p.relative_to(root)): sha256_file(p) for p in source_files(base_source(source))}

    planted = None
    if canaries is not None:
        splits["train"], planted = insert_canaries(splits["train"], canaries)
    manifest = {
        "format": MANIFEST_FORMAT,
        "sources": list(sources),
        "seed": seed,
        "heldout_fraction": heldout_fraction,
        "max_documents": max_documents,
        "split_method": _RECIPE_1_METHOD if recipe == 1 else _RECIPE_2_METHOD,
        "doc_ids": {name: [d.doc_id for d in docs] for name, docs in splits.items()},
        "source_files": checksums,
        "counts": {name: text_counts(docs) for name, docs in splits.items()} | {"by_source": by_source},
    }
    if recipe != 1:  # recipe 1's manifest stays byte-identical to the one built before recipes were numbered
        manifest["recipe"] = recipe
        manifest["block_lines"] = {s: BLOCK_LINES[base_source(s)] for s in sources if base_source(s) in BLOCK_LINES}
    if planted is not None:  # absent without canaries: every manifest built before them stays byte-identical
        manifest["canaries"] = spec_record(canaries, planted)
    return write_corpus(out_dir, splits, manifest)


def write_corpus(out_dir: str | Path, splits: dict[str, list[Document]], manifest: dict) -> CorpusSplit:
    """Write a corpus folder: one `<split>.jsonl` per split ({"doc_id", "source", "text"} per line)
    and `manifest.json`, atomically; returns it loaded. `build_corpus` and the shadow sets of
    `workbench.drivers.shadows` both write through here, so every corpus folder has one format."""
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        for name, docs in splits.items():
            lines = (json.dumps({"doc_id": d.doc_id, "source": d.source, "text": d.text}, ensure_ascii=False) for d in docs)
            (tmp / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return CorpusSplit.load(out_dir)


@dataclass
class CorpusSplit:
    """A built corpus folder: `manifest` (dict), `documents(split)`, `doc_ids(split)`."""

    dir: Path
    manifest: dict

    @classmethod
    def load(cls, dir: str | Path) -> "CorpusSplit":
        dir = Path(dir)
        path = dir / "manifest.json"
        if not path.is_file():
            raise DataFormatError(path, None, "not a corpus folder: manifest.json is missing")
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataFormatError(path, e.lineno, f"invalid JSON: {e.msg}") from None
        for key in ("sources", "seed", "heldout_fraction", "doc_ids", "source_files", "counts"):
            if key not in manifest:
                raise DataFormatError(path, None, f"manifest has no {key!r}")
        return cls(dir, manifest)

    def doc_ids(self, split: str) -> list[str]:
        self._check_split(split)
        return list(self.manifest["doc_ids"][split])

    def documents(self, split: str) -> list[Document]:
        """The documents of `split`, checked against the manifest's doc ids (same ids, same order)."""
        self._check_split(split)
        path = self.dir / f"{split}.jsonl"
        expected = self.manifest["doc_ids"][split]
        docs = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                try:
                    obj = json.loads(line)
                    doc = Document(obj["doc_id"], obj["source"], obj["text"])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise DataFormatError(path, lineno, f"not a document record: {e}") from None
                if lineno > len(expected) or doc.doc_id != expected[lineno - 1]:
                    raise DataFormatError(path, lineno, f"document {doc.doc_id!r} is not the manifest's entry {lineno}")
                docs.append(doc)
        if len(docs) != len(expected):
            raise DataFormatError(path, len(docs), f"{len(docs)} documents, manifest lists {len(expected)}")
        return docs

    @staticmethod
    def _check_split(split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; splits are {SPLITS}")


def corpus_reference(corpus_dir: str | Path, runs_root: str | Path | None = None) -> dict:
    """How a checkpoint manifest names its corpus: the folder and its manifest.json relative to the
    runs root when they lie inside it (the default, `<runs root>/cache/corpus/...`), else absolute,
    plus the manifest's sha256, so that a runs folder copied to another machine still finds its
    membership ground truth (`resolve_corpus_manifest`)."""
    from workbench.paths import runs_root as default_runs_root

    root = Path(runs_root if runs_root is not None else default_runs_root()).resolve()
    corpus_dir = Path(corpus_dir).resolve()
    manifest = corpus_dir / "manifest.json"

    def portable(path: Path) -> str:
        return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)

    return {"dir": portable(corpus_dir), "manifest": portable(manifest), "manifest_sha256": sha256_file(manifest)}


def resolve_corpus_manifest(checkpoint_dir: str | Path, corpus: dict, runs_root: str | Path | None = None) -> Path:
    """The corpus manifest.json a checkpoint's manifest names (its `corpus` record), checked by sha256.

    A relative path (`corpus_reference`) is looked up under the runs root, then under every folder
    above the checkpoint (a copied runs folder resolves wherever it lies, without configuration);
    an absolute one (older checkpoints, corpora outside the runs root) is taken as it is.
    """
    from workbench.errors import CheckpointError
    from workbench.paths import runs_root as default_runs_root

    checkpoint_dir = Path(checkpoint_dir).resolve()
    name = corpus.get("manifest")
    if not name:
        raise CheckpointError(f"{checkpoint_dir}: the manifest records no corpus manifest")
    recorded = Path(name)
    if recorded.is_absolute():
        candidates = [recorded]
    else:
        root = Path(runs_root if runs_root is not None else default_runs_root()).resolve()
        candidates = [root / recorded, *(parent / recorded for parent in checkpoint_dir.parents)]
    sha = corpus.get("manifest_sha256")
    for path in candidates:
        if path.is_file():
            if sha and sha256_file(path) != sha:
                raise CheckpointError(f"{checkpoint_dir}: corpus manifest {path} does not match the recorded sha256 {sha[:12]}...")
            return path
    raise CheckpointError(f"{checkpoint_dir}: corpus manifest {name} not found (looked under the runs root and the "
                          f"folders above the checkpoint); copy the runs folder with its cache/corpus")


def corpus_recipe(corpus: "CorpusSplit") -> dict | None:
    """What a checkpoint's manifest records to rebuild its training corpus without the corpus folder
    (`rebuild_corpus`): the recipe version, sources, seed, split parameters, the sha256 of every data
    file read and of the corpus manifest itself (the manifest has no timestamp, so a faithful rebuild
    is byte-identical to it). Recipes 1 and 2 are `build_corpus`'s (module docstring); a
    corpus manifest without a "recipe" key is recipe 1 (every manifest written before recipes were numbered). None
    for a corpus `build_corpus` did not make (a shadow set's halves): those travel with their set."""
    m = corpus.manifest
    recipe = m.get("recipe", 1)
    if recipe == 1 and m.get("split_method") != _RECIPE_1_METHOD:
        return None
    out = {"recipe": recipe, "sources": list(m["sources"]), "seed": m["seed"],
           "heldout_fraction": m["heldout_fraction"], "max_documents": m.get("max_documents"),
           "source_files": m["source_files"], "manifest_sha256": sha256_file(corpus.dir / "manifest.json")}
    if m.get("canaries"):
        out["canaries"] = canary_spec(m)
    return out


def canary_spec(manifest: dict) -> dict | None:
    """The canary spec a corpus manifest was built with (its "canaries" record without the items), or None."""
    rec = manifest.get("canaries")
    return None if not rec else validate_spec({k: rec[k] for k in rec if k not in ("items", "candidate_space")})


def verify_source_files(recipe: dict, where: str) -> None:
    """Every data file the recipe read is in the data root with its recorded sha256 (and no file was
    added to a source: it would add documents); else a DataFormatError naming the file."""
    root = data_root()
    for source, files in (recipe.get("source_files") or {}).items():
        present = {str(p.relative_to(root)) for p in source_files(base_source(source))}
        added = sorted(present - set(files))
        if added:
            raise DataFormatError(root / added[0], None, f"not in the corpus recipe of {where} (source {source!r} "
                                  f"has {len(added)} file(s) more than when the model was trained)")
        for rel, sha in sorted(files.items()):
            path = root / rel
            if not path.is_file():
                raise DataFormatError(path, None, f"missing: the corpus recipe of {where} needs it (source {source!r})")
            got = sha256_file(path)
            if got != sha:
                raise DataFormatError(path, None, f"sha256 {got[:12]}... differs from {sha[:12]}... recorded by {where}: "
                                      f"not the data the model was trained on")


def rebuild_corpus(recipe: dict, where: str, out_dir: str | Path | None = None) -> "CorpusSplit":
    """The corpus split a recipe (`corpus_recipe`) describes, rebuilt from the data root into `out_dir`
    (default: the cache, keyed by the recorded manifest's sha256; reused when already there) and
    verified: every data file by its sha256 first, then the rebuilt manifest by the recorded one.
    `where` names the recipe's owner (a checkpoint) in errors."""
    from workbench.errors import CheckpointError
    from workbench.paths import cache_root

    if recipe.get("recipe") not in RECIPES:
        raise CheckpointError(f"{where}: corpus recipe {recipe.get('recipe')!r} is unknown to this version "
                              f"(known: {list(RECIPES)})")
    sha = recipe["manifest_sha256"]
    out = Path(out_dir) if out_dir is not None else cache_root() / "corpus-rebuilt" / sha[:20]
    if not (out / "manifest.json").is_file():
        verify_source_files(recipe, where)
        build_corpus(recipe["sources"], out, heldout_fraction=recipe["heldout_fraction"], seed=recipe["seed"],
                     max_documents=recipe["max_documents"], recipe=recipe["recipe"], canaries=recipe.get("canaries"))
    got = sha256_file(out / "manifest.json")
    if got != sha:
        raise CheckpointError(f"{where}: the corpus rebuilt from its recipe in {out} has manifest sha256 {got[:12]}..., "
                              f"the checkpoint recorded {sha[:12]}...: the split differs")
    return CorpusSplit.load(out)


def checkpoint_corpus(checkpoint_dir: str | Path, manifest: dict, runs_root: str | Path | None = None) -> tuple["CorpusSplit", Path]:
    """(CorpusSplit, its manifest path) of a checkpoint's training corpus: the folder its manifest
    names (`resolve_corpus_manifest`), else, when that is not found (a checkpoint copied alone,
    trained with --output-dir elsewhere), rebuilt from its `corpus_recipe` and verified. A checkpoint
    trained before the recipe was recorded is rebuilt from its `corpus` record (sources, seed, split
    parameters: recipe 1) and verified by the corpus manifest's sha256 alone (which covers the data
    files' hashes too, but cannot name the file that differs)."""
    from workbench.errors import CheckpointError

    try:
        path = resolve_corpus_manifest(checkpoint_dir, manifest["corpus"], runs_root)
        return CorpusSplit.load(path.parent), path
    except CheckpointError as e:
        record = manifest["corpus"]
        recipe = manifest.get("corpus_recipe") or (
            {"recipe": 1, "sources": record["sources"], "seed": record["seed"], "heldout_fraction": record["heldout_fraction"],
             "max_documents": record.get("max_documents"), "source_files": None, "manifest_sha256": record["manifest_sha256"]}
            if all(k in record for k in ("sources", "seed", "heldout_fraction", "manifest_sha256")) else None)
        if "not found" not in str(e) or not recipe:
            raise
    corpus = rebuild_corpus(recipe, str(checkpoint_dir))
    return corpus, corpus.dir / "manifest.json"


def source_sizes(sources: list[str]) -> dict[str, dict[str, int]]:
    """Documents / lines / characters / words of each named source (no split)."""
    return {s: text_counts(load_documents(s)) for s in sources}


def main() -> None:
    """`python -m workbench.data.corpus [SOURCE ...]`: print the size of each source."""
    import sys

    sources = sys.argv[1:] or default_pretraining_sources()
    sizes = source_sizes(sources)
    print(f"{'source':18s} {'documents':>10s} {'lines':>9s} {'words':>10s} {'characters':>12s}")
    for s, c in sizes.items():
        print(f"{s:18s} {c['documents']:10,d} {c['lines']:9,d} {c['words']:10,d} {c['characters']:12,d}")
    total = {k: sum(c[k] for c in sizes.values()) for k in ("documents", "lines", "words", "characters")}
    print(f"{'total':18s} {total['documents']:10,d} {total['lines']:9,d} {total['words']:10,d} {total['characters']:12,d}")


if __name__ == "__main__":
    main()
