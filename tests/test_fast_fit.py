"""The default probe fit on large features (issue 42): minibatch Adam picked by one layer's size,
within 0.3 points of a fit run to convergence on every layer, holding one copy of the features, and
the same numbers whatever the device is called.

Planted signals: layer k carries a class embedding at strength s_k in Gaussian noise, so every
layer's accuracy is known to be reachable and the converged softmax regression (full-batch L-BFGS)
is the reference; the default fit is compared with it layer by layer on a large evaluation set.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probes.core import fitting
from probes.core.fitting import AUTO_LBFGS_MAX_ENTRIES, LazyFeatures, ProbeConfig, fit_probe, resolved_config
from workbench.errors import ConfigError


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _planted(n: int, h: int, strengths, c: int, seed: int):
    """(x [L, n, h] float32, y [n]): layer k = strengths[k] * class embedding + N(0, 1) noise."""
    emb = np.random.default_rng(1234).standard_normal((c, h))  # the same classes in every split
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    x = rng.standard_normal((len(strengths), n, h), dtype=np.float32)
    for k, s in enumerate(strengths):
        x[k] += (s * emb[y]).astype(np.float32)
    return x, y


# --------------------------------------------------------------------------- the "auto" rule


def test_auto_picks_lbfgs_up_to_the_layer_size_limit_and_adam_above(monkeypatch):
    pick = lambda n, h, **kw: resolved_config(ProbeConfig(**kw), n, h).optimizer  # noqa: E731
    limit = AUTO_LBFGS_MAX_ENTRIES
    assert pick(limit // 64, 64) == "lbfgs" and pick(limit // 64 + 1, 64) == "adam"
    assert pick(14_320, 768) == "adam"  # the benchmark's UPOS fit on MPNet (under the old 20k-word limit)
    assert pick(50_000, 32) == "lbfgs"  # many words of a narrow model: 1.6M entries (Adam by words before)
    assert pick(200, 16, kind="mlp") == "adam"  # MLPs always take Adam
    assert pick(10**6, 768, optimizer="lbfgs") == "lbfgs" and pick(10, 2, optimizer="adam") == "adam"
    # the defaults that follow from the choice: the linear Adam fit's own, L-BFGS's and the MLP's as before
    big, small, mlp = (resolved_config(ProbeConfig(**kw), n, 768)
                       for kw, n in (({}, 10**5), ({}, 10), ({"kind": "mlp"}, 10)))
    assert (big.optimizer, big.lr, big.batch_size, big.stop_on, big.polish) == ("adam", 5e-3, 128, "loss", 300)
    assert (small.optimizer, small.stop_on, small.polish) == ("lbfgs", "accuracy", 0)
    assert (mlp.lr, mlp.batch_size, mlp.stop_on, mlp.polish) == (3e-3, 256, "accuracy", 0)
    assert resolved_config(ProbeConfig(polish=0), 10**5, 768).polish == 0  # the fit before issue 49's polish
    assert resolved_config(ProbeConfig(stop_on="accuracy", batch_size=64, lr=0.1), 10**5, 768).stop_on == "accuracy"
    # a fit records the optimiser it used; the limit counts words x features of one layer, not layers
    monkeypatch.setattr(fitting, "AUTO_LBFGS_MAX_ENTRIES", 300 * 4)
    x, y = _planted(300, 4, [1.0, 1.0, 1.0], 3, seed=0)
    assert fit_probe(x, y).config.optimizer == "lbfgs"
    assert fit_probe(x[:1, :, :3], y).config.optimizer == "lbfgs"
    x, y = _planted(301, 4, [1.0], 3, seed=0)
    assert fit_probe(x, y).config.optimizer == "adam"


# --------------------------------------------------------------------------- accuracy against convergence


@pytest.mark.slow
def test_default_fit_is_within_0_3_points_of_the_converged_fit_on_every_layer():
    """The default fit of a large planted problem (Adam by the rule) against full-batch L-BFGS run to
    its tolerance, on 30,000 evaluation words (a 0.3-point gap is ~90 words). The layers span chance
    to near-perfect accuracy (the planted strengths), so the test covers easy and hard probes alike."""
    c, h, strengths = 12, 48, [0.0, 0.12, 0.2, 0.3, 0.5, 1.0]  # chance .. 100%
    x_fit, y_fit = _planted(48_000, h, strengths, c, seed=1)
    x_stop, y_stop = _planted(5_000, h, strengths, c, seed=2)
    x_ev, y_ev = _planted(30_000, h, strengths, c, seed=3)
    assert x_fit.shape[1] * h > AUTO_LBFGS_MAX_ENTRIES  # the default takes the fast path here
    fast = fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=c)
    assert fast.config.optimizer == "adam"
    converged = fit_probe(x_fit, y_fit, num_classes=c, optimizer="lbfgs", early_stopping=False, max_iter=1000)
    assert converged.steps < 1000  # it reached its gradient tolerance
    acc_fast, acc_conv = fast.accuracy(x_ev, y_ev), converged.accuracy(x_ev, y_ev)
    assert acc_conv[1] < 0.35 and acc_conv[-1] > 0.95 and np.all(np.diff(acc_conv) > 0.02), acc_conv  # the span
    gap = (acc_fast - acc_conv) * 100
    assert np.all(np.abs(gap[1:]) <= 0.3), np.round(gap, 3)
    # Layer 0 is pure noise: the converged fit's accuracy there is chance plus what it fitted to the
    # noise, the early-stopped fit keeps the label prior (its dev loss never improves on it); both are
    # at chance, which is all a 0.3-point comparison could mean there.
    # (The polish may keep a checkpoint of its own there when the dev accuracy favours it by chance.)
    assert abs(acc_conv[0] - 1 / c) < 0.01 and abs(acc_fast[0] - 1 / c) < 0.01


def _memorisation(n: int, types: int, h: int, c: int, seed: int):
    """A control-task-like problem (Hewitt & Liang 2019): words of Zipf-distributed types, each type a
    fixed vector (anisotropic: its coordinates' scales fall as 1/sqrt(k), then rotated) plus a little
    noise, and ONE random label per type. Accuracy comes from memorising types, as on a model's first
    layers; seen types dominate every split, as they do in a corpus."""
    rng0 = np.random.default_rng(99)  # the same types and labels in every split
    emb = rng0.standard_normal((types, h)) * np.arange(1, h + 1) ** -0.5
    emb = (emb @ np.linalg.qr(rng0.standard_normal((h, h)))[0]).astype(np.float32)
    label = rng0.choice(c, types, p=np.r_[0.4, np.full(c - 1, 0.6 / (c - 1))])
    p = 1 / np.arange(1, types + 1)
    rng = np.random.default_rng(seed)
    t = rng.choice(types, n, p=p / p.sum())
    return (emb[t] + 0.01 * rng.standard_normal((n, h), dtype=np.float32))[None], label[t]


@pytest.mark.slow
def test_default_fit_memorises_a_control_task_as_the_converged_fit_does():
    """Issue 49: six epochs of Adam memorise fewer per-type labels than the regularised optimum (on
    SmolLM2's control task, layers 0 and 1, 3.3 and 2.4 points below the converged fit). Here the Adam
    fit alone (`polish: 0`, the default before) is >1 point below L-BFGS run to its tolerance; the
    default, Adam then up to 300 L-BFGS iterations from its weights kept by dev accuracy, is within 0.3."""
    c, h, types = 10, 128, 2000
    x_fit, y_fit = _memorisation(20_000, types, h, c, seed=1)
    x_stop, y_stop = _memorisation(4_000, types, h, c, seed=2)
    x_ev, y_ev = _memorisation(20_000, types, h, c, seed=3)
    assert x_fit.shape[1] * h > AUTO_LBFGS_MAX_ENTRIES  # the default takes the Adam path
    converged = fit_probe(x_fit, y_fit, num_classes=c, optimizer="lbfgs", early_stopping=False, max_iter=2000)
    assert converged.steps < 2000
    acc_conv = converged.accuracy(x_ev, y_ev)[0]
    adam_only = fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=c, polish=0).accuracy(x_ev, y_ev)[0]
    fast = fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=c)
    assert fast.config.optimizer == "adam" and fast.config.polish == 300
    acc_fast = fast.accuracy(x_ev, y_ev)[0]
    assert (acc_conv - adam_only) * 100 > 1.0, (adam_only, acc_conv)
    assert (acc_fast - acc_conv) * 100 >= -0.3, (acc_fast, acc_conv)


# --------------------------------------------------------------------------- memory


class _Lazy(LazyFeatures):
    """A lazy view over an in-memory array (what `probes.syntax.FeatureView` is over a cache)."""

    def __init__(self, base: np.ndarray):
        self.base = base
        self.shape = base.shape

    def _layer(self, layer, rows, out):
        out[:] = self.base[layer, rows]


def _rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MB."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))


@pytest.mark.slow
def test_minibatch_fit_holds_one_copy_of_the_features():
    """Peak memory of an Adam fit on lazy features (the syntax probe's FeatureView) beyond what the
    process held before: one float32 copy of the features (shuffled and standardised in place) plus
    one layer; the fit used to hold two (the materialised features, then a shuffled copy)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak-RSS counter (Linux)
            f.write("5")
    except OSError:
        pytest.skip("peak RSS cannot be reset here (/proc/self/clear_refs)")
    common = dict(num_classes=5, optimizer="adam", epochs=1, min_steps=1, early_stopping=False)
    fit_probe(*_planted(500, 4, [0.5], 5, seed=0), **common)  # the optimiser's one-off imports (~45 MB)
    x, y = _planted(60_000, 64, [0.5] * 8, 5, seed=0)  # 123 MB of features
    size_mb = x.nbytes / 2**20
    lazy = _Lazy(x)
    before, _ = _rss_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    res = fit_probe(lazy, y, **common)
    _, peak = _rss_mb()
    assert res.train_accuracy.min() > 0.5  # it did fit
    extra = (peak - before) / size_mb
    assert extra < 1.4, f"the fit held {extra:.2f}x the features' size at its peak"


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize("kw", [dict(optimizer="lbfgs"), dict(optimizer="adam", checks_per_epoch=2),
                                dict(kind="mlp", hidden=16, dropout=0.2, epochs=2, min_steps=1)],
                         ids=["lbfgs", "adam", "mlp-dropout"])
def test_device_given_any_way_gives_the_same_fit(kw):
    """"cpu", torch.device("cpu") and "auto" (cpu on a machine without CUDA) run the same code path:
    the one a cuda device takes (tensors placed on `config.device`, random draws from CPU generators)."""
    x, y = _planted(600, 8, [0.3, 1.0], 4, seed=5)
    xd, yd = _planted(200, 8, [0.3, 1.0], 4, seed=6)
    ref = fit_probe(x, y, xd, yd, num_classes=4, device="cpu", **kw)
    assert ref.config.device == "cpu"
    for device in (torch.device("cpu"), "auto"):
        if device == "auto" and torch.cuda.is_available():
            continue  # "auto" is cuda there: same draws, float sums in another order
        other = fit_probe(torch.from_numpy(x), y, xd, yd, num_classes=4, device=device, **kw)
        assert other.config.device == "cpu"
        for k in ref.weights:
            np.testing.assert_array_equal(other.weights[k], ref.weights[k])
        np.testing.assert_array_equal(other.dev_predictions, ref.dev_predictions)
    if torch.cuda.is_available():  # the same draws on CUDA; float sums in another order
        cuda = fit_probe(x, y, xd, yd, num_classes=4, device="cuda", **kw)
        assert cuda.config.device.startswith("cuda")
        np.testing.assert_allclose(cuda.dev_accuracy, ref.dev_accuracy, atol=0.02)
        assert (cuda.dev_predictions == ref.dev_predictions).mean() > 0.97


def test_auto_device_is_cuda_when_present(monkeypatch):
    assert fitting.resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fitting.resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert fitting.resolve_device("auto") == torch.device("cuda")
    assert fitting.merge_config({}, {}).device == "cuda"  # callers get the device the fit uses


def test_bad_device_or_checks_is_one_config_error_before_any_work():
    from probes import syntax
    from probes.core import runner

    with pytest.raises(ConfigError, match="device"):
        ProbeConfig(device="tpu")
    with pytest.raises(ConfigError, match="invalid probe config"):
        ProbeConfig(checks_per_epoch=0)
    with pytest.raises(ConfigError, match="device"):  # the syntax probe's settings refuse it up front
        runner.resolve_settings(syntax.PROBE, {"probe_config": {"device": "tpu"}}, "settings")
    for device in ("meta", "mps"):  # devices torch names but the fits cannot run on
        with pytest.raises(ConfigError, match="probe device must be"):
            ProbeConfig(device=device)
    if not torch.cuda.is_available():  # CUDA asked for where torch sees none: refused before any work
        with pytest.raises(ConfigError, match="no CUDA device"):
            runner.resolve_settings(syntax.PROBE, {"probe_config": {"device": "cuda"}}, "settings")


def _rss_file_mb() -> float:
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["RssFile"].split()[0]) / 1024


def test_release_file_pages_unmaps_a_read_only_memmap_and_keeps_its_data(tmp_path):
    """After a layer is copied, the fit drops the memmapped cache's pages from this process's RSS
    (they stay in the OS page cache): peak RSS is the copy, not the copy plus the file."""
    x = np.random.default_rng(0).standard_normal((4, 40_000, 64), dtype=np.float32)  # 41 MB
    np.save(tmp_path / "x.npy", x)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    lazy = _Lazy(mm)
    before = _rss_file_mb()
    assert float(np.asarray(mm[1:3]).sum()) == pytest.approx(float(x[1:3].sum(dtype=np.float64)), rel=1e-4)
    mapped = _rss_file_mb() - before
    assert mapped > 15  # the two layers read are resident (20 MB)
    assert fitting.release_file_pages(lazy)  # through the view's .base, as FeatureView holds its cache
    assert _rss_file_mb() - before < 0.2 * mapped
    np.testing.assert_array_equal(mm[2, :5], x[2, :5])  # the data read back unchanged
    assert not fitting.release_file_pages(x)  # an in-memory array: nothing to release
    assert not fitting.release_file_pages(np.load(tmp_path / "x.npy", mmap_mode="r+"))  # writable: left alone
    assert not fitting.release_file_pages(torch.zeros(3))


def test_standardisation_keeps_the_spread_of_a_massive_activation_dimension():
    """A dimension with a mean 10^3 times its spread (a Llama-style model's massive activations):
    float32 sums of x and x^2 lost its variance to cancellation (sd 0.14 for a true 0.30 at 200k
    words); its layer's sums recomputed in float64 give numpy's mean and sd, for `standardisation` and for the
    minibatch fit's copy alike."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((2, 200_000, 4))
    x64 = base * np.array([0.3, 1.0, 0.3, 2.0]) + np.array([1000.0, 3000.0, 0.0, -500.0])
    x = torch.from_numpy(x64.astype(np.float32))
    want_mu, want_sd = x.double().numpy().mean(1), x.double().numpy().std(1)
    mu, sd = fitting.standardisation(x, True)
    np.testing.assert_allclose(sd.numpy(), want_sd, rtol=1e-5)
    np.testing.assert_allclose(mu.numpy(), want_mu, rtol=1e-6, atol=1e-4)
    _, mu2, sd2 = fitting.training_copy(x, [0, 1], torch.arange(x.shape[1]), "cpu", True)
    np.testing.assert_allclose(sd2.numpy(), want_sd, rtol=1e-5)
    np.testing.assert_allclose(mu2.numpy(), want_mu, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("k,batches", [(3, 5), (50, 5)])
def test_steps_count_the_dev_checks_made_with_or_without_a_dev_set(k, batches):
    """`checks_per_epoch` k checks after every 1/k of an epoch's batches; when k exceeds the batches
    an epoch has, a check falls after every batch. `steps` counts the checks made, the same with a dev
    set (patience never reached) as without one (it said epochs x k there)."""
    x, y = _planted(batches * 32, 4, [1.0], 3, seed=7)
    xd, yd = _planted(60, 4, [1.0], 3, seed=8)
    common = dict(num_classes=3, optimizer="adam", epochs=4, min_steps=1, batch_size=32, checks_per_epoch=k,
                  patience=1000, polish=0)
    with_dev = fit_probe(x, y, xd, yd, **common)
    without = fit_probe(x, y, **common)
    # an epoch has `batches` or `batches + 1` batches (its random offset may cut one short batch)
    assert with_dev.steps == without.steps and 4 * min(k, batches) <= without.steps <= 4 * min(k, batches + 1)
