"""The activation cache in half precision (issue 42, item 3): `cache_dtype: fp16 | bf16` halves the
disk and every read; the key records it; bfloat16 round to nearest even exactly as torch does; fp16
refuses values it cannot hold before anything is kept; a probe on half-precision features gives the
fp32 accuracies within 0.3 points on a planted signal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probes.core import fitting, runner
from probes.syntax.settings import SyntaxSettings
from tests.test_activations import FakeHandle
from workbench.activations import (
    CACHE_DTYPES,
    Bfloat16Array,
    bfloat16_to_float32,
    extract,
    float32_to_bfloat16,
)
from workbench.errors import ConfigError

SENTENCES = [["The", "cat", "sat", "."], ["Dogs", "bark", "loudly", "at", "night", "."], ["Yes"]]


def test_bfloat16_rounding_is_torchs():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20_000).astype(np.float32) * 10.0 ** rng.integers(-6, 5, 20_000),
                        np.array([0.0, -0.0, 1.0, 65504.0, 3.0e38, -3.0e38, 1e-40, np.inf, -np.inf], np.float32)])
    ours = float32_to_bfloat16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)
    back = bfloat16_to_float32(ours)
    assert np.array_equal(back, torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    assert np.isnan(bfloat16_to_float32(float32_to_bfloat16(np.array([np.nan], np.float32))))[0]
    # relative error of a normal number: at most half a unit in the 8th significant bit
    finite = np.isfinite(x) & (np.abs(x) > 1e-30)
    assert np.max(np.abs(back[finite] - x[finite]) / np.abs(x[finite])) <= 2.0 ** -8


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_cache_holds_the_rounded_vectors_under_its_own_key(tmp_path, dtype):
    full = extract(FakeHandle(), SENTENCES, "d", cache_dir=tmp_path, progress=False)
    half = extract(FakeHandle(), SENTENCES, "d", cache_dir=tmp_path, progress=False, dtype=dtype)
    assert half.path != full.path and dtype in half.path.name and half.meta["dtype"] == dtype
    ref = np.asarray(full.layers)
    rounded = ref.astype(np.float16).astype(np.float32) if dtype == "float16" else \
        torch.from_numpy(ref.copy()).to(torch.bfloat16).float().numpy()
    assert half.layers.shape == ref.shape
    assert np.array_equal(np.asarray(half.layers, dtype=np.float32), rounded)
    assert np.array_equal(half.layers[1, 2:5], rounded[1, 2:5])  # indexing widens what it reads
    assert (half.path / "layers.npy").stat().st_size < 0.55 * (full.path / "layers.npy").stat().st_size + 256
    if dtype == "bfloat16":
        assert isinstance(half.layers, Bfloat16Array) and half.layers.dtype == np.float32
    # read again: the entry is found, not re-extracted
    handle = FakeHandle()
    again = extract(handle, SENTENCES, "d", cache_dir=tmp_path, progress=False, dtype=dtype)
    assert handle.calls == 0 and np.array_equal(np.asarray(again.layers, dtype=np.float32), rounded)


class _Massive(FakeHandle):
    """A Llama-style massive activation (Sun et al. 2024) beyond float16's 65,504 in one dimension."""

    def vector(self, word, pos, pooling):
        v = super().vector(word, pos, pooling)
        v[:, 3] = 1.0e5
        return v


def test_fp16_refuses_a_massive_activation_and_keeps_nothing(tmp_path):
    with pytest.raises(ConfigError, match=r"1e\+05 does not fit float16.*bf16"):
        extract(_Massive(), SENTENCES, "m", cache_dir=tmp_path, progress=False, dtype="float16")
    assert not [p for p in tmp_path.rglob("meta.json")]  # no finished entry
    ok = extract(_Massive(), SENTENCES, "m", cache_dir=tmp_path, progress=False, dtype="bfloat16")
    assert np.all(np.asarray(ok.layers)[:, :, 3] == 1.0e5 - 1.0e5 % 512)  # bf16 keeps the range (8 bits)


def test_probe_setting_is_validated_and_joins_the_resume_key_only_when_not_fp32():
    from probes.syntax import PROBE

    assert set(CACHE_DTYPES) == {"fp32", "fp16", "bf16"}
    with pytest.raises(ConfigError, match="cache_dtype must be one of"):
        runner.make_settings(SyntaxSettings, {"cache_dtype": "fp8"}).validate(PROBE)
    base = runner.make_settings(SyntaxSettings, {}).resume_key()
    assert "cache_dtype" not in base  # runs started before the option keep their key
    assert runner.make_settings(SyntaxSettings, {"cache_dtype": "bf16"}).resume_key()["cache_dtype"] == "bf16"


def _planted(seed: int, n: int = 3000, layers: int = 4, hidden: int = 24, classes: int = 6, peak: int = 2):
    """Features whose layer `peak` encodes the label best, the others progressively less, on a
    Llama-like scale (one dimension 1,000x the rest): a probe must survive half precision there."""
    means = np.random.default_rng(99).standard_normal((classes, hidden)).astype(np.float32)  # shared by the splits
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = np.empty((layers, n, hidden), np.float32)
    for l in range(layers):
        strength = 1.2 / (1 + abs(l - peak))
        x[l] = strength * means[y] + rng.standard_normal((n, hidden)).astype(np.float32)
        x[l, :, 0] = 3000.0 + rng.standard_normal(n).astype(np.float32)  # a massive, uninformative dimension
    return x, y


def test_probe_accuracy_on_half_precision_features_is_fp32s_within_a_third_of_a_point():
    x, y = _planted(0)
    xe, ye = _planted(1, n=20_000)
    fit, stop = slice(0, 2700), slice(2700, 3000)
    accs = {}
    for name, conv in {"fp32": lambda a: a, "fp16": lambda a: a.astype(np.float16).astype(np.float32),
                       "bf16": lambda a: bfloat16_to_float32(float32_to_bfloat16(a))}.items():
        xs = conv(x)
        res = fitting.fit_probe(xs[:, fit], y[fit], xs[:, stop], y[stop], num_classes=6)
        accs[name] = res.accuracy(conv(xe), ye)
    assert np.argmax(accs["fp32"]) == 2 and accs["fp32"][2] > 0.8  # the plant is read
    for name in ("fp16", "bf16"):
        assert np.max(np.abs(accs[name] - accs["fp32"])) <= 0.003, (name, accs[name], accs["fp32"])
