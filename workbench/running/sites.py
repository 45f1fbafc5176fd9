"""Where a transformer layer's attention heads and MLP live, per family.

The module-level map the runner's per-head and per-MLP activation points hook into
(`workbench.running.runner`: "blocks.{i}.attn.z", "blocks.{i}.mlp_out") and that head pruning
(`workbench.drivers.head_pruning`) masks and slices: BERT (MiniLM), RoBERTa, ELECTRA, SpanBERT
(BERT modules), the DeBERTa-style reference encoder (DebertaV2), GPT-2 and Llama-style decoders
(SmolLM2). ALBERT is refused: its layers share one set of weights, so a per-layer edit of a module
is not a per-layer edit of the computation.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from workbench.errors import WorkbenchError


@dataclass
class LayerSites:
    """Where one layer's heads and MLP live.

    `kind` is "bert" (query/key/value Linears; DeBERTa's are query_proj/key_proj/value_proj),
    "gpt2" (fused c_attn Conv1D) or "llama" (q/k/v/o_proj, grouped K/V). `out_proj` is the
    attention output projection whose input holds the heads' context vectors, head h at
    columns [h*head_dim, (h+1)*head_dim). `mlp_in` are the MLP's input projections, `mlp_out` its
    last projection."""

    kind: str
    attention: nn.Module  # the module holding the Q/K/V projections and the head count
    qkv: tuple[str, ...]  # attribute names on `attention` (one fused name for GPT-2)
    out_parent: nn.Module
    out_name: str
    num_heads: int
    head_dim: int
    mlp_parents: tuple[tuple[nn.Module, str], ...]  # input projections (parent, attribute)
    mlp_out_parent: nn.Module
    mlp_out_name: str

    @property
    def out_proj(self) -> nn.Module:
        return getattr(self.out_parent, self.out_name)

    @property
    def mlp_out(self) -> nn.Module:
        return getattr(self.mlp_out_parent, self.mlp_out_name)


def is_conv1d(module) -> bool:
    """transformers' `Conv1D` (GPT-2): a Linear whose weight is stored [in, out]."""
    return type(module).__name__ == "Conv1D"


def attention_sites(model: nn.Module) -> list[LayerSites]:
    """Every self-attention layer of `model` in depth order (a bare model or one under a task head).

    Raises a `WorkbenchError` naming the model class when no layer is recognised, and for ALBERT."""
    sites: list[LayerSites] = []
    for _, m in model.named_modules():
        cls = type(m).__name__
        if cls.startswith("Albert") and cls.endswith("Layer"):
            raise WorkbenchError(f"{type(model).__name__}: ALBERT shares one layer's weights across depth, so "
                                 f"a per-layer head mask is not a weight mask; head pruning does not support it")
        att = getattr(m, "attention", None)
        if att is not None and hasattr(m, "intermediate") and hasattr(m, "output") and hasattr(att, "self"):
            s = att.self  # BERT / RoBERTa / ELECTRA / DeBERTa-v2
            names = ("query", "key", "value") if hasattr(s, "query") else ("query_proj", "key_proj", "value_proj")
            sites.append(LayerSites("bert", s, names, att.output, "dense", int(s.num_attention_heads),
                                    int(s.attention_head_size), ((m.intermediate, "dense"),), m.output, "dense"))
        elif hasattr(m, "attn") and hasattr(getattr(m, "attn"), "c_attn") and hasattr(m, "mlp"):
            a = m.attn  # GPT-2
            if getattr(a, "is_cross_attention", False):
                continue
            sites.append(LayerSites("gpt2", a, ("c_attn",), a, "c_proj", int(a.num_heads), int(a.head_dim),
                                    ((m.mlp, "c_fc"),), m.mlp, "c_proj"))
        elif hasattr(m, "self_attn") and hasattr(getattr(m, "self_attn"), "o_proj") and hasattr(m, "mlp"):
            a = m.self_attn  # Llama-style
            n = int(a.config.num_attention_heads) if not hasattr(a, "workbench_num_heads") else int(a.workbench_num_heads)
            sites.append(LayerSites("llama", a, ("q_proj", "k_proj", "v_proj"), a, "o_proj", n, int(a.head_dim),
                                    ((m.mlp, "gate_proj"), (m.mlp, "up_proj")), m.mlp, "down_proj"))
    if not sites:
        raise WorkbenchError(f"{type(model).__name__}: no self-attention layer this module knows (BERT, RoBERTa, "
                             f"ELECTRA, DeBERTa-v2, GPT-2, Llama)")
    return sites
