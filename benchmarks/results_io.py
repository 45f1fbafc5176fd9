"""Shared plumbing of the benchmarks: the machine's fp32 matmul peak and the JSON record.

Every benchmark writes one JSON file per run under `benchmarks/results/` (`write_result`) with the
machine (CPU model, cores, the ISA flags that matter: AVX-512, AVX-512 BF16, AMX), the thread count,
package versions, git state and the load average at the start and the end of the run, so a figure
taken on a busy shared machine says so. `benchmarks/report.py` turns those files into docs/benchmarks.md's
performance table.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_info() -> dict:
    """CPU model name and the ISA flags that decide which kernels torch can use."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"model": model, "cpus": os.cpu_count(), "flags": [f for f in _ISA_FLAGS if f in flags],
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def has_cpu_bf16() -> bool:
    """True when the CPU multiplies bf16 natively (AVX-512 BF16 or AMX): bf16 autocast can pay off."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_info()["flags"]))


def seconds_per_call(run, windows: int, window_s: float) -> list[float]:
    """`run()`'s mean seconds per call in each of `windows` back-to-back windows of `window_s`
    seconds (after one warm-up call): the best window is the least disturbed by a shared host."""
    run()  # warm-up
    out = []
    for _ in range(windows):
        t, calls = time.perf_counter(), 0
        while time.perf_counter() - t < window_s:
            run()
            calls += 1
        out.append((time.perf_counter() - t) / calls)
    return out


def matmul_peak(n: int = 2048, seconds: float = 3.0, dtype: torch.dtype = torch.float32) -> dict:
    """Sustained FLOP/s of an n x n matmul loop with torch's current thread count (2 n^3 per product).

    The best of 1-second windows over `seconds`: the machine's reachable dense peak at this thread
    count, the denominator of model FLOPs utilisation (Chowdhery et al. 2022, PaLM, appendix B)."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    windows = [2 * n**3 / s for s in seconds_per_call(lambda: torch.mm(a, b, out=out), max(1, round(seconds)), 1.0)]
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "flops_per_s": max(windows), "windows": windows}


def record_start() -> dict:
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_at_start": list(os.getloadavg())}


def write_result(name: str, payload: dict, start: dict, path: Path | None = None) -> Path:
    """Write `payload` plus the machine/versions/load record to benchmarks/results/<name>-<host>-<time>.json."""
    from workbench.io import atomic_write_json
    from workbench.store.manifest import environment, git_state, package_versions

    record = {
        "benchmark": name, **payload,
        "threads": payload.get("threads", torch.get_num_threads()),
        "machine": {**cpu_info(), "hostname": platform.node(), **start,
                    "loadavg_at_end": list(os.getloadavg())},
        "environment": environment(), "packages": package_versions(), "git": git_state(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    path = path or RESULTS / f"{name}-{platform.node()}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)
    print(f"wrote {path}")
    return path
