"""One way to run a model: named activation points, one activation cache, hooks that edit.

`ModelRunner(model)` runs any model the workbench opens (BERT-like encoders, GPT/Llama-like causal
LMs, T5/BART encoder-decoders, ELMo) and names what flows through it the way TransformerLens does
(Nanda & Bloom 2022; the residual-stream view of Elhage et al. 2021):

| name | what | where it is read |
|---|---|---|
| `embed` | the residual stream entering block 0 (HF `hidden_states[0]`) | every family |
| `blocks.{i}.resid_post` | block i's output | every family (ELMo: LSTM layer i, [forward; backward]) |
| `final` | the stack's output: the last block's, after the final norm of a pre-LN stack (GPT-2 `ln_f`, Llama `norm`, T5 `final_layer_norm`) | every family |
| `blocks.{i}.attn.pattern` | attention probabilities [B, heads, T, T] | attention families (eager attention) |
| `blocks.{i}.cross_attn.pattern` | the decoder's cross-attention probabilities | encoder-decoders |
| `blocks.{i}.attn.z` | the heads' context vectors [B, T, heads x d_head], the input of the attention output projection | `workbench.running.sites` families |
| `blocks.{i}.mlp_out` | the MLP's output (last projection, bias included) before the residual add | `workbench.running.sites` families |

An encoder-decoder prefixes every name with its stack: `encoder.blocks.0.resid_post`,
`decoder.final`. The workbench's layer convention (layer 0 = the embedding output, layer k = block
k's output, the last one after the final norm; Tenney et al. 2019, Liu et al. 2019) is
`ActivationCache.layers(stack)`: `embed`, `blocks.0..L-2.resid_post`, `final`.

The residual stream and attention patterns come from the outputs transformers records itself
(`output_hidden_states`, `output_attentions`: its own per-family capture hooks), so a cached run
computes exactly what an uncached one does, the same ops in the same order; `attn.z`, `mlp_out`
and the last block's un-normed output of a pre-LN stack come from forward hooks on the modules.

Edits: `runner.hooks({name: fn})` (a context manager) registers `fn(tensor) -> tensor | None` at
each named point (`attn.z`, `mlp_out`, `resid_post`) for every forward the model runs inside it,
whoever calls the model; a returned tensor replaces the activation, and a run inside the block
caches the edited value. Head gating (`workbench.drivers.head_pruning.gates`, Michel et al. 2019)
is such an edit of `attn.z` and `mlp_out`.

Who runs through it: `ModelHandle.forward` / `word_states` (`workbench.running.handle_running`), LM
scoring (`workbench.running.lm_scores.LMScorer.runner`), the logit lens (`workbench.running.logit_lens`) and head
gating. Each keeps the call path it had (bodies for the handle, the whole model for LM scores and
the seq2seq/ELMo lens), so every number is what it was, bit for bit.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from workbench.errors import ConfigError, WorkbenchError
from workbench.families import ModelTypeTable
from workbench.running.sites import attention_sites

Edit = Callable[[torch.Tensor], "torch.Tensor | None"]

# Modules a pre-LN stack applies to its last block's output before handing it on (the stack root's
# attribute): GPT-2 `ln_f`, Llama `norm`, T5 `final_layer_norm`, mBART `layer_norm`.
FINAL_NORMS = ("ln_f", "norm", "final_layer_norm", "layer_norm")
_NAME = re.compile(r"^(?:(encoder|decoder)\.)?(embed|final|blocks\.(\d+)\.(resid_post|attn\.pattern|cross_attn\.pattern"
                   r"|attn\.z|mlp_out))$")
_HOOKED = ("attn.z", "mlp_out")
# model types of left-to-right LMs: the causal families' (`FamilySpec.causal`) and foreign ones
CAUSAL_MODEL_TYPES = ModelTypeTable(dict.fromkeys(("gpt_neo", "gptj", "llama", "mistral", "qwen2", "opt", "bloom"), True),
                                    lambda spec: True if spec.causal else None, primary=False)
# model types whose blocks have no attention pattern to hook (`FamilySpec.attention_patterns`: ELMo's LSTMs)
NO_ATTENTION_MODEL_TYPES = ModelTypeTable({}, lambda spec: None if spec.attention_patterns else True, primary=False)


def stack_names(model: nn.Module) -> tuple[str, ...]:
    """A model's stacks: ("encoder", "decoder") for an encoder-decoder, ("decoder",) for a causal
    LM (its class, model type or `config.is_decoder` says so), else ("encoder",) (bidirectional
    encoders, ELMo)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return ("encoder", "decoder")
    causal_head = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
    if causal_head or getattr(config, "model_type", "") in CAUSAL_MODEL_TYPES or getattr(config, "is_decoder", False):
        return ("decoder",)
    return ("encoder",)


