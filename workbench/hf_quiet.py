"""`quiet_transformers()`: transformers' per-load report and progress bars silenced for a block.

One home for the context manager every model loader of the workbench wraps `from_pretrained` in
(`ModelHandle.load` and `save`, the fine-tuning, distillation and PEFT loaders, LM scoring's
heads). It imports nothing from the workbench, so any module may use it without an import circle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' per-load report and progress bar, and restore both after: the loaders
    check the loading info themselves (`ModelHandle.load`: missing body weights are an error, a
    missing LM head is recorded) and the unused pretraining heads transformers reports (NSP,
    pooler) are expected, once per checkpoint of a sweep."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
