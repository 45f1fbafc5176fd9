"""Dropout with a cheaper mask on CPU: the one home of the training step's dropout masks.

Dropout (Srivastava et al. 2014): in training, each element is kept independently with probability
1 - p and scaled by 1 / (1 - p), else zeroed. torch draws the CPU mask with `bernoulli_`, one 32-bit
draw of its Mersenne Twister per element (plus a float conversion); on the 2-core Intel Xeon with
AMX that was 20% of the training step's CPU time (docs/evidence/benchmarks.md). Here the mask is drawn as
16-bit uniform integers, four per 64-bit output of numpy's PCG64 (O'Neill 2014; `random_raw`), each
element kept when its integer is below round((1 - p) * 65536): the keep probability is quantised
to 1/65536 (|rate - (1 - p)| <= 2^-17, e.g. 0.899994 for p = 0.1), every element independent.

Reproducible and resumable: each call seeds a fresh PCG64 stream with one 63-bit draw from torch's
default generator, so `torch.manual_seed` fixes every mask and the training checkpoint's torch RNG
state (which already covers dropout) covers these too; no mask is reused across calls or layers.
On other devices (CUDA: Philox, already fast) and outside training it is plain `F.dropout`.

`FastDropout` is an `nn.Dropout` (same `p`, same `inplace` flag, so code that reads `.p` or checks
`isinstance(m, nn.Dropout)` is unaffected); `use_fast_dropout(model)` swaps every `nn.Dropout`
module of a model for one.

Attention-probability dropout that a model applies functionally is not a module: HF's BERT-style
families (BERT, RoBERTa, SpanBERT's BERT, ALBERT, ELECTRA, DistilBERT, GPT-2, T5, BART) call an
attention function looked up by `config._attn_implementation` in transformers' `AttentionInterface`
(`eager`: `nn.functional.dropout` on the probabilities; the default `sdpa`: `dropout_p`, which on
CPU runs the math path with `bernoulli_`). That mask, B x H x T x T, is the largest of the BERT
step. `use_fast_attention_dropout(model)` switches such models to `ATTENTION_FUNCTION`
("bertology_pcg16", registered here): transformers' eager attention (scaled dot product, T5's
position bias, the additive mask, softmax; Vaswani et al. 2017) with the probabilities' dropout
drawn by `dropout` above. Outside training it computes what eager attention computes (no dropout).
DeBERTa applies its attention dropout through a module (already swapped); ELMo has no attention.
On the 2-core Intel Xeon with AMX one attention call (forward + backward, 32 x 4 x 128 x 128, one
thread) took 44.6 ms against SDPA's 64.7 ms with `bernoulli_`, and the BERT `small` training step
5% less CPU time than with the module masks alone (docs/evidence/benchmarks.md, 2026-11-27).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

KEEP_RESOLUTION = 65536  # the keep probability is a multiple of 1 / 65536


def keep_threshold(p: float) -> int:
    """The 16-bit threshold: an element is kept when its uniform integer in [0, 65536) is below it."""
    return int(round((1.0 - p) * KEEP_RESOLUTION))


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A bool mask of `shape`, each element True independently with probability keep_threshold(p) / 65536."""
    n = int(np.prod(shape)) if len(shape) else 1
    seed = int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64))  # from torch's default generator
    words = np.random.PCG64(seed).random_raw((n + 3) // 4)  # uint64: four 16-bit lanes each
    # as int16 the lanes are uniform on [-32768, 32768), so "below t - 32768" has probability t / 65536
    lanes = torch.from_numpy(words.view(np.int16)[:n])
    return (lanes < keep_threshold(p) - 32768).view(shape).to(device)


def keep_and_scale(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """x * mask * scale in one pass: `addcmul` onto a zero, the bool mask read as 0/1 bytes. The same
    values as `torch.where(mask, x, 0) * scale` (the kept ones rounded once, the dropped ones +0.0;
    only an exactly -0.0 input that is kept comes out +0.0, which no later sum can tell apart), in
    about 40% of its time on the 2-core Intel Xeon with AMX (1.45 vs 3.74 ms for a 32 x 4 x 128 x 128
    fp32 tensor, 1.09 vs 3.81 ms in bf16, one thread; docs/evidence/benchmarks.md)."""
    return torch.addcmul(x.new_zeros(()), x, mask.view(torch.uint8), value=scale)


class _KeepAndScale(torch.autograd.Function):
    """x * mask / (1 - p), saving only the bool mask for the backward (as `native_dropout` does)."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return keep_and_scale(x, mask, scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return keep_and_scale(grad, mask, ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)` with the 16-bit PCG64 mask on CPU (module doc); F.dropout elsewhere."""
    if not training or p == 0.0 or x.device.type != "cpu":
        return nn.functional.dropout(x, p, training)
    if p >= 1.0:
        return x * 0.0
    return _KeepAndScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


class FastDropout(nn.Dropout):
    """`nn.Dropout` whose training mask comes from `workbench.dropout.dropout` (never in place)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def use_fast_dropout(model: nn.Module) -> int:
    """Replace every `nn.Dropout` module in `model` by a `FastDropout` with the same p; returns how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                setattr(module, child_name, FastDropout(child.p, child.inplace))
                swapped += 1
    return swapped


_pcg16_dropout = dropout  # the attention function's keyword argument `dropout` (HF's name) shadows it there

def attention_dropout_families(kind: str) -> tuple[str, ...]:
    """The training registry's families (workbench/families) whose attention-probability dropout is
    applied as `kind` (`FamilySpec.attention_dropout`): "functional" (inside the attention function:
    `use_fast_attention_dropout`) or "module" (an nn.Dropout module: `use_fast_dropout`); ELMo has
    no attention. tests/test_dropout.py checks both against the families' models."""
    from workbench.families import available_families, get_family

    return tuple(n for n in available_families() if get_family(n).attention_dropout == kind)


def __getattr__(name: str):
    # the two lists under their former names, asked of the families when read
    if name == "FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES":
        return attention_dropout_families("functional")
    if name == "MODULE_ATTENTION_DROPOUT_FAMILIES":
        return attention_dropout_families("module")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ATTENTION_FUNCTION = "bertology_pcg16"  # the name under which transformers finds `pcg16_attention_forward`


def pcg16_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                            position_bias: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `eager_attention_forward` (the BERT/RoBERTa/ALBERT/ELECTRA/DistilBERT/BART one,
    with T5's `position_bias` and GPT-2's cast of the probabilities to the values' dtype, both no-ops
    for the others in fp32) whose dropout on the attention probabilities is `workbench.dropout.dropout`.

    `dropout` is the probability the calling module passes (0.0 outside training); the mask is drawn
    only when `module.training`, as `nn.functional.dropout(..., training=module.training)` does.
    Returns (output [B, T, H, d], probabilities after dropout), as the eager function does.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if position_bias is not None:  # T5's relative position bias, added before the mask as its eager function does
        weights = weights + position_bias
    if attention_mask is not None:  # additive (0 / dtype min), made by transformers' `eager_mask`
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1).to(value.dtype)
    weights = _pcg16_dropout(weights, dropout, module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


# The function, and the mask it expects (eager's additive one; a name with no mask function gets no mask at all).
AttentionInterface.register(ATTENTION_FUNCTION, pcg16_attention_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_FUNCTION, eager_mask)


def use_fast_attention_dropout(model: nn.Module) -> int:
    """Switch every transformers model inside `model` whose attention goes through `AttentionInterface`
    to `ATTENTION_FUNCTION`; returns how many top-level models were switched (their sub-models follow).

    Models that cannot switch (their attention is their own module code, e.g. DeBERTa) or have no
    attention (ELMo) are left as they are. Saved checkpoints do not keep the choice (transformers
    leaves `_attn_implementation` out of config.json), so a trained model opens with the family's
    default attention, also where this module was never imported."""
    from transformers import PreTrainedModel

    switched, seen = 0, set()
    for module in model.modules():
        if not isinstance(module, PreTrainedModel) or id(module.config) in seen:
            continue
        for sub in module.modules():  # its sub-models share or follow its config
            if isinstance(sub, PreTrainedModel):
                seen.add(id(sub.config))
        has_attention = any("Attention" in type(m).__name__ for m in module.modules())  # not ELMo
        if has_attention and type(module)._can_set_attn_implementation():
            module.set_attn_implementation(ATTENTION_FUNCTION)
            switched += 1
    return switched
