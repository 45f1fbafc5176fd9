"""ELMo as transformers models: config, character CNN, stacked biLSTM, scalar mix, biLM head.

Follows Peters et al. (2018), "Deep contextualized word representations": a context-independent
token representation from a character CNN (Kim et al., 2016: character embeddings, convolutions of
several widths max-pooled over the word, highway layers (Srivastava et al., 2015), a linear
projection), then L layers of a forward and a backward LSTM with projections (LSTMP, Sak et al.,
2014) and a residual connection between layers; both directions share the token encoder and the
softmax. The family module `workbench.families.elmo` registers these classes with the Auto classes.

Character input (Peters et al. 2018, Sec. 3.4; Jozefowicz et al. 2016): every word is spelled as
its UTF-8 bytes (byte b is character id b + 1, so any Unicode word has a spelling), wrapped in
begin/end-of-word markers and truncated or padded to `max_chars` (`word_characters`): the
paper's 262-symbol byte vocabulary, with one reserved marker per special token ([PAD], [UNK],
<S>, </S>) in place of its fixed <S>/</S> characters. Only the softmax vocabulary is closed.
The encoder takes `char_ids` [B, T, C] next to `input_ids`: a position with characters is read
from them, a position without (an all-zero row: special tokens, padding, or a caller that passes
ids only, as plain `AutoModel` users do) from the buffer `char_ids` [vocab_size, max_chars], the
spellings of the vocabulary built at construction and saved with the weights. The workbench passes
the characters of every out-of-vocabulary word (the family's collator at training time, the model
handle at probing time), so an unknown word is read from its own spelling, never from [UNK]'s; an
in-vocabulary word's table row is its own spelling, so for it the two paths agree.

Deliberate differences from the paper, each for a stated reason:
- No cell/projection clipping (the paper's LSTMs clip at 3): `torch.nn.LSTM` (cuDNN, packed
  sequences) has no clipping, and a Python-loop LSTM would be far slower.
- Full softmax instead of the sampled softmax the paper needed for its 793k-word vocabulary; our
  vocabularies are tens of thousands of words at most, and the loss only scores real positions.
- Sentences are processed independently (no LSTM state carried across batches as in bilm-tf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from workbench.errors import CheckpointError, ConfigError

# Character ids: 0 pads a word to `max_chars`; UTF-8 byte b is b + 1; then begin/end-of-word
# markers; then one reserved marker per special token ([PAD], [UNK], <S>, </S>, ...), so a special
# token never shares its spelling with a real word such as "<unk>" in WikiText.
CHAR_PAD = 0
BOW_CHAR = 257
EOW_CHAR = 258
FIRST_SPECIAL_CHAR = 259


class ElmoConfig(PreTrainedConfig):
    """Shape of an ELMo model. `hidden_size` is the width of one hidden state, 2 x projection_dim."""

    model_type = "elmo"

    vocab_size: int = 1000
    token_encoder: str = "char_cnn"  # "char_cnn" (the paper) or "embedding" (plain token embeddings)
    max_chars: int = 50  # characters per word incl. begin/end-of-word markers (paper: 50)
    num_special_chars: int = 8  # reserved character ids for special tokens
    char_embed_dim: int = 16
    char_filters: list[list[int]] | tuple = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
    num_highway: int = 2
    projection_dim: int = 512  # width of the token representation and of each LSTM direction's output
    lstm_dim: int = 4096  # LSTM cell size; projected down to projection_dim when larger (LSTMP)
    num_hidden_layers: int = 2
    dropout: float = 0.1
    hidden_size: int | None = None  # derived: 2 * projection_dim ([forward; backward])
    # An LSTM has no position limit; this is only the window size the model handle uses.
    max_position_embeddings: int = 512
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        self.char_filters = [[int(w), int(n)] for w, n in self.char_filters]
        if self.hidden_size is not None and self.hidden_size != 2 * self.projection_dim:
            raise ConfigError(
                f"ElmoConfig: hidden_size ({self.hidden_size}) must equal 2 x projection_dim ({self.projection_dim})"
            )
        self.hidden_size = 2 * self.projection_dim
        if self.token_encoder not in ("char_cnn", "embedding"):
            raise ConfigError(f"ElmoConfig: token_encoder must be 'char_cnn' or 'embedding', got {self.token_encoder!r}")
        if self.projection_dim > self.lstm_dim:
            raise ConfigError(
                f"ElmoConfig: projection_dim ({self.projection_dim}) must not exceed lstm_dim ({self.lstm_dim})"
            )
        if self.token_encoder == "char_cnn":
            too_wide = [w for w, _ in self.char_filters if w > self.max_chars]
            if too_wide or not self.char_filters:
                raise ConfigError(f"ElmoConfig: char_filters {self.char_filters} need widths <= max_chars ({self.max_chars})")
        super().__post_init__(**kwargs)

    @property
    def char_vocab_size(self) -> int:
        return FIRST_SPECIAL_CHAR + self.num_special_chars


def word_characters(word: str, max_chars: int, special_index: int | None = None) -> list[int]:
    """Character ids of one word: [BOW, bytes..., EOW, pad...], truncated like ELMo's to max_chars.

    Any Unicode string works (its UTF-8 bytes; truncation may cut a multi-byte character, as the
    paper's byte-level input does); the empty string is [BOW, EOW], a word with no characters.
    A special token (special_index = its rank among the tokenizer's special tokens) is spelled
    [BOW, marker, EOW] with a marker character of its own.
    """
    if max_chars < 3:
        raise ConfigError(f"max_chars={max_chars}: a word needs room for BOW, one character and EOW")
    if special_index is not None:
        body = [FIRST_SPECIAL_CHAR + special_index]
    else:
        body = [b + 1 for b in word.encode("utf-8")[: max_chars - 2]]
    chars = [BOW_CHAR, *body, EOW_CHAR]
    return chars + [CHAR_PAD] * (max_chars - len(chars))


def batch_characters(rows: Sequence[Sequence[str | None]], width: int, max_chars: int | None = None) -> torch.Tensor:
    """LongTensor [len(rows), width, C]: position t of row b spelled from rows[b][t] (`word_characters`).

    None (or a position past the row) stays all zero, which the encoder reads from its vocabulary
    table instead (special tokens, padding, in-vocabulary words). C = max_chars, or by default wide
    enough for the longest word, untruncated: the encoder then truncates to its own max_chars
    (`fit_char_width`), so a collator need not know the model's config.
    """
    words = [w for row in rows for w in row if w is not None]
    if max_chars is None:
        max_chars = max([len(w.encode("utf-8")) + 2 for w in words] + [3])
    out = torch.zeros(len(rows), width, max_chars, dtype=torch.long)
    for b, row in enumerate(rows):
        for t, w in enumerate(row[:width]):
            if w is not None:
                out[b, t] = torch.tensor(word_characters(w, max_chars))
    return out


def fit_char_width(char_ids: torch.Tensor, max_chars: int) -> torch.Tensor:
    """Character ids [..., W] made [..., max_chars] exactly as `word_characters` would truncate or pad them.

    A word longer than max_chars (markers included) keeps BOW and its first max_chars - 2 bytes and
    ends with EOW; a narrower input is padded.
    """
    W = char_ids.shape[-1]
    if W <= max_chars:
        return F.pad(char_ids, (0, max_chars - W), value=CHAR_PAD)
    cut = char_ids[..., max_chars].ne(CHAR_PAD)  # something follows position max_chars - 1
    out = char_ids[..., :max_chars].clone()
    out[..., -1] = torch.where(cut, torch.full_like(out[..., -1], EOW_CHAR), out[..., -1])
    return out


def char_table(vocab: dict[str, int], special_tokens: Sequence[str], max_chars: int, num_special_chars: int) -> torch.Tensor:
    """LongTensor [vocab_size, max_chars]: the characters of every vocabulary id."""
    specials = list(dict.fromkeys(t for t in special_tokens if t in vocab))
    if len(specials) > num_special_chars:
        raise ConfigError(
            f"ElmoConfig.num_special_chars={num_special_chars} but the tokenizer has {len(specials)} special tokens {specials}"
        )
    size = max(vocab.values()) + 1 if vocab else 0
    table = torch.zeros(size, max_chars, dtype=torch.long)
    rank = {t: i for i, t in enumerate(specials)}
    for word, idx in vocab.items():
        table[idx] = torch.tensor(word_characters(word, max_chars, rank.get(word)))
    return table


class Highway(nn.Module):
    """Highway layers (Srivastava et al., 2015) as used by Kim et al. (2016): y = t*relu(Wx) + (1-t)*x."""

    def __init__(self, dim: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            proj, gate = layer(x).chunk(2, dim=-1)
            t = torch.sigmoid(gate)
            x = t * F.relu(proj) + (1 - t) * x
        return x


class CharCNNEncoder(nn.Module):
    """Context-independent token representation from characters (Kim et al., 2016; Peters et al., 2018).

    Character embeddings -> one Conv1d per width, max-pooled over the word, ReLU -> highway ->
    linear projection to projection_dim. Each distinct spelling in a batch is encoded once.
    `char_ids` (optional, [B, T, any width]) spells the positions it has characters for; the rest
    are spelled from the vocabulary table (see the module docstring).
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.char_embeddings = nn.Embedding(config.char_vocab_size, config.char_embed_dim, padding_idx=CHAR_PAD)
        self.convs = nn.ModuleList(nn.Conv1d(config.char_embed_dim, n, kernel_size=w) for w, n in config.char_filters)
        n_filters = sum(n for _, n in config.char_filters)
        self.highway = Highway(n_filters, config.num_highway)
        self.projection = nn.Linear(n_filters, config.projection_dim)
        # Filled from the tokenizer's vocabulary by ElmoModel.set_vocabulary; saved with the weights.
        self.register_buffer("char_ids", torch.zeros(config.vocab_size, config.max_chars, dtype=torch.long))
        self.register_buffer("char_ids_filled", torch.zeros((), dtype=torch.bool))

    def forward(self, input_ids: torch.Tensor, char_ids: torch.Tensor | None = None) -> torch.Tensor:
        if not bool(self.char_ids_filled):
            raise CheckpointError(
                "ELMo character table is empty: build the model with ElmoModel.set_vocabulary(tokenizer) "
                "(workbench.families.elmo.build_model does) or load a checkpoint that has one"
            )
        C = self.char_ids.shape[1]
        chars = self.char_ids[input_ids]  # [B, T, C] the vocabulary's spellings
        if char_ids is not None:
            if char_ids.shape[:2] != input_ids.shape:
                raise ValueError(f"char_ids {tuple(char_ids.shape)} must be [B, T, chars] for input_ids {tuple(input_ids.shape)}")
            n_chars = self.char_embeddings.num_embeddings
            if char_ids.numel() and (int(char_ids.min()) < 0 or int(char_ids.max()) >= n_chars):
                raise ValueError(f"char_ids must lie in [0, {n_chars}) (UTF-8 byte + 1, markers)")
            given = fit_char_width(char_ids.to(chars.device), C)
            chars = torch.where(given.ne(CHAR_PAD).any(-1, keepdim=True), given, chars)
        unique, inverse = torch.unique(chars.reshape(-1, C), dim=0, return_inverse=True)
        chars = unique  # [U, C]
        emb = self.char_embeddings(chars).transpose(1, 2)  # [U, E, C]
        pooled = [F.relu(conv(emb).max(dim=-1).values) for conv in self.convs]
        token = self.projection(self.highway(torch.cat(pooled, dim=-1)))  # [U, H]
        return token[inverse].view(*input_ids.shape, -1)


class TokenEmbeddingEncoder(nn.Module):
    """The plain alternative to the character CNN: one learned vector per vocabulary id."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.projection_dim, padding_idx=config.pad_token_id)

    def forward(self, input_ids: torch.Tensor, char_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.embeddings(input_ids)  # characters, if given, are not read


class ScalarMix(nn.Module):
    """ELMo vectors (Peters et al., 2018, eq. 1): gamma * sum_j softmax(s)_j * h_j over the L+1 layers.

    Task-specific in the paper, so it is a separate module (ElmoModel.scalar_mix() makes one) rather
    than part of the pretrained weights.
    """

    def __init__(self, num_layers: int):
        super().__init__()
        self.scalar_parameters = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def weights(self) -> torch.Tensor:
        """The normalised layer weights s_j (they sum to 1)."""
        return torch.softmax(self.scalar_parameters, dim=0)

    def forward(self, hidden_states: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        stacked = torch.stack(list(hidden_states)) if not torch.is_tensor(hidden_states) else hidden_states
        if stacked.shape[0] != self.scalar_parameters.shape[0]:
            raise ValueError(f"ScalarMix over {self.scalar_parameters.shape[0]} layers got {stacked.shape[0]}")
        w = self.weights().to(stacked.dtype).view(-1, *([1] * (stacked.dim() - 1)))
        return self.gamma * (w * stacked).sum(dim=0)


def _compact_order(mask: torch.Tensor) -> torch.Tensor:
    """Per row, the positions of real tokens first (in order), then padding: any mask becomes right-padded."""
    return torch.argsort((~mask).to(torch.int8), dim=1, stable=True)


def _reverse_within_lengths(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Index [B, T] that reverses each row's first `length` positions and leaves padding in place."""
    t = torch.arange(seq_len, device=lengths.device).unsqueeze(0)
    rev = lengths.unsqueeze(1) - 1 - t
    return torch.where(t < lengths.unsqueeze(1), rev, t)


class ElmoPreTrainedModel(PreTrainedModel):
    config: ElmoConfig
    config_class = ElmoConfig
    base_model_prefix = "elmo"
    supports_gradient_checkpointing = False

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        # Slicing a tensor loses transformers' "already loaded" flag, so each rule checks the flag on
        # the whole parameter and then writes it in place (never touching loaded weights).
        if isinstance(module, CharCNNEncoder):
            w = module.char_embeddings.weight
            if _fresh(w):  # ELMo initialises character embeddings uniformly in [-1, 1]
                w.uniform_(-1.0, 1.0)
                w[CHAR_PAD].zero_()
        elif isinstance(module, Highway):
            # Start close to the identity (carry gate open), as Kim et al. (2016) do with a negative
            # transform-gate bias.
            for layer in module.layers:
                if _fresh(layer.bias):
                    dim = layer.out_features // 2
                    layer.bias[:dim].zero_()
                    layer.bias[dim:].fill_(-2.0)
        elif isinstance(module, nn.LSTM):
            for name, param in module.named_parameters():
                if not _fresh(param):
                    continue
                if name.startswith("weight"):
                    nn.init.xavier_uniform_(param)
                elif name.startswith("bias"):
                    param.zero_()
                    if name.startswith("bias_hh"):
                        # forget-gate bias 1 (Jozefowicz et al., 2015); gates are ordered i, f, g, o
                        h = param.shape[0] // 4
                        param[h : 2 * h].fill_(1.0)


def _fresh(param: torch.Tensor) -> bool:
    return not getattr(param, "_is_hf_initialized", False)


class ElmoModel(ElmoPreTrainedModel):
    """The ELMo encoder: hidden_states = (L+1) x [B, T, 2H]; layer 0 = [x; x], layer k = [f_k; b_k]."""

    # Opened from an ElmoForBiLM checkpoint, the shared softmax is expected to be left out.
    _keys_to_ignore_on_load_unexpected = [r"^softmax\."]

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        H = config.projection_dim
        proj = H if H < config.lstm_dim else 0
        self.token_encoder = CharCNNEncoder(config) if config.token_encoder == "char_cnn" else TokenEmbeddingEncoder(config)
        self.forward_lstms = nn.ModuleList(
            nn.LSTM(H, config.lstm_dim, proj_size=proj, batch_first=True) for _ in range(config.num_hidden_layers)
        )
        self.backward_lstms = nn.ModuleList(
            nn.LSTM(H, config.lstm_dim, proj_size=proj, batch_first=True) for _ in range(config.num_hidden_layers)
        )
        self.dropout = nn.Dropout(config.dropout)
        self.post_init()

    def set_vocabulary(self, tokenizer) -> None:
        """Fill the character table from a word-level tokenizer (vocab + special tokens)."""
        if not isinstance(self.token_encoder, CharCNNEncoder):
            return
        vocab = tokenizer.get_vocab()
        table = char_table(vocab, tokenizer.all_special_tokens, self.config.max_chars, self.config.num_special_chars)
        if table.shape[0] != self.config.vocab_size:
            raise ConfigError(f"tokenizer has {table.shape[0]} ids but ElmoConfig.vocab_size is {self.config.vocab_size}")
        self.token_encoder.char_ids.copy_(table)
        self.token_encoder.char_ids_filled.fill_(True)

    def get_input_embeddings(self):
        if isinstance(self.token_encoder, TokenEmbeddingEncoder):
            return self.token_encoder.embeddings
        # The char CNN has no [vocab, dim] matrix to resize or tie; its vocabulary is `char_ids`.
        raise NotImplementedError("ELMo's character CNN has no token embedding matrix (see token_encoder.char_ids)")

    def scalar_mix(self) -> ScalarMix:
        """A fresh task-specific scalar mix over this model's L+1 layers."""
        return ScalarMix(self.config.num_hidden_layers + 1).to(self.device)

    def _run_direction(self, lstms: nn.ModuleList, x: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Stacked LSTM over right-padded `x`, never reading padding (packed sequences)."""
        outputs = []
        h = x
        T = x.shape[1]
        safe = lengths.clamp(min=1).cpu()  # a packed sequence cannot be empty; empty rows are zeroed later
        for i, lstm in enumerate(lstms):
            packed = pack_padded_sequence(self.dropout(h), safe, batch_first=True, enforce_sorted=False)
            out, _ = lstm(packed)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
            if i > 0:  # residual connection between LSTM layers, as in ELMo
                out = out + h
            outputs.append(out)
            h = out
        return outputs

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_attentions: bool | None = None,
        char_ids: torch.Tensor | None = None,
        **kwargs,
    ):
        if output_attentions:
            raise ValueError("ELMo is a biLSTM and has no attention weights; ask for hidden states only")
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.bool()
        B, T = input_ids.shape
        lengths = mask.sum(dim=1)

        # Work on a right-padded copy (a no-op for right-padded input), then scatter back.
        order = _compact_order(mask)
        ids = input_ids.gather(1, order)
        if char_ids is not None:
            if char_ids.dim() != 3 or char_ids.shape[:2] != input_ids.shape:
                raise ValueError(f"char_ids {tuple(char_ids.shape)} must be [B, T, chars] for input_ids {tuple(input_ids.shape)}")
            char_ids = char_ids.gather(1, order.unsqueeze(-1).expand(-1, -1, char_ids.shape[-1]))
        x = self.token_encoder(ids, char_ids)  # [B, T, H]
        forward_states = self._run_direction(self.forward_lstms, x, lengths)
        rev = _reverse_within_lengths(lengths, T).unsqueeze(-1)
        x_rev = x.gather(1, rev.expand_as(x))
        backward_states = [s.gather(1, rev.expand_as(s)) for s in self._run_direction(self.backward_lstms, x_rev, lengths)]

        valid = (torch.arange(T, device=input_ids.device).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(-1)
        layers = [torch.cat([x, x], dim=-1)] + [torch.cat([f, b], dim=-1) for f, b in zip(forward_states, backward_states)]
        index = order.unsqueeze(-1).expand(B, T, self.config.hidden_size)
        hidden = tuple(torch.zeros_like(h).scatter(1, index, h * valid) for h in layers)

        all_states = hidden if output_hidden_states else None
        if not return_dict:
            return (hidden[-1], all_states) if output_hidden_states else (hidden[-1],)
        return BaseModelOutput(last_hidden_state=hidden[-1], hidden_states=all_states)

    def elmo_vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, mix: ScalarMix,
                     char_ids: torch.Tensor | None = None) -> torch.Tensor:
        """ELMo vectors [B, T, 2H] for a task: the scalar mix of all L+1 layers."""
        out = self(input_ids, attention_mask=attention_mask, output_hidden_states=True, return_dict=True,
                   char_ids=char_ids)
        return mix(out.hidden_states)


@dataclass
class ElmoBiLMOutput(ModelOutput):
    """loss = mean of the forward and backward LM losses; loss_terms holds both (detached)."""

    loss: torch.Tensor | None = None
    loss_terms: dict[str, torch.Tensor] | None = None
    forward_logits: torch.Tensor | None = None
    backward_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class ElmoForBiLM(ElmoPreTrainedModel):
    """The pretraining model: a biLM whose two directions share one softmax (Peters et al., 2018).

    The forward LM predicts token t+1 from forward_L(t), the backward LM token t-1 from backward_L(t).
    Its checkpoint holds the encoder under `elmo.` and the softmax, so `AutoModel.from_pretrained`
    returns the bare ElmoModel and `ElmoForBiLM.from_pretrained` (or AutoModelForPreTraining) the LM.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.elmo = ElmoModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = nn.Linear(config.projection_dim, config.vocab_size)
        self.post_init()

    def get_output_embeddings(self):
        return self.softmax

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        forward_labels: torch.Tensor | None = None,
        backward_labels: torch.Tensor | None = None,
        return_logits: bool = False,
        output_hidden_states: bool | None = None,
        char_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> ElmoBiLMOutput:
        out = self.elmo(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states,
                        return_dict=True, char_ids=char_ids)
        top = self.dropout(out.last_hidden_state)
        H = self.config.projection_dim
        fwd, bwd = top[..., :H], top[..., H:]
        result = ElmoBiLMOutput(hidden_states=out.hidden_states)
        if return_logits:
            result.forward_logits = self.softmax(fwd)
            result.backward_logits = self.softmax(bwd)
        if forward_labels is not None and backward_labels is not None:
            terms = {}
            for name, states, labels in (("forward", fwd, forward_labels), ("backward", bwd, backward_labels)):
                keep = labels != -100  # score real positions only: no softmax over padding
                terms[name] = F.cross_entropy(self.softmax(states[keep]), labels[keep])
            result.loss = (terms["forward"] + terms["backward"]) / 2
            result.loss_terms = {k: v.detach() for k, v in terms.items()}
        return result