@dataclass
class Stack:
    """One stack of a model: its name ("encoder" | "decoder"), the prefix of its hook names, the
    module that runs it, its depth, its final norm (None: post-LN or none) and its blocks in depth
    order (None where they are not distinct modules: ALBERT's shared layer, ELMo's LSTMs)."""

    name: str
    prefix: str
    root: nn.Module
    num_layers: int
    final_norm: nn.Module | None
    blocks: list[nn.Module] | None


def _block_class(root: nn.Module):
    """The class transformers records hidden states from (`_can_record_outputs`), or None."""
    for cls in type(root).__mro__:
        spec = cls.__dict__.get("_can_record_outputs")
        if spec and "hidden_states" in spec:
            target = spec["hidden_states"]
            return getattr(target, "target_class", target)
    return None


def _stack(name: str, prefix: str, root: nn.Module, num_layers: int) -> Stack:
    norm = None
    for attr in FINAL_NORMS:
        mod = root._modules.get(attr) if hasattr(root, "_modules") else None
        if mod is not None:
            norm = mod
            break
    cls = _block_class(root)
    blocks = [m for m in root.modules() if cls is not None and isinstance(m, cls)]
    return Stack(name, prefix, root, num_layers, norm, blocks if len(blocks) == num_layers else None)


def _layers(config, key: str) -> int:
    for attr in {"encoder": ("encoder_layers", "num_layers"), "decoder": ("decoder_layers", "num_decoder_layers"),
                 "single": ("num_hidden_layers",)}[key]:
        value = getattr(config, attr, None)
        if value:
            return int(value)
    raise WorkbenchError(f"{type(config).__name__}: no layer count in the config")


@dataclass
class ActivationCache:
    """name -> tensor of one run (see the module docstring for the names), plus the stacks' depth."""

    tensors: dict[str, torch.Tensor]
    num_layers: dict[str, int] = field(default_factory=dict)
    prefixes: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def keys(self):
        return self.tensors.keys()

    def layers(self, stack: str) -> tuple[torch.Tensor, ...]:
        """The stack's L+1 layer states in the workbench's convention (HF `hidden_states`):
        `embed`, `blocks.0..L-2.resid_post`, `final`."""
        p, L = self.prefixes[stack], self.num_layers[stack]
        return (self.tensors[p + "embed"], *(self.tensors[f"{p}blocks.{i}.resid_post"] for i in range(L - 1)),
                self.tensors[p + "final"])

    def patterns(self, stack: str, cross: bool = False) -> tuple[torch.Tensor, ...] | None:
        """The stack's L attention patterns (cross-attention with `cross`), None if not cached."""
        p, L = self.prefixes[stack], self.num_layers[stack]
        key = "cross_attn" if cross else "attn"
        names = [f"{p}blocks.{i}.{key}.pattern" for i in range(L)]
        return tuple(self.tensors[n] for n in names) if names and names[0] in self.tensors else None


@dataclass
class Run:
    """One forward: `output` is what the model (`head=True`) or the last stack run returned (HF
    output object), `outputs` each stack's output (body runs), `cache` the activations asked for."""

    output: Any
    outputs: dict[str, Any]
    cache: ActivationCache


