"""Parameter-efficient fine-tuning: what trains, and how the trained model is saved so probes read it.

`bertology finetune --method M` (or `method:` in the fine-tuning YAML) picks one of `METHODS`; the
fine-tuning runner (`workbench.finetune.train_seed`) builds its classifier as always, then
`attach(model, method, options)` changes the model where the method needs new modules and returns
the `workbench.loop.ParamFilter` that freezes everything else. The classifier head always trains
(it starts from random weights), as in every paper cited here.

| method | trains (besides the head) | trainable values | reference |
|---|---|---|---|
| full | everything | all | Devlin et al. 2019 |
| head | nothing | head only | (ELMo's frozen-feature setting) |
| bitfit | every bias term | sum of bias sizes | Ben Zaken, Ravfogel & Goldberg 2022 |
| adapter | a bottleneck after each attention and each feed-forward block | (2*d*m + m + d) per adapter | Houlsby et al. 2019 |
| prompt | n input vectors placed before the text | n * d_embedding | Lester, Al-Rfou & Constant 2021 |
| lora | low-rank updates B A of the attention's query and value matrices | r * (d_in + d_out) per matrix | Hu et al. 2022 |

Libraries. LoRA is `peft`'s (`inject_adapter_in_model` on the classifier's body, so the head stays
ours and the parameter filter decides what trains). `adapters` (the maintained Houlsby library)
pins transformers 4.57 and cannot run with transformers 5, so the bottleneck is `BottleneckAdapter`
below. Prompt tuning is ours too: `peft`'s prompt tuning feeds `inputs_embeds` with the virtual
tokens first, so BERT's classifier would read a virtual token instead of [CLS] and GPT-2's could
not find the last non-pad token; here the prompt is n extra vocabulary ids inserted after the
tokenizer's prefix ([CLS], <s>; nothing for GPT-2), which every family's pooling reads correctly.

Targets per model type (`ADAPTER_TARGETS`, `LORA_TARGETS`): peft's defaults where it has them
(BERT, RoBERTa, ELECTRA, DeBERTa-v2, GPT-2's fused c_attn, T5, BART, Llama), our own for MPNet and
ALBERT; ELMo (an LSTM) supports full and head only.

What a saved checkpoint holds (the run's `best/` folder, a plain `save_pretrained` folder):
- full, head, bitfit: the weights, nothing more.
- lora: the updates merged into the weights (W + (alpha/r) B A): a plain checkpoint.
- adapter: the base architecture's weights plus `adapters.safetensors`; `reattach_saved(model, folder,
  manifest)` puts the adapters back into the forward (`ModelHandle.load` and
  `workbench.finetune.load_classifier` call it, so probes read the adapted layers).
- prompt: the embedding matrix grows by n rows holding the prompt vectors and the tokenizer by n
  special tokens `<prompt_i>`; the manifest's `peft.prompt_ids` says where they go, and
  `ModelHandle.load` inserts them after the tokenizer's prefix in every sequence it runs (a
  tokenizer's own template is rebuilt by transformers on load, so it cannot carry them).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from workbench.errors import CheckpointError, ConfigError
from workbench.loop import ParamFilter, biases_only, outside

METHODS = ("full", "head", "bitfit", "adapter", "prompt", "lora")
ADAPTER_FILE = "adapters.safetensors"
PROMPT_TOKEN = "<prompt_{}>"

# model_type -> (attention output projection, feed-forward output projection), module-name regexes
_BERT_LIKE = (r"attention\.output\.dense$", r"layer\.\d+\.output\.dense$")
ADAPTER_TARGETS = {
    "bert": _BERT_LIKE, "roberta": _BERT_LIKE, "electra": _BERT_LIKE, "deberta": _BERT_LIKE,
    "deberta-v2": _BERT_LIKE, "xlm-roberta": _BERT_LIKE, "camembert": _BERT_LIKE,
    "mpnet": (r"attention\.attn\.o$", r"layer\.\d+\.output\.dense$"),
    "albert": (r"attention\.dense$", r"ffn_output$"),
    "gpt2": (r"attn\.c_proj$", r"mlp\.c_proj$"),
    "llama": (r"self_attn\.o_proj$", r"mlp\.down_proj$"),
    "t5": (r"SelfAttention\.o$", r"DenseReluDense\.wo$"),
    "bart": (r"self_attn\.out_proj$", r"fc2$"),
}
# model_type -> LoRA target module names where peft has no default (peft's mapping otherwise)
LORA_TARGETS = {"mpnet": ["q", "v"], "albert": ["query", "value"]}


@dataclass(frozen=True)
class MethodOptions:
    """The sizes a method reads (the others ignore them)."""

    lora_r: int = 8
    lora_alpha: float = 16.0
    adapter_size: int = 64
    prompt_tokens: int = 20


def check_method(method: str, options: MethodOptions, where: str) -> None:
    """Refuse an unknown method or a bad size (a `ConfigError` naming `where` and the key)."""
    if method not in METHODS:
        raise ConfigError(f"{where}: method: unknown method {method!r} (known: {', '.join(METHODS)})")
    for key in ("lora_r", "adapter_size", "prompt_tokens"):
        v = getattr(options, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}: {key}: must be an integer >= 1, got {v!r}")
    if not options.lora_alpha > 0:
        raise ConfigError(f"{where}: lora_alpha: must be > 0, got {options.lora_alpha}")


def body_of(model: nn.Module) -> nn.Module:
    """The pretrained body of a classifier or LM (what `head` freezes); a bare body is its own."""
    return getattr(model, model.base_model_prefix, model)


def _model_type(model) -> str:
    return getattr(model.config, "model_type", "")


def _either(name: str, *filters: ParamFilter) -> ParamFilter:
    return ParamFilter(name, lambda n, p: any(f.keep(n, p) for f in filters))


def attach(model: nn.Module, method: str, options: MethodOptions = MethodOptions()) -> ParamFilter | None:
    """Add the modules `method` trains to `model` (a classifier from `build_classifier`), in place,
    and return the filter of what trains (None: everything, i.e. full fine-tuning)."""
    if method == "full":
        return None
    head = outside(body_of(model), "head_only")
    if method == "head":
        return head
    mtype = _model_type(model)
    if mtype == "elmo":
        raise ConfigError(f"method {method}: not available for ELMo (an LSTM); use full or head")
    if method == "bitfit":
        return _either("bitfit", biases_only(), head)
    if method == "adapter":
        add_adapters(body_of(model), mtype, options.adapter_size)
        return _either(f"adapter:{options.adapter_size}", _named(r"\.adapter\."), head)
    if method == "prompt":
        add_prompt(model, options.prompt_tokens)
        return _either(f"prompt:{options.prompt_tokens}", _named(r"\.prompt$"), head)
    if method == "lora":
        add_lora(body_of(model), mtype, options.lora_r, options.lora_alpha)
        return _either(f"lora:r{options.lora_r}:a{options.lora_alpha:g}", _named(r"\.lora_[AB]\."), head)
    raise ConfigError(f"method: unknown method {method!r} (known: {', '.join(METHODS)})")


def _named(pattern: str) -> ParamFilter:
    regex = re.compile(pattern)
    return ParamFilter(pattern, lambda n, p: regex.search(n) is not None)


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
    """A projection followed by its adapter: Houlsby's placement, after the sublayer's output
    projection and before the residual sum and layer norm."""

    def __init__(self, base: nn.Module, adapter: BottleneckAdapter):
        super().__init__()
        self.base = base
        self.adapter = adapter

    def forward(self, *args, **kwargs):
        return self.adapter(self.base(*args, **kwargs))


def _out_features(module: nn.Module) -> int:
    if isinstance(module, nn.Linear):
        return module.out_features
    if hasattr(module, "nf"):  # GPT-2's Conv1D
        return int(module.nf)
    raise ConfigError(f"adapter: cannot place an adapter after a {type(module).__name__}")


def adapter_sites(body: nn.Module, model_type: str) -> list[str]:
    """Names (in `body`) of the projections an adapter follows."""
    if model_type not in ADAPTER_TARGETS:
        raise ConfigError(f"method adapter: no adapter placement for model type {model_type!r} "
                          f"(known: {', '.join(sorted(ADAPTER_TARGETS))})")
    regexes = [re.compile(p) for p in ADAPTER_TARGETS[model_type]]
    return [n for n, _ in body.named_modules() if n and any(r.search(n) for r in regexes)]


def add_adapters(body: nn.Module, model_type: str, size: int) -> list[str]:
    """Wrap every site of `adapter_sites` in `Adapted` (on the module's device); returns the sites."""
    sites = adapter_sites(body, model_type)
    if not sites:
        raise ConfigError(f"method adapter: no attention/feed-forward projection found in {type(body).__name__}")
    for name in sites:
        parent, attr = _parent(body, name)
        base = getattr(parent, attr)
        w = next(base.parameters())
        setattr(parent, attr, Adapted(base, BottleneckAdapter(_out_features(base), size).to(w.device, w.dtype)))
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


# ---- LoRA (Hu et al. 2022, through peft) -----------------------------------------------------------


def lora_targets(model_type: str) -> list[str]:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    targets = LORA_TARGETS.get(model_type) or DEFAULTS.get(model_type)
    if not targets:
        raise ConfigError(f"method lora: no target modules known for model type {model_type!r}")
    return list(targets)


def add_lora(body: nn.Module, model_type: str, r: int, alpha: float) -> None:
    """peft's LoRA layers on the body's attention query and value matrices (B starts at zero, so
    the model starts as the pretrained one); no LoRA dropout, so that runs are comparable."""
    import warnings

    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=lora_targets(model_type),
                        fan_in_fan_out=model_type == "gpt2", bias="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inject_adapter_in_model(config, body)


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


def reattach_saved(model: nn.Module, folder: str | Path, manifest: dict) -> nn.Module:
    """Put a saved adapter checkpoint's adapters back into `model`'s forward (other methods: the
    model as it is). `model` may be the classifier or any Auto class of the same body."""
    peft = (manifest or {}).get("peft") or {}
    if peft.get("method") != "adapter":
        return model
    from safetensors.torch import load_file

    path = Path(folder) / peft.get("adapter_file", ADAPTER_FILE)
    if not path.is_file():
        raise CheckpointError(f"{folder}: an adapter checkpoint without {path.name}")
    tensors = load_file(str(path))
    size = int(peft["adapter_size"])
    # the names were recorded on the classifier; find the same sites under this model's body prefix
    body = body_of(model)
    prefix = model.base_model_prefix + "."
    by_site: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        site, rest = k.rsplit(".adapter.", 1)
        site = site[len(prefix):] if site.startswith(prefix) else site
        by_site.setdefault(site, {})[rest] = v
    sites = set(adapter_sites(body, _model_type(model)))
    if set(by_site) != sites:
        raise CheckpointError(f"{folder}: {ADAPTER_FILE} holds adapters for {len(by_site)} sites, the model has "
                              f"{len(sites)} (e.g. {sorted(set(by_site) ^ sites)[:2]})")
    add_adapters(body, _model_type(model), size)
    for site, sd in by_site.items():
        parent, attr = _parent(body, site)
        getattr(parent, attr).adapter.load_state_dict(sd)
    return model
