"""`TokenizedCorpus`: a corpus split tokenised once, kept on disk as memory-mapped numpy arrays.

Tokenising a few million words takes longer than a short CPU training run, so every run with the
same tokenizer and corpus split shares one cache folder under `<cache_root>/tokenized/`, keyed by
the tokenizer hash + corpus manifest hash + split. Layout (all written atomically in one folder):

- `ids.npy`: every sentence's token ids WITHOUT special tokens, concatenated (uint16 when the
  vocabulary fits, else int32);
- `sentence_offsets.npy`: int64 [n_sentences + 1], sentence i = ids[off[i]:off[i+1]];
- `document_offsets.npy`: int64 [n_docs + 1] in sentence units, document d = sentences
  doc_off[d]:doc_off[d+1];
- `meta.json`: doc ids, separator id, number of special tokens, tokenizer and corpus hashes;
- word-level tokenizers only (ELMo's closed softmax vocabulary): `unknown_positions.npy` (int64,
  ascending positions in `ids` of the [UNK] tokens), `unknown_word_ids.npy` (int32, per position an
  index into `unknown_words.json`, the distinct spellings), so that the character CNN can read the
  word itself (Peters et al. 2018) while the targets stay [UNK].

A sentence is one non-empty line of a `Document.text` (the corpus builder's contract).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models

from workbench.errors import CheckpointError
from workbench.store.identity import tokenizer_hash
from workbench.io import atomic_dir, sha256_file
from workbench.paths import cache_root
from workbench.progress import progress

CACHE_FORMAT_VERSION = 2  # 2: spellings of unknown words (word-level tokenizers)


def separator_id(tokenizer) -> int:
    """The id that separates documents in a packed stream: sep, else eos; -1 when neither exists."""
    for tok in (tokenizer.sep_token, tokenizer.eos_token):
        if tok is not None:
            return int(tokenizer.convert_tokens_to_ids(tok))
    return -1


class TokenizedCorpus:
    """A memory-mapped tokenised corpus split (see module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.exists():
            raise CheckpointError(f"{self.path} is not a tokenised corpus cache (no meta.json)")
        self.meta = json.loads(meta_path.read_text())
        self.ids = np.load(self.path / "ids.npy", mmap_mode="r")
        self.sentence_offsets = np.load(self.path / "sentence_offsets.npy", mmap_mode="r")
        self.document_offsets = np.load(self.path / "document_offsets.npy", mmap_mode="r")
        self.doc_ids: list[str] = self.meta["doc_ids"]
        self.separator_id: int = int(self.meta["separator_id"])
        self.num_special: int = int(self.meta["num_special"])
        self.split: str = self.meta["split"]
        self._stream: np.ndarray | None = None
        self.has_unknown_words = (self.path / "unknown_words.json").exists()
        if self.has_unknown_words:
            self._unknown_positions = np.load(self.path / "unknown_positions.npy", mmap_mode="r")
            self._unknown_word_ids = np.load(self.path / "unknown_word_ids.npy", mmap_mode="r")
            self._unknown_words: list[str] = json.loads((self.path / "unknown_words.json").read_text(encoding="utf-8"))

    # ---- sizes and access -------------------------------------------------------------------
    @property
    def num_sentences(self) -> int:
        return len(self.sentence_offsets) - 1

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sentence_offsets[-1])

    def __len__(self) -> int:
        return self.num_sentences

    def sentence(self, i: int) -> np.ndarray:
        return np.asarray(self.ids[self.sentence_offsets[i] : self.sentence_offsets[i + 1]], dtype=np.int64)

    def unknown_words(self, i: int) -> list[str | None]:
        """Per token of sentence i, the spelling of a word the vocabulary maps to [UNK], else None."""
        if not self.has_unknown_words:
            raise CheckpointError(f"{self.path}: this cache keeps no unknown-word spellings (not a word-level tokenizer)")
        a, b = int(self.sentence_offsets[i]), int(self.sentence_offsets[i + 1])
        out: list[str | None] = [None] * (b - a)
        lo, hi = np.searchsorted(self._unknown_positions, [a, b])
        for pos, k in zip(self._unknown_positions[lo:hi], self._unknown_word_ids[lo:hi]):
            out[int(pos) - a] = self._unknown_words[int(k)]
        return out

    def document(self, d: int) -> list[np.ndarray]:
        """Document `d` as a list of its sentences' id arrays."""
        return [self.sentence(i) for i in range(int(self.document_offsets[d]), int(self.document_offsets[d + 1]))]

    def document_tokens(self, d: int) -> np.ndarray:
        """Document `d`'s ids as one flat array (its sentences concatenated)."""
        a = self.sentence_offsets[self.document_offsets[d]]
        b = self.sentence_offsets[self.document_offsets[d + 1]]
        return np.asarray(self.ids[a:b], dtype=np.int64)

    def stream_with_separators(self) -> np.ndarray:
        """All ids as one int64 stream, each document followed by `separator_id` (if there is one)."""
        if self._stream is None:
            ids = np.asarray(self.ids, dtype=np.int64)
            if self.separator_id >= 0 and self.num_documents:
                ends = np.asarray(self.sentence_offsets[np.asarray(self.document_offsets[1:])], dtype=np.int64)
                self._stream = np.insert(ids, ends, self.separator_id)
            else:
                self._stream = ids
        return self._stream

    # ---- building ---------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        tokenizer,
        corpus,
        split: str = "train",
        cache_dir: str | Path | None = None,
        batch_lines: int = 4096,
        show_progress: bool = True,
    ) -> "TokenizedCorpus":
        """Tokenise `corpus.documents(split)` (a `CorpusSplit`) with `tokenizer`, or reuse the cache."""
        manifest_sha = sha256_file(Path(corpus.dir) / "manifest.json")
        tok_sha = tokenizer_hash(tokenizer)
        key = hashlib.sha256(f"{CACHE_FORMAT_VERSION}|{tok_sha}|{manifest_sha}|{split}".encode()).hexdigest()[:24]
        folder = Path(cache_dir) if cache_dir is not None else cache_root() / "tokenized"
        path = folder / f"{split}-{key}"
        if (path / "meta.json").exists():
            return cls(path)

        docs = corpus.documents(split)
        lines: list[str] = []
        doc_sentence_counts: list[int] = []
        for doc in docs:
            sents = [ln for ln in doc.text.split("\n") if ln.strip()]
            lines.extend(sents)
            doc_sentence_counts.append(len(sents))

        # A private copy without padding or truncation: a tokenizer called with padding=True
        # keeps that setting on its backend, which would pad every sentence of a batch.
        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.no_truncation()
        dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.int32
        chunks: list[np.ndarray] = []
        lengths = np.zeros(len(lines), dtype=np.int64)
        # word-level vocabularies: keep the spelling behind every [UNK] (offsets index the line)
        spell_unknown = isinstance(backend.model, models.WordLevel) and tokenizer.unk_token_id is not None
        unk_id = tokenizer.unk_token_id
        unknown_positions: list[int] = []
        unknown_word_ids: list[int] = []
        unknown_index: dict[str, int] = {}
        n_seen = 0
        bar = progress(total=len(lines), desc=f"tokenising {split}", unit="sent", disable=not show_progress)
        for start in range(0, len(lines), batch_lines):
            encs = backend.encode_batch(lines[start : start + batch_lines], add_special_tokens=False)
            for j, enc in enumerate(encs):
                lengths[start + j] = len(enc.ids)
                arr = np.asarray(enc.ids, dtype=dtype)
                chunks.append(arr)
                if spell_unknown:
                    for t in np.nonzero(arr == unk_id)[0].tolist():
                        a, b = enc.offsets[t]
                        unknown_positions.append(n_seen + t)
                        unknown_word_ids.append(unknown_index.setdefault(lines[start + j][a:b], len(unknown_index)))
                n_seen += len(arr)
            bar.update(len(encs))
        bar.close()
        ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
        sentence_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        document_offsets = np.concatenate([[0], np.cumsum(doc_sentence_counts)]).astype(np.int64)
        meta = {
            "format": CACHE_FORMAT_VERSION,
            "split": split,
            "doc_ids": [d.doc_id for d in docs],
            "separator_id": separator_id(tokenizer),
            "num_special": int(tokenizer.num_special_tokens_to_add(pair=False)),
            "vocab_size": len(tokenizer),
            "tokenizer_sha256": tok_sha,
            "corpus_dir": str(corpus.dir),
            "corpus_manifest_sha256": manifest_sha,
            "num_tokens": int(sentence_offsets[-1]),
            "num_sentences": len(lines),
            "num_documents": len(docs),
        }
        with atomic_dir(path) as tmp:
            np.save(tmp / "ids.npy", ids)
            np.save(tmp / "sentence_offsets.npy", sentence_offsets)
            np.save(tmp / "document_offsets.npy", document_offsets)
            if spell_unknown:
                np.save(tmp / "unknown_positions.npy", np.asarray(unknown_positions, dtype=np.int64))
                np.save(tmp / "unknown_word_ids.npy", np.asarray(unknown_word_ids, dtype=np.int32))
                (tmp / "unknown_words.json").write_text(json.dumps(list(unknown_index), ensure_ascii=False), encoding="utf-8")
            (tmp / "meta.json").write_text(json.dumps(meta))
        return cls(path)