class ModelRunner:
    """Runs one model with named activation points (module docstring)."""

    def __init__(self, model: nn.Module):
        self.model = model
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            self.stacks = (_stack("encoder", "encoder.", model.get_encoder(), _layers(config, "encoder")),
                           _stack("decoder", "decoder.", model.get_decoder(), _layers(config, "decoder")))
        else:
            self.stacks = (_stack(stack_names(model)[0], "", model.base_model, _layers(config, "single")),)
        self._by_prefix = {s.prefix: s for s in self.stacks}
        self._sites = None
        self._edited: dict[str, int] = {}  # names with an active edit (`hooks`) -> how many

    # ------------------------------------------------------------------ names

    def stack(self, name: str) -> Stack:
        for s in self.stacks:
            if s.name == name:
                return s
        raise ConfigError(f"{type(self.model).__name__} has no {name!r} stack (stacks: {[s.name for s in self.stacks]})")

    def sites(self):
        """`workbench.running.sites.attention_sites` of the model (head and MLP modules), found once."""
        if self._sites is None:
            self._sites = attention_sites(self.model)
        return self._sites

    def hook_names(self) -> list[str]:
        """Every activation point of this model, in depth order per stack."""
        names = []
        for s in self.stacks:
            p = s.prefix
            names.append(p + "embed")
            for i in range(s.num_layers):
                names.append(f"{p}blocks.{i}.resid_post")
                if getattr(self.model.config, "model_type", "") not in NO_ATTENTION_MODEL_TYPES:
                    names.append(f"{p}blocks.{i}.attn.pattern")
                if s.name == "decoder" and len(self.stacks) == 2:
                    names.append(f"{p}blocks.{i}.cross_attn.pattern")
                if self._has_sites() and len(self.stacks) == 1:
                    names += [f"{p}blocks.{i}.attn.z", f"{p}blocks.{i}.mlp_out"]
            names.append(p + "final")
        return names

    def layer_names(self, stack: str) -> list[str]:
        """The names of a stack's L+1 layers in the workbench's convention (`ActivationCache.layers`)."""
        s = self.stack(stack)
        return [s.prefix + "embed", *(f"{s.prefix}blocks.{i}.resid_post" for i in range(s.num_layers - 1)),
                s.prefix + "final"]

    def pattern_names(self, stack: str, cross: bool = False) -> list[str]:
        """The names of a stack's L attention patterns (cross-attention with `cross`)."""
        s = self.stack(stack)
        return [f"{s.prefix}blocks.{i}.{'cross_attn' if cross else 'attn'}.pattern" for i in range(s.num_layers)]

    def _has_sites(self) -> bool:
        try:
            self.sites()
        except WorkbenchError:
            return False
        return True

    def _parse(self, name: str) -> tuple[Stack, str, int | None]:
        m = _NAME.match(name)
        if m is None or (m.group(1) is None) != (len(self.stacks) == 1):
            raise ConfigError(f"unknown activation point {name!r} for {type(self.model).__name__}; "
                              f"e.g. {self.hook_names()[:4]}")
        stack = self._by_prefix[f"{m.group(1)}." if m.group(1) else ""]
        layer = int(m.group(3)) if m.group(3) is not None else None
        if layer is not None and layer >= stack.num_layers:
            raise ConfigError(f"activation point {name!r}: the {stack.name} has layers 0-{stack.num_layers - 1}")
        return stack, m.group(4) or m.group(2), layer

    # ------------------------------------------------------------------ hooks

    def _module_of(self, stack: Stack, point: str, layer: int, name: str) -> tuple[nn.Module, bool]:
        """(module, pre-hook?) at which point `point` of `layer` is read or edited."""
        if point in _HOOKED:
            if len(self.stacks) != 1:
                raise ConfigError(f"{name!r}: per-head points are defined for single-stack models only")
            site = self.sites()[layer]
            return (site.out_proj, True) if point == "attn.z" else (site.mlp_out, False)
        if point == "resid_post":
            if stack.blocks is None:
                raise ConfigError(f"{name!r}: {type(self.model).__name__}'s blocks are not distinct modules here")
            return stack.blocks[layer], False
        raise ConfigError(f"{name!r} cannot be edited (edit attn.z, mlp_out or resid_post)")

    @contextlib.contextmanager
    def hooks(self, edits: Mapping[str, Edit]) -> Iterator[None]:
        """Apply `fn(activation) -> replacement | None` at each named point (`attn.z`, `mlp_out`,
        `resid_post`) in every forward inside the block; removed on exit."""
        handles, names = [], []
        try:
            for name, fn in edits.items():
                stack, point, layer = self._parse(name)
                module, pre = self._module_of(stack, point, layer, name)
                handles.append(_register(module, pre, fn))
                names.append(name)
                self._edited[name] = self._edited.get(name, 0) + 1
            yield
        finally:
            for h in handles:
                h.remove()
            for name in names:
                self._edited[name] -= 1
                if not self._edited[name]:
                    del self._edited[name]

    # ------------------------------------------------------------------ running

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, names: Sequence[str] | str = (),
            decoder_input_ids: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
            head: bool = False, decoder_kwargs: Mapping[str, Any] | None = None, **kwargs) -> Run:
        """One forward, caching the activation points `names` ("all": every point of the stacks run).

        `head=True` runs the whole model (its LM or task head included: `Run.output.logits`);
        otherwise the bodies only: an encoder-decoder's encoder, then its decoder when
        `decoder_input_ids` are given (reading the encoder's last state through cross-attention).
        `kwargs` go to the model (or each stack: `position_ids`, ELMo's `char_ids`), `decoder_kwargs`
        to the decoder of a body run only."""
        ran = [s for s in self.stacks if s.name == "encoder" or decoder_input_ids is not None or len(self.stacks) == 1]
        wanted = self._wanted(names, ran)
        parsed = [(n, *self._parse(n)) for n in wanted]
        flags = {}
        if any(p in ("embed", "final", "resid_post") for _, _, p, _ in parsed):
            flags["output_hidden_states"] = True
        if any(p.endswith("pattern") for _, _, p, _ in parsed):
            flags["output_attentions"] = True
        captured: dict[str, torch.Tensor] = {}
        # read by a hook of its own: per-head points, a pre-LN stack's last block (its recorded state
        # is after the final norm), and an edited block (transformers records it before the edit)
        hooked = [(n, s, p, i) for n, s, p, i in parsed
                  if p in _HOOKED or n in self._edited
                  or (p == "resid_post" and i == s.num_layers - 1 and s.final_norm is not None)]
        with self._capture(hooked, captured):
            outputs = self._forward(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, head,
                                    {**kwargs, **flags}, dict(decoder_kwargs or {}))
        tensors = {}
        for n, s, p, i in parsed:
            tensors[n] = captured[n] if n in captured else _read(outputs, s, p, i, head, len(self.stacks))
        cache = ActivationCache(tensors, {s.name: s.num_layers for s in self.stacks},
                                {s.name: s.prefix for s in self.stacks})
        main = outputs["model"] if head else outputs[ran[-1].name]
        return Run(main, outputs, cache)

    def run_with_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, names: Sequence[str] | str = "all",
                       **kwargs) -> tuple[Any, ActivationCache]:
        """(output, cache): `run` caching `names` (default every point)."""
        r = self.run(input_ids, attention_mask, names=names, **kwargs)
        return r.output, r.cache

    def _wanted(self, names, ran: list[Stack]) -> list[str]:
        if isinstance(names, str):
            if names != "all":
                raise ConfigError(f"names must be a list of activation points or 'all', got {names!r}")
            keep = {s.prefix for s in ran}
            return [n for n in self.hook_names() if self._parse(n)[0].prefix in keep]
        return list(names)

    def _forward(self, ids, mask, dec_ids, dec_mask, head, kwargs, decoder_kwargs) -> dict[str, Any]:
        model = self.model
        if head:
            extra = {} if dec_ids is None else {"decoder_input_ids": dec_ids, "decoder_attention_mask": dec_mask}
            return {"model": model(input_ids=ids, attention_mask=mask, return_dict=True, **extra, **kwargs)}
        if len(self.stacks) == 1:
            return {self.stacks[0].name: model.base_model(input_ids=ids, attention_mask=mask, return_dict=True,
                                                          **kwargs)}
        enc = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True, **kwargs)
        out = {"encoder": enc}
        if dec_ids is not None:
            out["decoder"] = model.get_decoder()(input_ids=dec_ids, attention_mask=dec_mask,
                                                 encoder_hidden_states=enc.last_hidden_state,
                                                 encoder_attention_mask=mask, use_cache=False, return_dict=True,
                                                 **kwargs, **decoder_kwargs)
        return out

    @contextlib.contextmanager
    def _capture(self, hooked, captured: dict) -> Iterator[None]:
        handles = []
        try:
            for name, stack, point, layer in hooked:
                module, pre = self._module_of(stack, point, layer, name)
                handles.append(_register(module, pre, _recorder(captured, name)))
            yield
        finally:
            for h in handles:
                h.remove()


