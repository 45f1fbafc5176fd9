"""Which number format a training step's forward runs in: the one rule behind `precision:`.

`precision: auto | fp32 | bf16` (training configs, `bertology train --precision`, `bertology run
--precision`):
- `fp32` and `bf16` force that format on every device (bf16 = the forward under
  `torch.autocast(device, bfloat16)`, weights and optimizer state stay fp32);
- `auto` picks bf16 where the hardware multiplies it natively: on CUDA as before (the `bf16` key,
  default true), on a CPU when /proc/cpuinfo lists `amx_bf16` (Intel AMX) or `avx512_bf16`
  (AVX-512 BF16, e.g. AMD Zen 4); elsewhere bf16 matmuls are emulated and slower than fp32, so fp32;
- unset (the default, every config written before the key): the older keys decide, `bf16` on CUDA
  (default true) and `cpu_bf16` on CPU (default false), so existing configs train exactly as before.

The resolved format and the reason (e.g. "auto: amx_bf16 present") go into run.json and every
checkpoint's manifest, and the resolved format enters the training hash (`TrainConfig.training_hash`):
bf16 changes the weights (Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep Learning Training").
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # in the order the reason names them


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and ":" in line:
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16_flag(flags: frozenset[str] | set[str] | None = None) -> str | None:
    """The flag saying this CPU multiplies bf16 natively (`amx_bf16` first), or None.
    `flags` defaults to this machine's (`cpu_flags()`); tests pass fake sets."""
    flags = cpu_flags() if flags is None else flags
    return next((f for f in NATIVE_BF16_FLAGS if f in flags), None)


def device_type(device: str) -> str:
    """'cuda' or 'cpu' for a config's `device` value (auto = cuda when one is visible)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def resolve_precision(precision: str | None, device: str, cuda_bf16: bool = True, cpu_bf16: bool = False,
                      flags: frozenset[str] | set[str] | None = None) -> tuple[str, str]:
    """("fp32" | "bf16", why) for a run on `device` ('cpu', 'cuda', 'cuda:N' or 'auto').

    `cuda_bf16` and `cpu_bf16` are the config's older `bf16` and `cpu_bf16` keys (see the module
    doc); `flags` the CPU's flags (default: this machine's)."""
    kind = device_type(device)
    if precision in ("fp32", "bf16"):
        return precision, f"precision: {precision}"
    if precision == "auto":
        if kind == "cuda":
            return ("bf16", "auto: cuda, bf16: true") if cuda_bf16 else ("fp32", "auto: cuda, bf16: false")
        flag = native_bf16_flag(flags)
        if flag:
            return "bf16", f"auto: {flag} present"
        return "fp32", "auto: no amx_bf16 or avx512_bf16 in the CPU flags"
    if precision is not None:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if kind == "cuda":
        return ("bf16", "precision unset: bf16: true on cuda") if cuda_bf16 else ("fp32", "precision unset: bf16: false")
    return ("bf16", "precision unset: cpu_bf16: true") if cpu_bf16 else ("fp32", "precision unset: fp32 on CPU")


def autocast(precision: str, device: torch.device):
    """The forward's context: bf16 autocast on `device` for "bf16", nothing for "fp32"."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
