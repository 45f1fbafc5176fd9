"""Text generation with a model's own LM head: greedy, temperature, top-k and nucleus sampling.

One decoding loop for every family that generates, through the head `workbench.running.lm_scores` finds:
- "causal" (GPT): the prompt behind a start token (bos, else eos: the document separator the
  model trained on, as `LMScorer.causal_row` scores), then one token at a time with the key/value
  cache;
- "seq2seq" (T5, BART): the prompt is the encoder input (with the tokenizer's special tokens),
  encoded once; the decoder starts from `decoder_start_token_id` and extends its own output;
- "bilm" (ELMo): the forward LM alone (Peters et al. 2018): `<S>` + prompt, the forward softmax at
  the last position; the LSTM has no cache here, so each step re-reads the sequence (ELMo models
  here are small).
A masked LM, ELECTRA or a bare body has no left-to-right distribution to sample from: asking one to
generate is a ConfigError naming the model.

Sampling (Holtzman et al. 2020 for nucleus): logits / temperature, then top-k keeps the k largest,
top-p keeps the smallest set of tokens whose probability reaches p (the most likely token always
kept), everything else gets probability 0 (`allowed_logits`). Greedy is the argmax (temperature,
top-k and top-p are then ignored). Randomness is one `torch.Generator` seeded by `seed`, drawn on
the CPU so that the same seed gives the same text on any device; prompts are batched by token
length (no padding inside a causal or ELMo batch, so a prompt's continuation does not depend on
its batch-mates, except through float rounding); `max_new_tokens` tokens are always generated
(Carlini et al. 2021 sample fixed-length continuations); the text is decoded up to the first
end-of-sequence token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from workbench.errors import CheckpointError, ConfigError

STRATEGIES = ("greedy", "sample")
GENERATING_KINDS = ("causal", "seq2seq", "bilm")


@dataclass(frozen=True)
class Sampling:
    """How to pick each next token (see the module docstring)."""

    strategy: str = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 50
    seed: int = 0
    batch_size: int = 32

    def validate(self) -> "Sampling":
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"generation strategy must be one of {list(STRATEGIES)}, got {self.strategy!r}")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1 (or unset), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (or unset), got {self.top_p}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError(f"max_new_tokens and batch_size must be >= 1, got {self.max_new_tokens}, {self.batch_size}")
        return self

    def describe(self) -> str:
        if self.strategy == "greedy":
            return "greedy"
        parts = [f"T={self.temperature:g}"] + ([f"top-k={self.top_k}"] if self.top_k else []) + (
            [f"top-p={self.top_p:g}"] if self.top_p is not None and self.top_p < 1 else [])
        return "sample " + " ".join(parts)


@dataclass
class Generation:
    """Per prompt: the prompt's ids as the model read them, the new ids, and the decoded new text."""

    prompt_ids: list[np.ndarray]
    new_ids: list[np.ndarray]
    texts: list[str]
    kind: str


def allowed_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """[B, V] logits / temperature with every token outside the top-k and the nucleus set to -inf."""
    z = logits.float() / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        cum = torch.softmax(sorted_z, -1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_z, -1)) >= top_p  # mass BEFORE a token already reaches p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> torch.Tensor:
    """[B] next ids: argmax, or a draw from the allowed distribution with `generator` (CPU)."""
    if sampling.strategy == "greedy":
        return logits.argmax(-1)
    z = allowed_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    probs = torch.softmax(z, -1).cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


def generator_head(handle):
    """(kind, model) of the head that generates; ConfigError for a model that cannot."""
    from workbench.running.lm_scores import find_lm_head, handle_location

    where = handle_location(handle)
    try:
        kind, model = find_lm_head(handle)
    except CheckpointError as e:
        raise ConfigError(f"{where}: cannot generate: {str(e).removeprefix(where + ': ')}") from None
    if kind not in GENERATING_KINDS:
        raise ConfigError(f"{where}: cannot generate: its LM head is {kind!r} (a masked LM predicts a blank from both "
                          f"sides, not the next token); generation needs a causal LM (GPT), a seq2seq model (T5, "
                          f"BART) or ELMo's forward LM")
    return kind, model.eval()


