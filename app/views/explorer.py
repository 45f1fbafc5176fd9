"""Model explorer: pick a checkpoint (a folder under the runs root or a cached Hub model), type a
sentence, and look inside. The runs root offers checkpoints only (`app.data.list_checkpoints`:
folders with weights, config and tokenizer, newest first, a sweep's points named by their lineage
with `app.data.checkpoint_label`), and the page opens on the newest one that loads. Then: attention heatmaps per layer and head, how each word's vector moves
across layers, and the logit lens (top-k predictions for a blanked-out word at every layer, for every
family with an LM head: `workbench.running.logit_lens.blank_topk`; T5/BART read the decoder, the encoder has none),
and generation (`workbench.running.generate`: greedy, temperature, top-k, nucleus; seeded) for the families that generate."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

from app import access, data, model_views, ui
from workbench.errors import ConfigError

SOURCES = ("checkpoint under the runs root", "cached Hugging Face model", "type a path or Hub name")
DEFAULT_SENTENCE = "The keys to the old cabinet are on the table ."


@st.cache_resource(max_entries=2, show_spinner="loading the model")
def _handle(path: str):
    return model_views.load(path)


MAKE = "bertology train experiments/train/bert_small.yaml"  # makes checkpoints under the runs root
TRIES = 4  # checkpoints tried, newest first, for the first screen before giving up


def first_loading(local: list[str], roots) -> tuple[str | None, list[str]]:
    """The newest checkpoint of `local` that loads (the explorer's first screen is a model, not an
    error), and one line per newer one that did not; remembered for the session so a broken folder
    is not loaded again on every rerun."""
    memo = st.session_state.setdefault("ex-first-loading", {})
    key = tuple(local[:TRIES])
    if key not in memo:
        failed = []
        found = None
        for rel in key:
            try:
                _handle(str(data.resolve_model(rel, roots)))
                found = rel
                break
            except Exception as e:  # noqa: BLE001 - any failure: say which and try the next one
                failed.append(f"{rel}: {type(e).__name__}: {e}")
        memo[key] = (found, failed)
    return memo[key]


def render() -> None:
    st.header("Model explorer")
    s = ui.store()
    roots = data.allowed_roots(s.root)
    local = data.list_checkpoints(s.root)  # checkpoints only (weights + config + tokenizer), newest first
    hub = data.cached_hub_models()
    source = st.radio("Checkpoint from", SOURCES, index=0 if local or not hub else 1, horizontal=True,
                      key="ex-source")
    if source == SOURCES[0]:
        if not local:
            st.info(f"No checkpoints under the runs root {s.root} yet: run `{MAKE}` (or `bertology finetune ...`, "
                    f"`bertology prune ...`).")
            return
        start, failed = first_loading(local, roots)
        for line in failed:
            st.warning(f"not opened: {line}")
        choice = st.selectbox("Checkpoint (newest first)", local, index=local.index(start) if start in local else 0,
                              key="ex-local", format_func=data.checkpoint_label)
        st.caption(f"folder: {choice}")
    elif source == SOURCES[1]:
        if not hub:
            st.info("No models in the local Hugging Face cache.")
            return
        choice = st.selectbox("Hub model", hub, key="ex-hub")
    else:
        choice = st.text_input("Folder (under the runs root) or Hub name (cached)", key="ex-typed")
        if not choice:
            st.info(f"The app reads only under {roots[0]} and the Hugging Face cache {roots[1]}.")
            return
    path = data.resolve_model(choice, roots)  # PathRefused (one st.error line) outside the roots
    handle = _handle(str(path))
    st.caption(f"{path} · family {handle.family} · stacks {', '.join(handle.stacks)} · "
               f"{handle.num_layers[handle.stacks[0]]} layers")
    sentence = st.text_input("Sentence", DEFAULT_SENTENCE, key="ex-sentence")
    words = model_views.words_of(sentence)

    tab_att, tab_vec, tab_lens, tab_gen = st.tabs(["Attention", "Word vectors across layers", "Logit lens",
                                                    "Generate"])
    with tab_att:
        attention(handle, words)
    with tab_vec:
        vectors(handle, words)
    with tab_lens:
        lens(handle, words)
    with tab_gen:
        generation(handle)


def attention(handle, words) -> None:
    stack = st.selectbox("Stack", handle.stacks, key="ex-stack") if len(handle.stacks) > 1 else handle.stacks[0]
    try:
        att = model_views.attention(handle, words, stack)
    except Exception as e:  # noqa: BLE001 - e.g. no attention weights (ELMo): say so, keep the other tabs
        st.warning(str(e))
        return
    n_layers, n_heads = att.maps.shape[:2]
    layer = st.slider("Layer", 1, n_layers, 1, key="ex-layer") - 1
    heads = st.multiselect("Heads", list(range(n_heads)), default=list(range(min(n_heads, 12))), key="ex-heads")
    if not heads:
        st.info("Choose at least one head.")
        return
    st.caption(model_views.TOKEN_NOTE)
    labels = [f"{i}:{t}" for i, t in enumerate(att.tokens)]  # readable tokens (model_views.readable_tokens)
    fig = px.imshow(att.maps[layer, heads], x=labels, y=labels, facet_col=0, facet_col_wrap=min(4, len(heads)),
                    color_continuous_scale="Blues", aspect="equal",
                    labels={"x": "attends to", "y": "token", "color": "weight"})
    for i, h in enumerate(heads):
        fig.layout.annotations[i].text = f"head {h}"
    fig.update_layout(height=320 * ((len(heads) + 3) // 4), title=f"layer {layer + 1}")
    st.plotly_chart(fig, width="stretch", key="ex-attention")


def vectors(handle, words) -> None:
    view = model_views.layer_view(handle, words)
    fig = px.imshow(view.to_previous.to_numpy(), x=list(view.to_previous.columns), y=view.words,
                    color_continuous_scale="Viridis", aspect="auto",
                    labels={"x": "layer", "y": "word", "color": "cos(h_l, h_l-1)"},
                    title="Each word's vector against the layer below (cosine)")
    st.plotly_chart(fig, width="stretch", key="ex-to-previous")
    n = view.across_layers.shape[0]
    fig2 = px.imshow(view.across_layers, x=[str(i) for i in range(n)], y=[str(i) for i in range(n)],
                     color_continuous_scale="Viridis", labels={"x": "layer", "y": "layer", "color": "mean cosine"},
                     title="Layer x layer similarity of the same word (mean over words)")
    st.plotly_chart(fig2, width="stretch", key="ex-across")
    st.markdown("**Nearest other word of the sentence, per layer** (cosine)")
    ui.table(view.nearest_word, "ex-nearest", hide_index=False)


def lens(handle, words) -> None:
    """Top-k at a chosen word, replaced by a blank, at every layer (app.model_views.logit_lens, i.e.
    workbench.running.logit_lens.blank_topk): every family with an LM head, or one line saying why there is none."""
    scorer, why = model_views.lens_scorer(handle)
    if why:
        st.info(why)
        return
    for note in model_views.lens_notes(scorer):
        st.caption(note)
    st.caption(model_views.TOKEN_NOTE)
    position = st.selectbox("word to blank out and predict", list(range(len(words))),
                            index=min(len(words) - 1, 1), key="ex-lens-word",
                            format_func=lambda i: f"{i}: {words[i]}")
    k = st.slider("top k", 1, 10, 5, key="ex-lens-k")
    try:
        table = model_views.logit_lens(handle, words, position, k)
    except ConfigError as e:  # e.g. ELMo's blank at the sentence edge, a sentence above max_length
        st.warning(str(e))
        return
    st.caption(f"{scorer.kind} head ({type(scorer.model).__name__}): {table.attrs.get('reads', '')}")
    wide = table.assign(cell=[f"{t} ({p:.3f})" for t, p in zip(table["token"], table["prob"])]) \
        .pivot(index="layer", columns="rank", values="cell")
    ui.table(wide, "ex-lens-table", hide_index=False)
    top1 = table[table["rank"] == 1]
    fig = px.line(top1, x="layer", y="prob", text="token", markers=True, title="top-1 probability by layer")
    fig.update_traces(textposition="top center")
    st.plotly_chart(fig, width="stretch", key="ex-lens-chart")


def generation(handle) -> None:
    """Continuations of a prompt (`app.model_views.generations`): greedy or sampled, seeded, or one line
    saying why this model cannot generate (an encoder, a bare body) or why generating is off (an app
    exposed read-only: a visitor could draw memorised training text out of any checkpoint, and keep the
    machine busy)."""
    why = access.write_off("Generating text") or model_views.cannot_generate(handle)
    if why:
        st.info(why)
        return
    prompt = st.text_input("Prompt (empty: from the start token)", "The", key="ex-gen-prompt")
    cols = st.columns(5)
    strategy = cols[0].selectbox("strategy", ["greedy", "sample"], key="ex-gen-strategy")
    temperature = cols[1].number_input("temperature", 0.05, 5.0, 1.0, 0.05, key="ex-gen-temperature")
    top_k = cols[2].number_input("top-k (0: off)", 0, 1000, 40, key="ex-gen-topk")
    top_p = cols[3].number_input("top-p (1: off)", 0.01, 1.0, 1.0, 0.05, key="ex-gen-topp")
    seed = cols[4].number_input("seed", 0, 10**6, 0, key="ex-gen-seed")
    n = st.slider("samples", 1, 10, 3, key="ex-gen-n")
    new = st.slider("new tokens", 1, 100, 30, key="ex-gen-len")
    try:
        table = model_views.generations(handle, prompt, strategy, temperature, int(top_k) or None,
                                        None if top_p >= 1 else float(top_p), int(seed), n, new)
    except ConfigError as e:  # e.g. prompt + new tokens beyond the model's window
        st.warning(str(e))
        return
    ui.table(table, "ex-gen-table")