def _recorder(captured: dict, name: str) -> Edit:
    def record(t: torch.Tensor) -> None:
        captured[name] = t
    return record


def _register(module: nn.Module, pre: bool, fn: Edit):
    """A forward (pre-)hook applying `fn` to the module's first input (pre) or first output."""
    if pre:
        def pre_hook(mod, args):
            new = fn(args[0])
            return None if new is None else (new, *args[1:])
        return module.register_forward_pre_hook(pre_hook)

    def hook(mod, args, output):
        first = output[0] if isinstance(output, tuple) else output
        new = fn(first)
        if new is None:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new
    return module.register_forward_hook(hook)


def _read(outputs: dict, stack: Stack, point: str, layer: int | None, head: bool, n_stacks: int) -> torch.Tensor:
    """An activation point from the outputs transformers recorded (hidden states, attentions)."""
    if head:
        out = outputs["model"]
        pre = "" if n_stacks == 1 else f"{stack.name}_"
        hs = getattr(out, f"{pre}hidden_states", None)
        att = getattr(out, f"{pre}attentions", None) if point == "attn.pattern" else getattr(out, "cross_attentions", None)
    else:
        out = outputs[stack.name]
        hs = getattr(out, "hidden_states", None)
        att = getattr(out, "attentions" if point == "attn.pattern" else "cross_attentions", None)
    if point == "embed":
        return hs[0]
    if point == "final":
        return hs[-1]
    if point == "resid_post":
        return hs[layer + 1]
    if att is None:
        raise WorkbenchError(f"{point}: the model returned no attentions (load it with eager attention)")
    return att[layer]
