"""`bertology.load` and its `Model`, a checkpoint opened for a notebook over the workbench's one model handle.

`Model` is a thin view of `workbench.running.models.ModelHandle` (the handle every probe runs) and
of the checkpoints its source names: a step folder, a training folder (every saved step; the handle
is the last one's), a Hub name in the local Hugging Face cache, or a model made from another
(`derive`). Nothing here runs a model its own way: `run_with_cache` is the handle's, through
`workbench.running.ModelRunner`'s named activation points (TransformerLens's vocabulary:
`embed`, `blocks.{i}.resid_post`, `blocks.{i}.attn.pattern`, `final`, ...).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence


class Model:
    """A model for notebooks: `.family`, `.layers`, `.derive(...)`, `.save(...)`, `.run_with_cache(...)`.

    `handle` is the workbench's `ModelHandle` (word-aligned states, LM scores, the runner) for
    anything this facade does not cover; `checkpoints` are what `bertology.probe` probes: the
    folders the source named (every step of a training folder) with the loaded handle attached to
    the last one, so probing it loads nothing twice. A derived model has no folder: it is probed
    in memory, identified by the hash of its tensors.

    >>> model = bertology.load("sentence-transformers/all-MiniLM-L6-v2")   # doctest: +SKIP
    >>> model.family, list(model.layers)                                    # doctest: +SKIP
    ('bert', [0, 1, 2, 3, 4, 5, 6])
    """

    def __init__(self, handle, checkpoints: Sequence[Any] = (), source: str | None = None):
        self.handle = handle
        self.checkpoints = list(checkpoints)
        self.source = source

    # ------------------------------------------------------------------ what it is
    @property
    def name(self) -> str:
        """The name the rows give it: the checkpoint's (`workbench.store.checkpoints.checkpoint_name`)."""
        if self.checkpoints:
            return self.checkpoints[-1].name
        return f"in-memory-{self.handle.checkpoint_hash[:8]}"

    @property
    def family(self) -> str:
        return self.handle.family

    @property
    def stacks(self) -> tuple[str, ...]:
        """"encoder", "decoder", or both for an encoder-decoder."""
        return tuple(self.handle.stacks)

    @property
    def layers(self) -> range:
        """The layers the probes report for the first stack: 0 (the embedding output) to L (the last
        block), the rows' `layer` column (`num_layers` gives every stack's L)."""
        return range(self.handle.num_layers[self.stacks[0]] + 1)

    @property
    def num_layers(self) -> dict[str, int]:
        return dict(self.handle.num_layers)

    @property
    def hidden_size(self) -> int:
        return self.handle.hidden_size

    @property
    def path(self) -> Path | None:
        return self.handle.path

    @property
    def lineage(self):
        """Where a derived model comes from (`workbench.running.models.Lineage`), None otherwise."""
        return self.handle.lineage

    def hook_names(self) -> list[str]:
        """Every activation point `run_with_cache` can return, in depth order."""
        return self.handle.runner.hook_names()

    # ------------------------------------------------------------------ models made from this one
    def derive(self, transform: str, params: Mapping[str, Any] | None = None,
               apply: Callable[..., Any] | None = None) -> "Model":
        """A new model made from this one (`ModelHandle.derive`; this one is never changed):
        a registered transform by name, e.g. the random-init twin, or your own `apply(model, **params)`.

        >>> twin = model.derive("random_init", {"seed": 7919})   # doctest: +SKIP
        >>> twin.lineage.transform                                # doctest: +SKIP
        'random_init'
        """
        return Model(self.handle.derive(transform, params, apply))

    def save(self, folder: str | Path, overwrite: bool = False) -> Path:
        """Write it as a plain checkpoint folder (`ModelHandle.save`: weights, tokenizer, a manifest
        recording its lineage); `bertology.load(folder)` opens it again.

        >>> model.derive("random_init", {"seed": 1}).save("runs/derived/minilm-random")   # doctest: +SKIP
        PosixPath('runs/derived/minilm-random')
        """
        return self.handle.save(folder, overwrite=overwrite)

    # ------------------------------------------------------------------ running
    def run_with_cache(self, inputs: str | Sequence[str] | Sequence[Sequence[str]], names: Sequence[str] | str = "all",
                       truncate: bool = False):
        """Run texts (split at white space into words) or pre-split sentences (lists of words) in
        one batch and return the activations by the runner's hook names (an
        `workbench.running.runner.ActivationCache`: `cache["blocks.0.resid_post"]` is a tensor
        [sentences, tokens, hidden]; `cache.layers("encoder")` the L+1 layer states). `names`
        limits what is kept ("all": `hook_names()`).

        >>> cache = model.run_with_cache("The cat sat on the mat .")   # doctest: +SKIP
        >>> cache["blocks.0.resid_post"].shape                          # doctest: +SKIP
        torch.Size([1, 9, 384])
        """
        sentences = as_sentences(inputs)
        return self.handle.run_with_cache(sentences, names=names, truncate=truncate)[1]

    # ------------------------------------------------------------------ display
    def describe(self) -> dict[str, Any]:
        """What it is, as a dict (the HTML and text reprs show this)."""
        out = {"name": self.name, "family": self.family, "stacks": ", ".join(self.stacks),
               "layers": ", ".join(f"{s}: 0-{n}" for s, n in self.num_layers.items()), "hidden size": self.hidden_size,
               "checkpoints": len(self.checkpoints) or "in memory", "sha256": self.handle.checkpoint_hash[:16]}
        if self.lineage is not None:
            out["derived"] = self.lineage.describe()
        return out

    def __repr__(self) -> str:
        return "Model(" + ", ".join(f"{k}={v!r}" for k, v in self.describe().items()) + ")"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td style='text-align:left'>"
                       f"{html.escape(str(v))}</td></tr>" for k, v in self.describe().items())
        return f"<table>{rows}</table>"


def as_sentences(inputs: str | Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    """Texts or sentences as lists of words: a text is split at white space (the handle joins words
    with one space, so that is the text it reads); a list of words is kept."""
    if isinstance(inputs, str):
        inputs = [inputs]
    out = []
    for item in inputs:
        words = item.split() if isinstance(item, str) else [str(w) for w in item]
        if not words:
            raise ValueError(f"an empty sentence in {inputs!r}")
        out.append(words)
    return out


def load(name_or_path: str | Path | Model, device: str = "cpu", dtype: str = "fp32") -> Model:
    """Open a checkpoint folder, a training folder (every saved step; its last is loaded) or a Hub
    name in the local Hugging Face cache (never the network), as every command resolves
    `--checkpoint` (`workbench.store.checkpoints.expand_checkpoints`). A bad name is the CLI's
    one-line `CheckpointError`. `dtype`: fp32 | bf16 | auto, the forward's precision.

    >>> import bertology                                                      # doctest: +SKIP
    >>> model = bertology.load("sentence-transformers/all-MiniLM-L6-v2")     # doctest: +SKIP
    >>> model.family, model.num_layers                                        # doctest: +SKIP
    ('bert', {'encoder': 6})
    """
    from workbench.running.models import ModelHandle
    from workbench.store.checkpoints import expand_checkpoints

    if isinstance(name_or_path, Model):
        return name_or_path
    checkpoints = expand_checkpoints([name_or_path])
    last = checkpoints[-1]
    last.handle = ModelHandle.load(last.path, device=device, dtype=dtype)
    return Model(last.handle, checkpoints, source=str(name_or_path))
