"""Which floating-point format a forward pass computes in: fp32, or bf16 where the hardware pays.

bf16 (bfloat16: fp32's 8-bit exponent, 7-bit mantissa) is fast on a CPU only where the CPU
multiplies it natively: Intel AMX (`amx_bf16`) or AVX-512 BF16 (`avx512_bf16`, e.g. AMD Zen 4);
elsewhere its matmuls are emulated and slower than fp32. This module is the one place that reads
those flags; both users ask it:

- **Training** (`precision: auto | fp32 | bf16` in a training config, `bertology train --precision`,
  `bertology run --precision`; `resolve_precision`): `fp32`/`bf16` force that format; `auto` picks
  bf16 on CUDA (the `bf16` key, default true) and on a CPU with native bf16, fp32 elsewhere; unset
  (every config written before the key) lets the older keys decide (`bf16` on CUDA, `cpu_bf16` on
  CPU, default false), so existing configs train exactly as before. The resolved format and the
  reason ("auto: amx_bf16 present") go into run.json and every manifest, and the format enters the
  training hash: bf16 changes the weights (Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep
  Learning Training").
- **Extraction and probing** (`--dtype fp32 | bf16 | auto` on every probe; `resolve_compute_dtype`):
  the same rule for `auto` (on CUDA: where the GPU supports bf16). The activation cache key adds the
  compute dtype (`workbench.activations.model_fingerprint`), so a bf16 extraction is never read as
  the fp32 one.

A bf16 forward is `torch.autocast(device, bfloat16)` around fp32 weights (`autocast`): matmuls and
attention run in bf16; normalisations, softmax and the residual stream stay fp32; the weights, and so
a handle's checkpoint hash, never change. bf16 keeps fp32's range, so the massive activations of
Llama-style models (Sun et al. 2024: single values in the thousands) cannot overflow as they could in
fp16; they lose relative precision (2^-8) like every other value.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Iterator

import torch

from workbench.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16")  # a training config's `precision:`
COMPUTE_DTYPES = ("fp32", "bf16", "auto")  # a probe's `dtype:`
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # in the order the reason names them


@functools.lru_cache(maxsize=4)
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it is unreadable, e.g. macOS)."""
    try:
        for line in Path(cpuinfo).read_text(encoding="utf-8", errors="replace").splitlines():
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


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU multiplies bf16 natively; False where /proc/cpuinfo is unreadable (fp32 is
    the safe choice there)."""
    return native_bf16_flag(cpu_flags(cpuinfo)) is not None


def resolve_device(device, local_rank: int | None = None) -> torch.device:
    """Where a computation runs: "auto" (or None) is the first CUDA device when torch sees one, else
    the CPU; anything else is the device it names, which must be a CPU or a CUDA device torch sees
    (ConfigError naming it otherwise). The probes' fits take it (`probes.core.fitting`,
    `probes.syntax.structural`): their random draws stay on the CPU, so a fit on CUDA draws the
    same data order and initial weights as on the CPU. The training loop takes it too
    (`workbench.drivers.train.Dist.device`): under torchrun it passes the process's `local_rank`,
    which makes a bare "cuda" (or "auto" on CUDA) that rank's GPU, `cuda:<local_rank>`; an indexed
    "cuda:N" stays as named."""
    if device is None or str(device) == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
        if dev.type not in ("cpu", "cuda"):
            raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} asked for but torch sees no CUDA device")
    if local_rank is not None and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    return dev


def device_type(device) -> str:
    """'cuda' or 'cpu' for a device or a config's `device` value (auto = cuda when one is visible)."""
    device = getattr(device, "type", str(device))
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def resolve_precision(precision: str | None, device: str, cuda_bf16: bool = True, cpu_bf16: bool = False,
                      flags: frozenset[str] | set[str] | None = None) -> tuple[str, str]:
    """A training run's ("fp32" | "bf16", why) on `device` ('cpu', 'cuda', 'cuda:N' or 'auto').

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


def resolve_compute_dtype(choice: str, device="cpu", where: str = "dtype") -> str:
    """An extraction's 'fp32' | 'bf16' for a choice of 'fp32' | 'bf16' | 'auto': auto = bf16 on a CPU
    with native bf16 or a CUDA device that supports bf16, else fp32. An unknown choice is a
    ConfigError naming `where`."""
    if choice not in COMPUTE_DTYPES:
        raise ConfigError(f"{where}: must be one of {list(COMPUTE_DTYPES)}, got {choice!r}")
    if choice != "auto":
        return choice
    if device_type(device) == "cuda":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_native_bf16() else "fp32"


@contextlib.contextmanager
def autocast(precision: str, device) -> Iterator[None]:
    """The forward pass' context: nothing for "fp32", `torch.autocast(device type, bfloat16)` for
    "bf16" (resolve "auto" first)."""
    if precision == "fp32":
        yield
        return
    if precision != "bf16":
        raise ConfigError(f"compute dtype must be 'fp32' or 'bf16' here (resolve 'auto' first), got {precision!r}")
    with torch.autocast(getattr(device, "type", str(device)).split(":")[0], dtype=torch.bfloat16):
        yield
