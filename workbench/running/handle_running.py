"""Forward passes of a `ModelHandle` over pre-split words: `forward` (raw states of one batch) and
`word_states` (every layer pooled to words, `workbench.running.word_pooling`), both through the model's
`workbench.running.ModelRunner`.

`WordForwards` is the part of `ModelHandle` (`workbench.running.models`, whose module docstring states the
conventions) that runs the model; it reads the attributes the handle's constructor sets (model,
runner, words, stacks, read_prefix, max_length, compute_dtype, stats, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from workbench.running import word_pooling
from workbench.data.fake_language import separate_position_ids
from workbench.errors import WorkbenchError
from workbench.precision import autocast
from workbench.running.word_alignment import WordBatch, decoder_inputs, first_not_none
from workbench.running.word_pooling import POOLINGS


@dataclass
class ForwardOutput:
    """Raw states of one batch, per stack. `hidden_states[stack]` = L+1 tensors [B, T, H];
    `attentions[stack]` = L tensors [B, heads, T, T] (self-attention), `cross_attentions` for the
    decoder of an encoder-decoder; `word_ids[stack]` aligns positions of that stack to words
    (the decoder of an encoder-decoder is one position to the right of the encoder)."""

    batch: WordBatch
    hidden_states: dict[str, tuple[torch.Tensor, ...]]
    word_ids: dict[str, torch.Tensor]
    attentions: dict[str, tuple[torch.Tensor, ...]] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    decoder_input_ids: torch.Tensor | None = None


class WordForwards:
    """`ModelHandle`'s forward passes (module docstring)."""

    def run_inputs(self, ids: torch.Tensor, mask: torch.Tensor, stacks: Sequence[str]) -> tuple[torch.Tensor, dict, dict]:
        """(ids, model kwargs, decoder kwargs) of a body run of `stacks`: ELMo's characters, the
        teacher-forced decoder input of an encoder-decoder, a fake-language model's positions."""
        kw, dec = {}, {}
        if self.reads_characters:
            ids, kw["char_ids"] = self.words.characters(ids)
        if len(self.stacks) == 2:
            if "decoder" in stacks:
                start = first_not_none(getattr(self.config, "decoder_start_token_id", None), self.pad_id)
                dec["decoder_input_ids"], dec["decoder_attention_mask"] = decoder_inputs(
                    ids, mask, start, self.pad_id, grows=not self._suffix)
        elif self._shifted_vocabulary is not None:
            kw["position_ids"] = separate_position_ids(ids, mask, None, self._shifted_vocabulary,
                                                       self.shifted_position_offset)
        return ids, kw, dec

    def run_ids(self, ids: torch.Tensor, mask: torch.Tensor, stacks: Sequence[str], attentions: bool = False) -> dict:
        """One forward (no LM head) through the runner: {stack: (hidden_states, attentions)}, the
        decoder's cross-attentions ("cross") and teacher-forced input ("decoder_input_ids")."""
        if attentions:
            self._ensure_eager()
        ids, kw, dec = self.run_inputs(ids, mask, stacks)
        ran = [s for s in self.stacks if s == "encoder" or "decoder" in stacks]
        names = [n for s in ran for n in self._stack_names(s, attentions)]
        with torch.inference_mode(), autocast(self.compute_dtype, self.device):
            run = self.runner.run(ids, mask, names=names, **dec, **kw)
        out: dict = {s: (run.cache.layers(s), run.cache.patterns(s) if attentions else None) for s in ran}
        if "decoder_input_ids" in dec:
            out["cross"] = run.cache.patterns("decoder", cross=True) if attentions else None
            out["decoder_input_ids"] = dec["decoder_input_ids"]
        if self.compute_dtype != "fp32":  # what leaves the handle is fp32 (a no-op for fp32 tensors)
            for key in ("encoder", "decoder"):
                if key in out:
                    out[key] = tuple(None if x is None else tuple(t.float() for t in x) for x in out[key])
            if out.get("cross") is not None:
                out["cross"] = tuple(t.float() for t in out["cross"])
        return out

    _run = run_ids

    def _stack_names(self, stack: str, attentions: bool) -> list[str]:
        """The runner's names of a stack's layers (and attention patterns)."""
        names = self.runner.layer_names(stack)
        if attentions:
            names += self.runner.pattern_names(stack)
            if stack == "decoder" and len(self.stacks) == 2:
                names += self.runner.pattern_names(stack, cross=True)
        return names

    def _ensure_eager(self) -> None:
        if getattr(self.config, "_attn_implementation", "eager") != "eager":
            try:
                self.model.set_attn_implementation("eager")
            except Exception as e:  # pragma: no cover - depends on the model class
                raise WorkbenchError(f"{self.path}: cannot switch to eager attention ({e}); "
                                     f"load with attentions=True") from e

    def forward(self, sentences: Sequence[Sequence[str]], stack: str | None = None, attentions: bool = False,
                truncate: bool = False) -> ForwardOutput:
        """Raw hidden states (and attentions) of one batch, all stacks unless `stack` is given.

        No windowing here: a sentence longer than `max_length` raises ValueError, or with
        `truncate=True` is cut (the tokens cut are counted in `stats["truncated_tokens"]`).
        Use `word_states` for long text."""
        if not len(sentences):
            raise ValueError("forward needs at least one sentence")
        stacks = self._stacks(stack) if stack is not None else self.stacks
        self.model.eval()
        batch = self._read_batch(sentences, truncate)
        out = self.run_ids(batch.input_ids, batch.attention_mask, stacks, attentions)
        if self.reads_characters:
            batch.input_ids = self.words.characters(batch.input_ids)[0]
        word_ids = {}
        for s in stacks:
            if s == "decoder" and "encoder" in self.stacks:
                T = out["decoder_input_ids"].shape[1]
                w = torch.full((batch.word_ids.shape[0], T), -1, dtype=torch.long, device=self.device)
                w[:, 1: batch.word_ids.shape[1] + 1] = batch.word_ids[:, : T - 1]
                word_ids[s] = w
            else:
                word_ids[s] = batch.word_ids
        return ForwardOutput(
            batch=batch,
            hidden_states={s: out[s][0] for s in stacks},
            word_ids=word_ids,
            attentions={s: out[s][1] for s in stacks} if attentions else None,
            cross_attentions=out.get("cross") if attentions else None,
            decoder_input_ids=out.get("decoder_input_ids"),
        )

    def _read_batch(self, sentences: Sequence[Sequence[str]], truncate: bool) -> WordBatch:
        """The batch `forward` runs: a sentence over `max_length` tokens is a ValueError, or cut."""
        batch = self.words.word_batch(sentences, self.read_prefix)
        lengths = batch.attention_mask.sum(1)
        too_long = (lengths > self.max_length).nonzero().flatten().tolist()
        if too_long:
            if not truncate:
                raise ValueError(f"sentences {too_long[:10]} exceed max_length={self.max_length} tokens; "
                                 f"use word_states (sliding windows) or truncate=True")
            batch, cut = self.words.truncate(batch, self.max_length)
            self.stats["truncated_tokens"] += cut
        return batch

    def run_with_cache(self, sentences: Sequence[Sequence[str]], names: Sequence[str] | str = "all",
                       truncate: bool = False):
        """(batch, cache): one batch of pre-split words run as `forward` runs it (prefix, special
        tokens, every stack, a decoder fed the sentence), caching the activation points `names`
        (`ModelRunner.hook_names`; "all": every point), as TransformerLens's `run_with_cache`. The
        batch's `word_ids` align each position to its word (-1: a special token). Tensors are fp32."""
        if not len(sentences):
            raise ValueError("run_with_cache needs at least one sentence")
        self.model.eval()
        wanted = self.runner.hook_names() if isinstance(names, str) and names == "all" else names
        if isinstance(wanted, str) or any(n.endswith("pattern") for n in wanted):
            self._ensure_eager()  # sdpa returns no attention probabilities
        batch = self._read_batch(sentences, truncate)
        ids, kw, dec = self.run_inputs(batch.input_ids, batch.attention_mask, self.stacks)
        with torch.inference_mode(), autocast(self.compute_dtype, self.device):
            run = self.runner.run(ids, batch.attention_mask, names=names, **dec, **kw)
        run.cache.tensors = {k: v.float() for k, v in run.cache.tensors.items()}
        return batch, run.cache

    def _stacks(self, stack: str | None) -> tuple[str, ...]:
        if stack is None:
            return (self.stacks[0],)
        if stack not in self.stacks:
            raise ValueError(f"stack {stack!r} not in this model's stacks {self.stacks}")
        return (stack,)

    # ------------------------------------------------------------------ word states

    def word_states(self, sentences: Sequence[Sequence[str]], pooling: str = "first", stack: str | None = None,
                    batch_size: int = 32, chunk_size: int | None = None, stride: int | None = None,
                    progress: bool = False) -> Iterator[np.ndarray]:
        """Yield one float32 array [L+1, n_words, H] per sentence, in input order (a view into its
        batch's pooled array, not necessarily contiguous: copy it to keep it apart).

        Subwords are pooled to words by `pooling` ("first", "mean" or "last" piece). `stack`
        defaults to the first stack ("encoder" for encoder-decoders). Sentences are taken in chunks
        of `chunk_size` (default 8 batches), sorted by length within the chunk so that batches pad
        little, and restored to input order. A sentence longer than `max_length` is split into
        windows of `max_length` tokens (special tokens included) whose starts are `stride` content
        tokens apart (default half a window); each word is read from the window that gives it most
        context (`choose_windows`). Counts go to `stats`: sentences, words, empty_sentences,
        windowed_sentences, windows, no_subword_words, words_cut_by_window. (`workbench.running.word_pooling`)
        """
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        (stack,) = self._stacks(stack)
        yield from word_pooling.word_states(self, sentences, pooling, stack, batch_size, chunk_size, stride, progress)
