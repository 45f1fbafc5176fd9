"""Weight quantization: k-bit fake quantization for accuracy, real int8 for latency and size.

Fake quantization (`fake_quantize`): weights are replaced by their k-bit versions stored back in
float32, so the model stays a plain transformers checkpoint that every probe reads. Weights only,
after fine-tuning, no retraining (post-training quantization); biases, LayerNorms and activations
stay float32. Two schemes (`SCHEMES`):

- `per_channel` (the default): each dense weight of the prunable set (the block matrices and what
  `dense_layers`' flags add, the same set as unstructured pruning) gets one scale per output
  channel (one row of a Linear weight), symmetric, round to nearest: the per-channel weight
  quantization of Krishnamoorthi (2018, "Quantizing deep convolutional networks for efficient
  inference: a whitepaper"), which refines the one (affine) scale per tensor of Jacob et al.
  (2018)'s integer-arithmetic inference to one scale per output channel;
- `q8bert`: Q8BERT (Zafrir et al. 2019, "Q8BERT: Quantized 8Bit BERT") as far as weights go: ONE
  scale per tensor, symmetric linear (scale = max|W| / (2^(k-1) - 1) over the whole matrix), and
  every Embedding and fully connected layer quantized: word, position and token-type embeddings,
  the block matrices, the pooler and the task head (their `QuantizedBertForSequenceClassification`
  replaces each of these; the `include_*` flags do not apply). Q8BERT also quantizes the
  activations (8 bits, EMA-calibrated ranges) and trains with fake quantization during
  fine-tuning (quantization-aware training); neither is done here, so at 8 bits this measures
  what their weight format costs a model fine-tuned in float32, not their trained result. Their
  code accepts 2 bits and more; 1 bit here is the per-tensor analogue of the code below.

The codes, for a vector w sharing one scale (a row per channel, the whole tensor per tensor):

    k >= 2:  L = 2^(k-1) - 1 levels each side,  s = max|w| / L,  w_q = s * clamp(round(w / s), -L, L)
             (2L + 1 <= 2^k values: 255 for 8 bits, 7 for 3 bits, 3 for 2 bits);
    k = 1:   w_q = sign(w) * mean|w|  (sign(0) taken as +1): two values per scale, the
             binarisation of XNOR-Net (Rastegari et al. 2016) / BinaryBERT's scaled sign.

The max-based scale is what symmetric int8 uses; at 2 bits it rounds most weights of a Gaussian
row to 0 (|w| < max/2), so 2-bit weights are further from the originals (mean squared error) than
the 1-bit code, whose scale is the least-squares one for signs (tests/test_compress_units.py). One
scale per tensor is coarser than one per row: a row of small weights shares the step of the
tensor's largest one (at 8 bits a small effect; at 4 bits and below it zeroes whole rows sooner).

Real int8 inference on CPU (`int8_dynamic`): torch's dynamic quantization
(`torch.ao.quantization.quantize_dynamic`: int8 weights per tensor, activations quantized on the
fly per batch) of every `nn.Linear`; it still works on torch 2.13 (it warns that quantized tensor
creation is deprecated). The result is an in-memory model for measuring latency and size
(`benchmarks/bench_int8.py`), not a checkpoint: transformers cannot save or reload it.
"""

from __future__ import annotations

import io

import torch

from workbench.compress.unstructured import is_dense, dense_layers, output_axis
from workbench.errors import ConfigError

BITS = (8, 4, 3, 2, 1)
SCHEMES = ("per_channel", "q8bert")


def quantize_weight(w: torch.Tensor, bits: int, axis: int = 0, per_channel: bool = True) -> torch.Tensor:
    """`w` fake-quantized to `bits` bits, one scale per output channel (`axis` indexes the
    channels) or, with `per_channel` False, one scale for the whole tensor (Q8BERT)."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 16:
        raise ConfigError(f"bits must be an integer from 1 to 16, got {bits!r}")
    x = w.detach().float().movedim(axis, 0)
    flat = x.reshape(x.shape[0], -1) if per_channel else x.reshape(1, -1)
    if bits == 1:
        scale = flat.abs().mean(1, keepdim=True)
        q = torch.where(flat >= 0, scale, -scale)
    else:
        levels = 2 ** (bits - 1) - 1
        scale = flat.abs().amax(1, keepdim=True) / levels
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
        q = torch.clamp(torch.round(flat / scale), -levels, levels) * scale
    return q.reshape(x.shape).movedim(0, axis).to(w.dtype)


def q8bert_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """{weight name: module} of every Embedding and fully connected layer of `model` (Q8BERT's
    quantized set: embeddings, block matrices, pooler, task head); a shared weight once."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.nn.Module] = {}
    for module in model.modules():
        w = getattr(module, "weight", None)
        if (isinstance(module, torch.nn.Embedding) or is_dense(module)) and id(w) in name_of:
            out.setdefault(name_of[id(w)], module)
    return out


def quantized_layers(model: torch.nn.Module, scheme: str = "per_channel", include_embeddings: bool = False,
                     include_head: bool = False, include_pooler: bool = False) -> dict[str, torch.nn.Module]:
    """{weight name: module} that `fake_quantize` quantizes under `scheme` (module docstring)."""
    if scheme not in SCHEMES:
        raise ConfigError(f"quantization scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scheme == "q8bert":
        return q8bert_layers(model)
    return dense_layers(model, include_embeddings, include_head, include_pooler)


def fake_quantize(model: torch.nn.Module, bits: int, include_embeddings: bool = False,
                  include_head: bool = False, include_pooler: bool = False,
                  scheme: str = "per_channel") -> torch.nn.Module:
    """Quantize the weights `quantized_layers` names in place (a `ModelHandle.derive` apply
    function: it receives a copy); returns `model`. `per_channel`: one scale per output channel;
    `q8bert`: one per tensor, over every embedding and dense layer."""
    layers = quantized_layers(model, scheme, include_embeddings, include_head, include_pooler)
    with torch.no_grad():
        for name, module in layers.items():
            axis = output_axis(module) if not isinstance(module, torch.nn.Embedding) else 0
            module.weight.copy_(quantize_weight(module.weight, bits, axis, per_channel=scheme == "per_channel"))
    return model


def int8_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU int8 copy of `model` for inference: dynamic quantization of every `nn.Linear`."""
    import copy
    import warnings

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model).cpu().eval(), {torch.nn.Linear}, dtype=torch.qint8)


def state_size_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's serialised state dict (`torch.save`): int8 packed weights count 1 byte."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes
