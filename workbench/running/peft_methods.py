"""Parameter-efficient fine-tuning: what trains, and how the trained model is saved so probes read it.

`bertology finetune --method M` (or `method:` in the fine-tuning YAML) picks one of `METHODS`; the
fine-tuning runner (`workbench.drivers.finetune.train_seed`) builds its classifier as always, then
`attach(model, method, options)` changes the model where the method needs new modules and returns
the `workbench.loop.ParamFilter` that freezes everything else. The classifier head always trains
(it starts from random weights), as in every paper cited here.

| method | trains (besides the head) | trainable values | reference |
|---|---|---|---|
| full | everything | all | Devlin et al. 2019 |
| head | nothing | head only | (ELMo's frozen-feature setting) |
| bitfit | every bias term | sum of bias sizes | Ben Zaken, Ravfogel & Goldberg 2022 |
| adapter | a bottleneck after each attention and each feed-forward block, and every layer norm | (2*d*m + m + d) per adapter + 2*d per layer norm | Houlsby et al. 2019 |
| prompt | n input vectors placed before the text | n * d_embedding | Lester, Al-Rfou & Constant 2021 |
| lora | low-rank updates B A of the attention's query and value matrices | r * (d_in + d_out) per matrix | Hu et al. 2022 |

What follows the papers (and their code) and the named options that keep the variants:

- **Adapters** (Houlsby et al. 2019, google-research/adapter-bert): the adapter takes the sublayer's
  output after its projection *and its dropout*, before the residual sum and the layer norm
  (adapter-bert's `transformer_model`: dense, dropout, adapter, layer_norm(x + input)); the
  optimizer trains the adapters, every layer norm of the body (adapter-bert's `layer_norm`
  collection, the embeddings' included) and the head. `adapter_norms: frozen` keeps the layer norms
  frozen (adapters and head only). Where a family applies its dropout as a function (BART) or has
  none there (Llama; ALBERT's feed-forward block, DistilBERT's attention), the adapter follows the
  projection, which is the same place in evaluation.
- **LoRA** (Hu et al. 2022): query and value only (`lora_targets: qv`). GPT-2 computes Q, K and V
  with one fused projection (`c_attn`, d -> 3d; DeBERTa v1's `in_proj` likewise, interleaved per
  head): `FusedQVLoRA` adds one rank-r update to the query outputs and one to the value outputs of
  it and leaves the key outputs exactly as they were, as Hu et al.'s `MergedLinear(...,
  enable_lora=[True, False, True])` does for GPT-2. `lora_targets: qkv` adds the key matrix (for a
  fused projection: one rank-r update of the whole d -> 3d matrix, what this module did before).
- **BERT's pooler** (the dense + tanh layer over [CLS] that BERT's classifier reads) belongs to the
  body, and the papers' code leaves it frozen (adapter-bert trains adapters, layer norms and head;
  peft's sequence-classification setting saves the classifier only): it was trained by next-sentence
  prediction. A checkpoint pretrained without NSP (this workbench's `objective.nsp: false`, whose
  pooler stayed at its random initialisation; SpanBERT's, saved without a pooler) has nothing
  pretrained there, and a frozen random dense + tanh would stand between [CLS] and the head in
  every method but full. `pooler: auto` (default) therefore trains the pooler with the head when
  the checkpoint's pooler is not pretrained (`pooler_pretrained`: the checkpoint's manifest
  records `objective.nsp: false`, or its weights hold no pooler) and leaves it frozen otherwise;
  `train` and `frozen` force either. The decision is part of the trainable filter's name in the
  manifest (`+pooler`).

Libraries. LoRA on separate query/value matrices is `peft`'s (`inject_adapter_in_model` on the
classifier's body, so the head stays ours and the parameter filter decides what trains); the fused
Q/V update is `FusedQVLoRA` below (peft has no per-slice LoRA). `adapters` (the maintained Houlsby
library) pins transformers 4.57 and cannot run with transformers 5, so the bottleneck is
`BottleneckAdapter` below. Prompt tuning is ours too: `peft`'s prompt tuning feeds `inputs_embeds`
with the virtual tokens first, so BERT's classifier would read a virtual token instead of [CLS] and
GPT-2's could not find the last non-pad token; here the prompt is n extra vocabulary ids inserted
after the tokenizer's prefix ([CLS], <s>; nothing for GPT-2), which every family's pooling reads
correctly.

Targets per model type (`ADAPTER_TARGETS`, `lora_targets`): each family's from its `FamilySpec`
(`workbench.families.base`), beside a small table of architectures that are no family here; ELMo
(an LSTM) supports full and head only (its `FamilySpec.peft_methods`).

What a saved checkpoint holds (the run's `best/` folder, a plain `save_pretrained` folder):
- full, head, bitfit: the weights, nothing more.
- lora: the updates merged into the weights (W + (alpha/r) B A): a plain checkpoint.
- adapter: the base architecture's weights plus `adapters.safetensors`; `reattach_adapters` puts the
  adapters back into the forward at the sites their names record (the loader reads the file and calls
  it: `workbench.running.model_loading.reattach_peft`, under `ModelHandle.load` and
  `workbench.running.classifier_loading.load_classifier`, so probes read the adapted layers; a checkpoint
  saved before the placement moved after the dropout gets its adapters back after the projection,
  where it was trained).
- prompt: the embedding matrix grows by n rows holding the prompt vectors and the tokenizer by n
  special tokens `<prompt_i>`; the manifest's `peft.prompt_ids` says where they go, and
  `ModelHandle.load` inserts them after the tokenizer's prefix in every sequence it runs (a
  tokenizer's own template is rebuilt by transformers on load, so it cannot carry them).

Concerns:
- the methods, their options and what they attach: `MethodOptions`, `check_method`, `body_of`,
  `attach`, `norm_modules`, `checkpoint_pooler_pretrained`
- adapters (Houlsby et al. 2019): `BottleneckAdapter`, `Adapted`, `adapter_sites`, `add_adapters`,
  `remove_adapters`
- prompt tuning (Lester et al. 2021): `PromptEmbedding`, `add_prompt`, `prompt_ids`, `insert_prompt`
- LoRA (Hu et al. 2022): `lora_targets`, `fused_slices`, `FusedQVLoRA`, `add_lora`, `merge_lora`
- saving a tuned model as a plain checkpoint, and reading it back: `plain_copy`, `save_extra`,
  `saved_adapter_file`, `reattach_adapters`
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from workbench.errors import CheckpointError, ConfigError
from workbench.families import ModelTypeTable
from workbench.families.base import BERT_ADAPTER_SITES, BERT_ADAPTER_SITES_BEFORE_DROPOUT
from workbench.loop import ParamFilter, biases_only, outside

METHODS = ("full", "head", "bitfit", "adapter", "prompt", "lora")
ADAPTER_NORMS = ("train", "frozen")
LORA_TARGET_SETS = ("qv", "qkv")
POOLER_CHOICES = ("auto", "train", "frozen")
ADAPTER_FILE = "adapters.safetensors"
PROMPT_TOKEN = "<prompt_{}>"

# model_type -> (after attention, after feed-forward): regexes of the module whose output an adapter
# takes. adapter-bert's place is after the sublayer's output projection and its dropout, before the
# residual sum: the dropout module where the family has one, else the projection (BART applies its
# dropout as a function; Llama has none; ALBERT applies none after its feed-forward block, DistilBERT
# none after its attention projection). Each family's own sites are in its `FamilySpec`
# (`adapter_sites`, for the model type its checkpoints are saved as); the tables below add the
# architectures that are no family here.
_BERT_LIKE = BERT_ADAPTER_SITES
ADAPTER_TARGETS = ModelTypeTable({
    "deberta": _BERT_LIKE, "xlm-roberta": _BERT_LIKE, "camembert": _BERT_LIKE,
    "mpnet": (r"attention\.dropout$", r"layer\.\d+\.output\.dropout$"),
    "llama": (r"self_attn\.o_proj$", r"mlp\.down_proj$"),
}, lambda spec: spec.adapter_sites)
# the sites before adapters moved after the dropout (checkpoints saved then name these)
ADAPTER_TARGETS_BEFORE_DROPOUT = ModelTypeTable({
    **{t: BERT_ADAPTER_SITES_BEFORE_DROPOUT for t in ("deberta", "xlm-roberta", "camembert")},
    "mpnet": (r"attention\.attn\.o$", r"layer\.\d+\.output\.dense$"),
    "llama": (r"self_attn\.o_proj$", r"mlp\.down_proj$"),
}, lambda spec: spec.adapter_sites_before_dropout)

# LoRA targets: query and value matrices by name (peft's per-model-type defaults where they name
# them, ours where peft has none: `FamilySpec.lora_targets`); a query name's key counterpart for
# `lora_targets: qkv`
LORA_TARGETS = ModelTypeTable({"mpnet": ["q", "v"]},
                              lambda spec: None if spec.lora_targets is None else list(spec.lora_targets))
_KEY_OF_QUERY = {"query": "key", "q_proj": "k_proj", "q": "k", "query_proj": "key_proj", "q_lin": "k_lin"}
_VALUE_NAMES = {"value", "v_proj", "v", "value_proj", "v_lin"}
# model_type -> its fused Q,K,V projection and the layout of the query/key/value outputs in it
# (`FamilySpec.fused_qkv`; DeBERTa v1's `in_proj` is no family here)
FUSED_QKV = ModelTypeTable({"deberta": ("in_proj", "per_head")}, lambda spec: spec.fused_qkv)
# model types whose projections are Conv1D (weights stored in x out): `FamilySpec.lora_fan_in_fan_out`
FAN_IN_FAN_OUT = ModelTypeTable({}, lambda spec: True if spec.lora_fan_in_fan_out else None)
# model types that support only some methods (`FamilySpec.peft_methods`; ELMo, an LSTM: full and head)
METHODS_OF_MODEL_TYPE = ModelTypeTable({}, lambda spec: spec.peft_methods)


@dataclass(frozen=True)
class MethodOptions:
    """The sizes and variants a method reads (the others ignore them)."""

    lora_r: int = 8
    lora_alpha: float = 16.0
    adapter_size: int = 64
    prompt_tokens: int = 20
    lora_targets: str = "qv"       # qv (Hu et al.) | qkv (adds the key matrix; GPT-2: the whole fused c_attn)
    adapter_norms: str = "train"   # train (Houlsby et al.: layer norms train with the adapters) | frozen
    pooler: str = "auto"           # auto (train it when not pretrained) | train | frozen


def check_method(method: str, options: MethodOptions, where: str) -> None:
    """Refuse an unknown method, a bad size or an unknown variant (a `ConfigError` naming `where`
    and the key)."""
    if method not in METHODS:
        raise ConfigError(f"{where}: method: unknown method {method!r} (known: {', '.join(METHODS)})")
    for key in ("lora_r", "adapter_size", "prompt_tokens"):
        v = getattr(options, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}: {key}: must be an integer >= 1, got {v!r}")
    if not options.lora_alpha > 0:
        raise ConfigError(f"{where}: lora_alpha: must be > 0, got {options.lora_alpha}")
    for key, known in (("lora_targets", LORA_TARGET_SETS), ("adapter_norms", ADAPTER_NORMS),
                       ("pooler", POOLER_CHOICES)):
        v = getattr(options, key)
        if v not in known:
            raise ConfigError(f"{where}: {key}: must be one of {', '.join(known)}, got {v!r}")


def body_of(model: nn.Module) -> nn.Module:
    """The pretrained body of a classifier or LM (what `head` freezes); a bare body is its own."""
    return getattr(model, model.base_model_prefix, model)


def _model_type(model) -> str:
    return getattr(model.config, "model_type", "")


def _either(name: str, *filters: ParamFilter) -> ParamFilter:
    return ParamFilter(name, lambda n, p: any(f.keep(n, p) for f in filters))


def _params_of(modules, name: str) -> ParamFilter:
    ids = {id(p) for m in modules for p in m.parameters()}
    return ParamFilter(name, lambda _, p: id(p) in ids)


def attach(model: nn.Module, method: str, options: MethodOptions = MethodOptions(),
           pooler_pretrained: bool | None = None) -> ParamFilter | None:
    """Add the modules `method` trains to `model` (a classifier from
    `workbench.running.classifier_loading.build_classifier`), in place, and return the filter of
    what trains (None: everything, i.e. full fine-tuning).

    `pooler_pretrained` (for `options.pooler == "auto"`): whether the body's pooler was pretrained;
    None reads it from the checkpoint the model was loaded from (`checkpoint_pooler_pretrained`).
    The filter's name (the manifest's `trainable.filter`) says what trains besides the method's
    own modules: `+layer_norms`, `+pooler`."""
    if method == "full":
        return None
    check_method(method, options, "attach")
    body = body_of(model)
    head = outside(body, "head_only")
    mtype = _model_type(model)
    if mtype in METHODS_OF_MODEL_TYPE and method not in METHODS_OF_MODEL_TYPE[mtype]:
        raise ConfigError(f"method {method}: not available for model type {mtype}; use "
                          f"{' or '.join(METHODS_OF_MODEL_TYPE[mtype])}")
    pooler = _pooler_module(body)
    trains_pooler = pooler is not None and (
        options.pooler == "train"
        or (options.pooler == "auto" and not (pooler_pretrained if pooler_pretrained is not None
                                              else checkpoint_pooler_pretrained(model)[0])))
    if trains_pooler:
        head = _either("head_only+pooler", head, _params_of([pooler], "pooler"))
    if method == "head":
        return head
    if method == "bitfit":
        return _either(f"bitfit+{head.name}", biases_only(), head)
    if method == "adapter":
        add_adapters(body, mtype, options.adapter_size)
        parts = [_named(r"\.adapter\."), head]
        name = f"adapter:{options.adapter_size}"
        if options.adapter_norms == "train":
            parts.append(_params_of(norm_modules(body), "layer_norms"))
            name += "+layer_norms"
        return _either(f"{name}+{head.name}", *parts)
    if method == "prompt":
        add_prompt(model, options.prompt_tokens)
        return _either(f"prompt:{options.prompt_tokens}+{head.name}", _named(r"\.prompt$"), head)
    if method == "lora":
        add_lora(body, mtype, options.lora_r, options.lora_alpha, options.lora_targets)
        return _either(f"lora:{options.lora_targets}:r{options.lora_r}:a{options.lora_alpha:g}+{head.name}",
                       _named(r"\.lora_[AB]\."), head)
    raise ConfigError(f"method: unknown method {method!r} (known: {', '.join(METHODS)})")


def _named(pattern: str) -> ParamFilter:
    regex = re.compile(pattern)
    return ParamFilter(pattern, lambda n, p: regex.search(n) is not None)


def norm_modules(body: nn.Module) -> list[nn.Module]:
    """Every normalisation layer of `body` (LayerNorm, and the RMS / T5 / DeBERTa variants)."""
    return [m for m in body.modules()
            if isinstance(m, nn.LayerNorm) or re.search(r"(LayerNorm|RMSNorm)$", type(m).__name__)]


# ---- BERT's pooler -----------------------------------------------------------------------------------


def _pooler_module(body: nn.Module) -> nn.Module | None:
    pooler = getattr(body, "pooler", None)
    return pooler if isinstance(pooler, nn.Module) and any(True for _ in pooler.parameters()) else None


def checkpoint_pooler_pretrained(model: nn.Module) -> tuple[bool, str]:
    """(pretrained?, why) for the pooler of the checkpoint `model` was loaded from
    (`model.name_or_path`). Not pretrained: the checkpoint's manifest records a BERT objective
    without next-sentence prediction (`objective.nsp: false`: the pooler was frozen at its random
    initialisation), or its weights hold no pooler (e.g. a masked-LM-only save such as SpanBERT's;
    transformers then initialises one randomly). Anything else (a Hub BERT trained with NSP, a
    folder this cannot read) counts as pretrained."""
    folder = Path(str(getattr(model, "name_or_path", "") or ""))
    if not str(folder) or not folder.is_dir():
        return True, "no checkpoint folder to read: assumed pretrained"
    from workbench.store.checkpoints import read_manifest, weight_names

    objective = (read_manifest(folder) or {}).get("objective") or {}
    if isinstance(objective, dict) and objective.get("nsp") is False:
        return False, "pretrained without next-sentence prediction (objective.nsp: false)"
    names = weight_names(folder)
    if names is None:
        return True, "no safetensors weights to read: assumed pretrained"
    if not any(n.startswith("pooler.") or ".pooler." in n for n in names):
        return False, "the checkpoint's weights hold no pooler"
    return True, "the checkpoint's weights hold a pooler"


# ---- bottleneck adapters (Houlsby et al. 2019) ------------------------------------------------------


class BottleneckAdapter(nn.Module):
    """x + up(gelu(down(x))): d -> m -> d with a residual. `up` starts at zero, so the adapted
    model starts exactly as the pretrained one (Houlsby et al. 2019 initialise near identity)."""

    def __init__(self, d: int, m: int):
        super().__init__()
        self.down = nn.Linear(d, m)
        self.up = nn.Linear(m, d)
        nn.init.normal_(self.down.weight, std=1e-3)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x):
        return x + self.up(nn.functional.gelu(self.down(x)))


class Adapted(nn.Module):
    """A module followed by its adapter. Wrapping the sublayer's output dropout gives adapter-bert's
    placement: projection, dropout, adapter, then the residual sum and layer norm."""

    def __init__(self, base: nn.Module, adapter: BottleneckAdapter):
        super().__init__()
        self.base = base
        self.adapter = adapter

    def forward(self, *args, **kwargs):
        return self.adapter(self.base(*args, **kwargs))


def _width(body: nn.Module) -> int:
    config = getattr(body, "config", None)
    d = getattr(config, "hidden_size", None)
    if not isinstance(d, int):
        raise ConfigError(f"adapter: cannot tell the hidden size of {type(body).__name__}")
    return d


def adapter_sites(body: nn.Module, model_type: str, table: dict | None = None) -> list[str]:
    """Names (in `body`) of the modules an adapter follows (`ADAPTER_TARGETS`)."""
    table = ADAPTER_TARGETS if table is None else table
    if model_type not in table:
        raise ConfigError(f"method adapter: no adapter placement for model type {model_type!r} "
                          f"(known: {', '.join(sorted(table))})")
    regexes = [re.compile(p) for p in table[model_type]]
    return [n for n, _ in body.named_modules() if n and any(r.search(n) for r in regexes)]


def add_adapters(body: nn.Module, model_type: str, size: int, sites: list[str] | None = None) -> list[str]:
    """Wrap every site (default `adapter_sites`) in `Adapted`, with an adapter of the body's hidden
    width (on the body's device and dtype); returns the sites."""
    sites = adapter_sites(body, model_type) if sites is None else sites
    if not sites:
        raise ConfigError(f"method adapter: no attention/feed-forward output found in {type(body).__name__}")
    d = _width(body)
    w = next(body.parameters())
    for name in sites:
        parent, attr = _parent(body, name)
        setattr(parent, attr, Adapted(getattr(parent, attr), BottleneckAdapter(d, size).to(w.device, w.dtype)))
    return sites


def remove_adapters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unwrap every `Adapted` of `model` in place; returns the adapters' tensors by full name."""
    tensors = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, Adapted):
            for k, v in module.adapter.state_dict().items():
                tensors[f"{name}.adapter.{k}"] = v.detach().clone().contiguous()
            parent, attr = _parent(model, name)
            setattr(parent, attr, module.base)
    return tensors