def can_generate(handle) -> bool:
    try:
        generator_head(handle)
        return True
    except ConfigError:
        return False


def encode_prompts(handle, kind: str, prompts: Sequence[str]) -> list[np.ndarray]:
    """Each prompt's ids as the generating head reads them (module docstring)."""
    tok = handle.tokenizer
    if kind == "causal":
        start = next((i for i in (tok.bos_token_id, tok.eos_token_id) if i is not None), None)
        rows = tok(list(prompts), add_special_tokens=False)["input_ids"]
        return [np.asarray(([start] if start is not None else []) + list(r), dtype=np.int64) for r in rows]
    enc = tok(list(prompts), add_special_tokens=True, return_special_tokens_mask=True)
    out = []
    for ids, special in zip(enc["input_ids"], enc["special_tokens_mask"]):
        if kind == "bilm" and len(ids) > 1 and special[-1]:
            ids = ids[:-1]  # </S>: the forward LM continues after the prompt, not after the sentence end
        out.append(np.asarray(ids, dtype=np.int64))
    return out


def generate(handle, prompts: Sequence[str] | Sequence[Sequence[int]], sampling: Sampling | None = None,
             progress: bool = False) -> Generation:
    """Continue every prompt (texts, or token-id lists read as they are) by `sampling.max_new_tokens`."""
    sampling = (sampling or Sampling()).validate()
    kind, model = generator_head(handle)
    if len(prompts) and not isinstance(prompts[0], str):
        rows = [np.asarray(p, dtype=np.int64) for p in prompts]
    else:
        rows = encode_prompts(handle, kind, prompts)
    if kind == "causal" and any(len(r) == 0 for r in rows):
        raise ConfigError("an empty prompt needs a start token; this tokenizer has neither bos nor eos")
    longest = max((len(r) for r in rows), default=0)
    need = longest + sampling.max_new_tokens if kind != "seq2seq" else max(longest, sampling.max_new_tokens + 1)
    if need > handle.max_length:
        raise ConfigError(f"prompt ({longest} tokens) + max_new_tokens ({sampling.max_new_tokens}) exceed the "
                          f"model's max_length {handle.max_length}")
    gen = torch.Generator().manual_seed(int(sampling.seed))
    new: list[np.ndarray | None] = [None] * len(rows)
    if kind == "seq2seq":
        groups = [list(range(i, min(i + sampling.batch_size, len(rows)))) for i in range(0, len(rows), sampling.batch_size)]
    else:  # same-length prompts together: no padding in a causal/ELMo batch
        by_len: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            by_len.setdefault(len(r), []).append(i)
        groups = [idx[j: j + sampling.batch_size] for _, idx in sorted(by_len.items())
                  for j in range(0, len(idx), sampling.batch_size)]
    bar = None
    if progress:
        from workbench.progress import progress as progress_bar

        bar = progress_bar(total=len(rows), desc="generate", unit="prompt")
    with torch.inference_mode():
        for idx in groups:
            out = _GENERATORS[kind](handle, model, [rows[i] for i in idx], sampling, gen)
            for i, o in zip(idx, out):
                new[i] = o
            if bar is not None:
                bar.update(len(idx))
    if bar is not None:
        bar.close()
    handle.stats["generated_tokens"] += sum(len(n) for n in new)
    return Generation(rows, new, [decode(handle, n) for n in new], kind)


def decode(handle, ids: np.ndarray) -> str:
    """The text of generated ids up to the first end-of-sequence token (special tokens dropped)."""
    eos = handle.tokenizer.eos_token_id
    ids = list(ids)
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos)]
    return handle.tokenizer.decode(ids, skip_special_tokens=True)


