"""Weight quantization: k-bit fake quantization for accuracy, real int8 for latency and size.

Fake quantization (`fake_quantize`): each dense weight of the transformer blocks (the same set as
unstructured pruning, `workbench.compress.unstructured.dense_layers`) is replaced by its k-bit
version stored back in float32, so the model stays a plain transformers checkpoint that every
probe reads. Per output channel (one row of a Linear weight), symmetric, round to nearest, as in
the per-channel weight quantization of Jacob et al. (2018) and Q8BERT (Zafrir et al. 2019):

    k >= 2:  L = 2^(k-1) - 1 levels each side,  s = max|w_row| / L,  w_q = s * clamp(round(w / s), -L, L)
             (2L + 1 <= 2^k values: 255 for 8 bits, 7 for 3 bits, 3 for 2 bits);
    k = 1:   w_q = sign(w) * mean|w_row|  (sign(0) taken as +1): two values per channel, the
             binarisation of XNOR-Net (Rastegari et al. 2016) / BinaryBERT's scaled sign.

The max-based scale is what per-channel int8 uses; at 2 bits it rounds most weights of a Gaussian
row to 0 (|w| < max/2), so 2-bit weights are further from the originals (mean squared error) than
the 1-bit code, whose scale is the least-squares one for signs (tests/test_compress_units.py).

Real int8 inference on CPU (`int8_dynamic`): torch's dynamic quantization
(`torch.ao.quantization.quantize_dynamic`: int8 weights per tensor, activations quantized on the
fly per batch) of every `nn.Linear`; it still works on torch 2.13 (it warns that quantized tensor
creation is deprecated). The result is an in-memory model for measuring latency and size
(`benchmarks/bench_int8.py`), not a checkpoint: transformers cannot save or reload it.
"""

from __future__ import annotations

import io

import torch

from workbench.compress.unstructured import dense_layers, output_axis
from workbench.errors import ConfigError

BITS = (8, 4, 3, 2, 1)


def quantize_weight(w: torch.Tensor, bits: int, axis: int = 0) -> torch.Tensor:
    """`w` fake-quantized to `bits` bits per output channel (`axis` indexes the channels)."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 16:
        raise ConfigError(f"bits must be an integer from 1 to 16, got {bits!r}")
    x = w.detach().float().movedim(axis, 0)
    flat = x.reshape(x.shape[0], -1)
    if bits == 1:
        scale = flat.abs().mean(1, keepdim=True)
        q = torch.where(flat >= 0, scale, -scale)
    else:
        levels = 2 ** (bits - 1) - 1
        scale = flat.abs().amax(1, keepdim=True) / levels
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
        q = torch.clamp(torch.round(flat / scale), -levels, levels) * scale
    return q.reshape(x.shape).movedim(0, axis).to(w.dtype)


def fake_quantize(model: torch.nn.Module, bits: int, include_embeddings: bool = False,
                  include_head: bool = False) -> torch.nn.Module:
    """Quantize the prunable weights of `model` in place (a `ModelHandle.derive` apply function:
    it receives a copy); returns `model`."""
    with torch.no_grad():
        for name, module in dense_layers(model, include_embeddings, include_head).items():
            axis = output_axis(module) if not isinstance(module, torch.nn.Embedding) else 0
            module.weight.copy_(quantize_weight(module.weight, bits, axis))
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