def _parent(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, attr = name.split(".")
    parent = root
    for p in path:
        parent = getattr(parent, p)
    return parent, attr


# ---- prompt tuning (Lester, Al-Rfou & Constant 2021) -----------------------------------------------


class PromptEmbedding(nn.Module):
    """The input embedding with n trainable rows after the vocabulary: ids >= V read `prompt`.
    The frozen matrix is `base.weight`; `weight` is exposed for code that reads it."""

    def __init__(self, base: nn.Embedding, n: int):
        super().__init__()
        self.base = base
        V, d = base.weight.shape
        self.vocab = V
        # initialised from random vocabulary rows, as Lester et al. found better than random vectors
        rows = torch.randint(0, V, (n,))
        self.prompt = nn.Parameter(base.weight.detach()[rows].clone())

    @property
    def weight(self):
        return self.base.weight

    @property
    def embedding_dim(self) -> int:
        return self.base.embedding_dim

    def forward(self, ids):
        is_prompt = ids >= self.vocab
        out = self.base(ids.clamp(max=self.vocab - 1))
        if not bool(is_prompt.any()):
            return out
        prompts = self.prompt[(ids - self.vocab).clamp(min=0, max=self.prompt.shape[0] - 1)]
        return torch.where(is_prompt.unsqueeze(-1), prompts.to(out.dtype), out)


def add_prompt(model: nn.Module, n: int) -> PromptEmbedding:
    base = model.get_input_embeddings()
    if not isinstance(base, nn.Embedding):
        raise ConfigError(f"method prompt: the input embedding of {type(model).__name__} is a "
                          f"{type(base).__name__}, not an embedding table")
    emb = PromptEmbedding(base, n)
    model.set_input_embeddings(emb)
    return emb


def prompt_ids(model: nn.Module) -> list[int]:
    """The vocabulary ids of the prompt vectors of a prompt-tuned model (empty for other methods)."""
    emb = model.get_input_embeddings()
    if isinstance(emb, PromptEmbedding):
        return list(range(emb.vocab, emb.vocab + emb.prompt.shape[0]))
    return []


def insert_prompt(ids, labels, ids_to_insert: list[int], at: int):
    """One encoded example with the prompt ids inserted at position `at` (token labels get -100
    there). numpy arrays in, numpy arrays out."""
    import numpy as np

    ids = np.concatenate([ids[:at], np.asarray(ids_to_insert, dtype=ids.dtype), ids[at:]])
    if not isinstance(labels, int):
        labels = np.concatenate([labels[:at], np.full(len(ids_to_insert), -100, dtype=labels.dtype), labels[at:]])
    return ids, labels


# ---- LoRA (Hu et al. 2022) ---------------------------------------------------------------------------


def lora_targets(model_type: str, which: str = "qv") -> list[str]:
    """Module names LoRA adapts in a body of `model_type`: its query and value matrices (`qv`), and
    its key matrix too (`qkv`); a family with a fused Q,K,V projection (`FUSED_QKV`) names that."""
    if model_type in FUSED_QKV:
        return [FUSED_QKV[model_type][0]]
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    qv = LORA_TARGETS.get(model_type) or [t for t in DEFAULTS.get(model_type, [])
                                          if t in _KEY_OF_QUERY or t in _VALUE_NAMES]
    if not qv:
        raise ConfigError(f"method lora: no query/value modules known for model type {model_type!r}")
    if which == "qkv":
        return [*qv, *(_KEY_OF_QUERY[t] for t in qv if t in _KEY_OF_QUERY)]
    return list(qv)


def fused_slices(model_type: str, out_features: int, heads: int) -> dict[str, torch.Tensor]:
    """The output indices of the query, key and value in a fused Q,K,V projection: GPT-2's `c_attn`
    is [Q | K | V] (`split(d)`); DeBERTa v1's `in_proj` is per head [q_h | k_h | v_h]
    (`transpose_for_scores(...).chunk(3)`)."""
    layout = FUSED_QKV[model_type][1]
    if out_features % 3:
        raise ConfigError(f"method lora: a fused Q,K,V projection of width {out_features} (not a multiple of 3)")
    d = out_features // 3
    if layout == "blocks":
        return {k: torch.arange(i * d, (i + 1) * d) for i, k in enumerate("qkv")}
    hd = d // heads
    base = torch.arange(heads) * 3 * hd
    return {k: (base[:, None] + i * hd + torch.arange(hd)[None, :]).reshape(-1) for i, k in enumerate("qkv")}


class FusedQVLoRA(nn.Module):
    """A fused Q,K,V projection with LoRA on its query and value outputs only (Hu et al. 2022 adapt
    W_q and W_v; their GPT-2 code does it on the fused `c_attn` with `MergedLinear(...,
    enable_lora=[True, False, True])`): y = base(x), then y[q] += (alpha/r) B_q A_q x and
    y[v] += (alpha/r) B_v A_v x; the key outputs are base(x)'s exactly. A is initialised as a
    linear layer's default (Kaiming uniform), B at zero, so the model starts as the pretrained one."""

    def __init__(self, base: nn.Module, slices: dict[str, torch.Tensor], r: int, alpha: float):
        super().__init__()
        self.base = base
        self.conv1d = not isinstance(base, nn.Linear)  # GPT-2's Conv1D: weight [d_in, d_out], y = x W + b
        d_in = base.weight.shape[0] if self.conv1d else base.in_features
        self.scaling = alpha / r
        self.lora_A = nn.ModuleDict({k: nn.Linear(d_in, r, bias=False) for k in ("q", "v")})
        self.lora_B = nn.ModuleDict({k: nn.Linear(r, len(slices[k]), bias=False) for k in ("q", "v")})
        for k in ("q", "v"):
            nn.init.zeros_(self.lora_B[k].weight)
            self.register_buffer(f"index_{k}", slices[k].clone(), persistent=False)
        w = base.weight
        self.to(w.device, w.dtype)

    @property
    def weight(self):
        return self.base.weight

    def forward(self, x):
        out = self.base(x)
        for k in ("q", "v"):
            delta = self.lora_B[k](self.lora_A[k](x.to(self.lora_A[k].weight.dtype))) * self.scaling
            out = out.index_add(-1, getattr(self, f"index_{k}"), delta.to(out.dtype))
        return out

    def merged(self) -> nn.Module:
        """The base projection with the updates folded into its weight (in place)."""
        with torch.no_grad():
            for k in ("q", "v"):
                delta = (self.lora_B[k].weight @ self.lora_A[k].weight) * self.scaling  # [len(idx), d_in]
                idx = getattr(self, f"index_{k}")
                if self.conv1d:
                    self.base.weight[:, idx] += delta.T.to(self.base.weight.dtype)
                else:
                    self.base.weight[idx, :] += delta.to(self.base.weight.dtype)
        return self.base


def add_lora(body: nn.Module, model_type: str, r: int, alpha: float, which: str = "qv") -> None:
    """LoRA updates on the body's attention matrices (`lora_targets`); B starts at zero, so the
    model starts as the pretrained one; no LoRA dropout, so that runs are comparable. Separate
    matrices get peft's LoRA layers; a fused Q,K,V projection gets `FusedQVLoRA` for `qv`, and
    peft's one update of the whole projection for `qkv`."""
    import warnings

    from peft import LoraConfig, inject_adapter_in_model

    if model_type in FUSED_QKV and which == "qv":
        name = FUSED_QKV[model_type][0]
        sites = [n for n, _ in body.named_modules() if n == name or n.endswith("." + name)]
        if not sites:
            raise ConfigError(f"method lora: no {name} found in {type(body).__name__}")
        heads = int(getattr(body.config, "num_attention_heads", 1))
        for site in sites:
            parent, attr = _parent(body, site)
            base = getattr(parent, attr)
            out = int(base.nf) if hasattr(base, "nf") else base.out_features
            setattr(parent, attr, FusedQVLoRA(base, fused_slices(model_type, out, heads), r, alpha))
        return
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=lora_targets(model_type, which),
                        fan_in_fan_out=model_type in FAN_IN_FAN_OUT, bias="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inject_adapter_in_model(config, body)
    for p in body.parameters():  # peft freezes all but its layers; the parameter filter decides here
        p.requires_grad_(True)


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA update into its base layer and put the base layer back (in place): the
    model becomes the plain architecture. Returns how many layers were merged."""
    from peft.tuners.lora import LoraLayer

    merged = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent, attr = _parent(model, name)
            setattr(parent, attr, module.get_base_layer())
            merged += 1
        elif isinstance(module, FusedQVLoRA):
            parent, attr = _parent(model, name)
            setattr(parent, attr, module.merged())
            merged += 1
    return merged


# ---- saving and reopening ---------------------------------------------------------------------------


def plain_copy(model: nn.Module, tokenizer, method: str):
    """(model, tokenizer, manifest record) to save: a copy of the plain architecture (LoRA merged,
    adapters taken out, prompt rows appended to the vocabulary), and the adapter tensors to write
    beside it in `record["tensors"]` (adapter method)."""
    record: dict = {"method": method}
    if method not in ("adapter", "prompt", "lora"):
        return model, tokenizer, record
    model = copy.deepcopy(model)
    if method == "lora":
        record["merged_layers"] = merge_lora(model)
    elif method == "adapter":
        record["tensors"] = remove_adapters(model)
        record["adapter_sites"] = sorted({k.rsplit(".adapter.", 1)[0] for k in record["tensors"]})
    elif method == "prompt":
        emb = model.get_input_embeddings()
        ids = prompt_ids(model)
        model.set_input_embeddings(emb.base)
        # resize first (it may pad to a multiple), then write the prompt rows
        model.resize_token_embeddings(emb.vocab + len(ids))
        with torch.no_grad():
            model.get_input_embeddings().weight[emb.vocab: emb.vocab + len(ids)] = emb.prompt.detach()
        tokenizer = copy.deepcopy(tokenizer)
        if len(tokenizer) < emb.vocab:  # embedding rows no token names (e.g. padded to a multiple): name them
            tokenizer.add_tokens([f"<unused_row_{i}>" for i in range(len(tokenizer), emb.vocab)], special_tokens=True)
        tokens = [PROMPT_TOKEN.format(i) for i in range(len(ids))]
        tokenizer.add_special_tokens({"additional_special_tokens": tokens}, replace_extra_special_tokens=False)
        got = tokenizer.convert_tokens_to_ids(tokens)
        if got != ids:
            raise CheckpointError(f"prompt tokens got ids {got[:3]}..., expected {ids[:3]}... (tokenizer size "
                                  f"{len(tokenizer)} differs from the embedding's {emb.vocab})")
        record["prompt_ids"] = ids
    return model, tokenizer, record


def save_extra(folder: Path, record: dict) -> dict:
    """Write what a plain folder cannot hold (the adapter tensors) into `folder`; returns the
    manifest record without the tensors."""
    from safetensors.torch import save_file

    record = dict(record)
    tensors = record.pop("tensors", None)
    if tensors is not None:
        save_file(tensors, str(Path(folder) / ADAPTER_FILE))
        record["adapter_file"] = ADAPTER_FILE
    return record


def saved_adapter_file(folder: str | Path, manifest: dict) -> Path | None:
    """The adapter tensors' file of a saved adapter checkpoint (None for every other method: their
    folders hold everything); a CheckpointError when the manifest names a file that is not there."""
    peft = (manifest or {}).get("peft") or {}
    if peft.get("method") != "adapter":
        return None
    path = Path(folder) / peft.get("adapter_file", ADAPTER_FILE)
    if not path.is_file():
        raise CheckpointError(f"{folder}: an adapter checkpoint without {path.name}")
    return path


def reattach_adapters(model: nn.Module, tensors: dict[str, torch.Tensor], manifest: dict,
                      folder: str | Path) -> nn.Module:
    """Put a saved adapter checkpoint's adapters (`tensors`, read from `saved_adapter_file` by the
    loader, `workbench.running.model_loading.reattach_peft`) back into `model`'s forward. `model` may
    be the classifier or any Auto class of the same body; `folder` names the checkpoint in errors."""
    size = int(manifest["peft"]["adapter_size"])
    # the names were recorded on the classifier; find the same sites under this model's body prefix
    body = body_of(model)
    prefix = model.base_model_prefix + "."
    by_site: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        site, rest = k.rsplit(".adapter.", 1)
        site = site[len(prefix):] if site.startswith(prefix) else site
        by_site.setdefault(site, {})[rest] = v
    # adapter-bert's placement (after the dropout), or the one before it (after the projection) for a
    # checkpoint saved then: the adapters go back exactly where they were trained
    mtype = _model_type(model)
    tables = [ADAPTER_TARGETS] + ([ADAPTER_TARGETS_BEFORE_DROPOUT] if mtype in ADAPTER_TARGETS_BEFORE_DROPOUT else [])
    candidates = [set(adapter_sites(body, mtype, table)) for table in tables]
    if set(by_site) not in candidates:
        sites = candidates[0]
        raise CheckpointError(f"{folder}: {ADAPTER_FILE} holds adapters for {len(by_site)} sites, the model has "
                              f"{len(sites)} (e.g. {sorted(set(by_site) ^ sites)[:2]})")
    add_adapters(body, mtype, size, sites=sorted(by_site))
    for site, sd in by_site.items():
        parent, attr = _parent(body, site)
        getattr(parent, attr).adapter.load_state_dict(sd)
    return model