def _causal(handle, model, rows, sampling, gen) -> list[np.ndarray]:
    ids = torch.as_tensor(np.stack(rows), device=handle.device)
    out = model(input_ids=ids, use_cache=True)
    past, steps = out.past_key_values, []
    for t in range(sampling.max_new_tokens):
        nxt = pick(out.logits[:, -1], sampling, gen)
        steps.append(nxt)
        if t + 1 < sampling.max_new_tokens:
            out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
            past = out.past_key_values
    return list(torch.stack(steps, 1).cpu().numpy())


def _bilm(handle, model, rows, sampling, gen) -> list[np.ndarray]:
    ids = torch.as_tensor(np.stack(rows), device=handle.device)
    for _ in range(sampling.max_new_tokens):
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), return_logits=True).forward_logits
        ids = torch.cat([ids, pick(logits[:, -1], sampling, gen)[:, None]], 1)
    return list(ids[:, len(rows[0]):].cpu().numpy())


def _seq2seq(handle, model, rows, sampling, gen) -> list[np.ndarray]:
    from workbench.running.lm_inputs import pad_rows
    from workbench.running.models import first_not_none

    src, att = pad_rows(rows, handle.pad_id, handle.device)
    enc = model.get_encoder()(input_ids=src, attention_mask=att)
    start = first_not_none(getattr(handle.config, "decoder_start_token_id", None), handle.pad_id)
    dec = torch.full((len(rows), 1), int(start), dtype=torch.long, device=handle.device)
    out = model(encoder_outputs=enc, attention_mask=att, decoder_input_ids=dec, use_cache=True)
    past, steps = out.past_key_values, []
    for t in range(sampling.max_new_tokens):
        nxt = pick(out.logits[:, -1], sampling, gen)
        steps.append(nxt)
        if t + 1 < sampling.max_new_tokens:
            out = model(encoder_outputs=enc, attention_mask=att, decoder_input_ids=nxt[:, None],
                        past_key_values=past, use_cache=True)
            past = out.past_key_values
    return list(torch.stack(steps, 1).cpu().numpy())


_GENERATORS = {"causal": _causal, "bilm": _bilm, "seq2seq": _seq2seq}


def cli_main(argv: Sequence[str]) -> int:
    """`bertology generate CHECKPOINT [PROMPT ...]`: continuations printed one per line (JSON with
    --json). Bad input (an encoder, a bad setting, an unknown checkpoint) fails before any work."""
    import argparse
    import json

    from workbench.store.checkpoints import single_checkpoint
    from workbench.running.models import ModelHandle

    p = argparse.ArgumentParser(prog="bertology generate", description="generate text with a model's own LM head "
                                "(GPT, T5, BART, ELMo's forward LM): greedy, temperature, top-k, nucleus; seeded")
    p.add_argument("checkpoint", help="checkpoint folder, training folder (its last step) or Hub name in the local cache")
    p.add_argument("prompts", nargs="*", default=[""], help="prompts (default: one empty prompt)")
    p.add_argument("--strategy", default="greedy", help="greedy | sample")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=50)
    p.add_argument("--num", type=int, default=1, help="samples per prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto (cuda when available) | cpu | cuda")
    p.add_argument("--json", action="store_true", help="one JSON object per generation")
    args = p.parse_args(list(argv))
    sampling = Sampling(args.strategy, args.temperature, args.top_k, args.top_p, args.max_new_tokens, args.seed,
                        args.batch_size).validate()
    if args.num < 1:
        raise ConfigError(f"--num must be >= 1, got {args.num}")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    # a training folder (`runs/train/NAME/seed-0`, as the README writes it) -> its last saved step
    handle = ModelHandle.load(single_checkpoint(args.checkpoint), device=device)
    generator_head(handle)  # an encoder fails here, before anything is generated
    prompts = [q for q in args.prompts for _ in range(args.num)]
    g = generate(handle, prompts, sampling)
    for q, text, ids in zip(prompts, g.texts, g.new_ids):
        print(json.dumps({"prompt": q, "text": text, "ids": [int(i) for i in ids]}) if args.json else f"{q}{text}")
    return 0
