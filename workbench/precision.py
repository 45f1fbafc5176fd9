"""Which floating-point format a model's forward pass computes in: fp32, or bf16 where it pays.

bf16 (bfloat16: fp32's 8-bit exponent, 7-bit mantissa) is fast on a CPU only where the CPU
multiplies it natively: AVX-512 BF16 (`avx512_bf16`) or Intel AMX (`amx_bf16`); elsewhere its
matmuls are emulated and slower than fp32. `cpu_has_native_bf16()` is the one place that reads
those flags (the training precision rule and the extraction dtype both ask it), and
`resolve_compute_dtype("auto", device)` turns the user's choice into "fp32" or "bf16" by that rule
(on CUDA: bf16 where the GPU supports it).

A bf16 forward here means `torch.autocast(device, bfloat16)` around an fp32 model (`autocast`):
matmuls and attention run in bf16, normalisations, softmax and the residual stream stay fp32,
and the weights are never changed (so a handle's checkpoint hash, which names the weights, does
not change; the activation cache key adds the compute dtype, `workbench.activations.model_fingerprint`).
bf16 keeps fp32's range, so the massive activations of Llama-style models (Sun et al. 2024,
"Massive Activations in Large Language Models": single values in the thousands) cannot overflow as
they could in fp16; they lose relative precision (2^-8) like every other value.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Iterator

from workbench.errors import ConfigError

COMPUTE_DTYPES = ("fp32", "bf16", "auto")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU multiplies bf16 natively (flag `amx_bf16` or `avx512_bf16` in /proc/cpuinfo).
    False where the file is unreadable (not Linux): fp32 is the safe choice there."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(set(NATIVE_BF16_FLAGS) & set(line.split(":", 1)[-1].split()))
    return False


def resolve_compute_dtype(choice: str, device="cpu", where: str = "dtype") -> str:
    """'fp32' | 'bf16' for a choice of 'fp32' | 'bf16' | 'auto'. auto = bf16 on a CPU with native bf16
    (`cpu_has_native_bf16`) or a CUDA device that supports bf16, else fp32. An unknown choice is a
    ConfigError naming `where`."""
    if choice not in COMPUTE_DTYPES:
        raise ConfigError(f"{where}: must be one of {list(COMPUTE_DTYPES)}, got {choice!r}")
    if choice != "auto":
        return choice
    kind = getattr(device, "type", str(device)).split(":")[0]
    if kind == "cuda":
        import torch

        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_native_bf16() else "fp32"


@contextlib.contextmanager
def autocast(compute_dtype: str, device) -> Iterator[None]:
    """The forward pass' precision: nothing for fp32, `torch.autocast(device type, bfloat16)` for bf16."""
    if compute_dtype == "fp32":
        yield
        return
    if compute_dtype != "bf16":
        raise ConfigError(f"compute dtype must be 'fp32' or 'bf16' here (resolve 'auto' first), got {compute_dtype!r}")
    import torch

    kind = getattr(device, "type", str(device)).split(":")[0]
    with torch.autocast(kind, dtype=torch.bfloat16):
        yield
