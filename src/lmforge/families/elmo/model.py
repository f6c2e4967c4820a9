"""ELMo: a bidirectional LSTM language model whose layers become contextual word features.

Peters et al. 2018, "Deep contextualized word representations".  The model reads top to bottom:

1. a **token encoder** turns every token id into a vector of width P: the character CNN of the
   original (UTF-8 spelling -> CNN with several filter widths, max-pooled -> 2 highway layers ->
   linear projection; see :mod:`lmforge.nn.charcnn`), or a plain word embedding;
2. a **forward** stack of 2 LSTMP layers (cell ``cell_size``, projected to P, residual between
   the layers) reads the tokens left to right, a separate **backward** stack reads them right to
   left.  The two never exchange hidden states; they share only the token encoder and the softmax;
3. one **softmax** over the vocabulary: the forward state at t predicts token t+1, the backward
   state at t predicts token t-1.  ``loss = forward NLL + backward NLL``.

No direction ever sees the word it predicts: the forward state at t depends on tokens <= t only,
the backward state at t on tokens >= t only (``tests/test_elmo.py`` checks both through the
outputs and the gradients).

For feature-based use every token gets three vectors (``hidden_states``), each of width 2P:
the token layer duplicated ``[x; x]`` (so that it has the LSTM layers' width, as the original
does), then ``[fwd_1; bwd_1]`` and ``[fwd_2; bwd_2]``.  A downstream task mixes them with
:class:`lmforge.nn.scalar_mix.ScalarMix`.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch
from torch import nn

from ...config import from_dict, load_json
from ...errors import ConfigError
from ...models.base import ModelOutput, PretrainedModel
from ...nn.charcnn import CharCNNEncoder, vocab_char_ids
from ...nn.diagnostics import token_cosine
from ...nn.losses import cross_entropy_rows
from ...nn.lstm import ResidualLSTMStack

logger = logging.getLogger(__name__)

# The original ELMo's character CNN: widths 1..7 with 32..1024 filters (2048 features).
ORIGINAL_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]
SMALL_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 256], [7, 256]]


@dataclasses.dataclass
class ElmoConfig:
    """ELMo biLM settings (``model_type: "elmo"``).

    Attributes:
        vocab_size: V, the tokenizer's vocabulary (set from the tokenizer by
            :func:`lmforge.families.elmo.pretraining.setup_elmo`).
        token_encoder: ``"char"`` (char CNN + highway + projection, the original) or ``"word"``
            (a word-embedding table).
        projection_dim: P, width of the token vectors and of each LSTM layer's output per direction.
        cell_size: LSTM cell width; larger than P means a projected LSTM (original: 4096 -> 512).
        num_layers: LSTM layers per direction.
        char_embed_dim: size of each character embedding (char encoder).
        char_filters: ``[[width, n_filters], ...]`` of the char CNN.
        max_chars_per_token: characters per token, markers included; longer pieces are cut.
        num_highway: highway layers after the char CNN.
        dropout: dropout on the token vectors, between LSTM layers and before the softmax.
        seq_len: length of the training windows the sampler cuts (the LSTMs themselves take any length).
        initializer_range: std of the normal init of the word embedding and the softmax.
        token_norm: a LayerNorm on the token vectors before the LSTMs (not in the original). Trained
            with Adam, the char encoder's output otherwise grows one shared direction until every token
            vector is nearly the same (docs/elmo_word2vec.md) and the biLM stalls near unigram perplexity.
            Model folders saved without this key load with it off.
    """

    vocab_size: int = 8192
    token_encoder: str = "char"
    projection_dim: int = 256
    cell_size: int = 1024
    num_layers: int = 2
    char_embed_dim: int = 16
    char_filters: list[list[int]] = dataclasses.field(default_factory=lambda: [list(f) for f in SMALL_FILTERS])
    max_chars_per_token: int = 50
    num_highway: int = 2
    dropout: float = 0.1
    seq_len: int = 64
    initializer_range: float = 0.02
    token_norm: bool = True

    def __post_init__(self) -> None:
        if self.token_encoder not in ("char", "word"):
            raise ConfigError(f"token_encoder must be 'char' or 'word', got {self.token_encoder!r}")
        if self.vocab_size < 2:
            raise ConfigError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if not 1 <= self.projection_dim <= self.cell_size:
            raise ConfigError(f"need 1 <= projection_dim <= cell_size, got {self.projection_dim} and {self.cell_size}")
        if self.num_layers < 1:
            raise ConfigError(f"num_layers must be >= 1, got {self.num_layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.seq_len < 2:
            raise ConfigError(f"seq_len must be >= 2 (each direction predicts a neighbour), got {self.seq_len}")
        if self.token_encoder == "char":
            if not self.char_filters or any(len(f) != 2 or min(f) < 1 for f in self.char_filters):
                raise ConfigError(f"char_filters must be a list of [width, n_filters] pairs, got {self.char_filters}")
            widest = max(w for w, _ in self.char_filters)
            if widest > self.max_chars_per_token:
                raise ConfigError(f"char filter width {widest} exceeds max_chars_per_token={self.max_chars_per_token}")


def _gather_time(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[b, t] = x[b, index[b, t]]`` for x (B, T, ...) and index (B, T)."""
    idx = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, idx)


def _reverse_index(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) index reversing the first ``lengths[b]`` positions of each row and keeping the rest.

    Its own inverse: applying it twice gives the identity.
    """
    pos = torch.arange(T, device=lengths.device).unsqueeze(0)  # (1, T)
    L = lengths.unsqueeze(1)  # (B, 1)
    return torch.where(pos < L, L - 1 - pos, pos)


class ElmoBiLM(PretrainedModel):
    """The ELMo biLM: token encoder, independent forward and backward LSTMP stacks, shared softmax.

    ``forward(input_ids, attention_mask=None, labels=None)`` returns :class:`ModelOutput` with
    ``logits`` (2, B, T, V): ``[0]`` the forward direction (position t scores token t+1), ``[1]`` the
    backward one (position t scores token t-1); ``loss`` = forward NLL + backward NLL; ``metrics``
    ``fwd_loss``, ``bwd_loss`` and ``lm_loss`` (their mean, so the trainer's ``lm_ppl`` is the
    combined perplexity).  ``attention_mask`` may pad on either side: padding is moved out of the way
    before the LSTMs run, so padded and unpadded inputs give the same vectors.
    """

    config_class = ElmoConfig
    model_type = "elmo"

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        c = config
        P = c.projection_dim
        if c.token_encoder == "char":
            self.token_encoder: nn.Module = CharCNNEncoder(
                c.vocab_size, c.max_chars_per_token, c.char_embed_dim, c.char_filters, c.num_highway, P
            )
        else:
            self.token_encoder = nn.Embedding(c.vocab_size, P)
        self.token_norm = nn.LayerNorm(P) if c.token_norm else None
        self.forward_lstm = ResidualLSTMStack(P, c.cell_size, P, c.num_layers, dropout=c.dropout)
        self.backward_lstm = ResidualLSTMStack(P, c.cell_size, P, c.num_layers, dropout=c.dropout)
        self.dropout = nn.Dropout(c.dropout)
        self.softmax = nn.Linear(P, c.vocab_size)
        nn.init.normal_(self.softmax.weight, std=c.initializer_range)
        nn.init.zeros_(self.softmax.bias)
        if isinstance(self.token_encoder, nn.Embedding):
            nn.init.normal_(self.token_encoder.weight, std=c.initializer_range)

    @classmethod
    def config_from_folder(cls, path):
        """As the base class; a config.json written before ``token_norm`` existed means no norm."""
        data = load_json(Path(path) / "config.json")
        if data.get("model_type") == cls.model_type and "token_norm" not in data:
            data["token_norm"] = False
            return from_dict(cls.config_class, data, ignore=("model_type",))
        return super().config_from_folder(path)

    # -- setup ---------------------------------------------------------------------------------
    def set_tokenizer(self, tokenizer) -> None:
        """Attach ``tokenizer`` and, for the char encoder, spell its vocabulary into ``token_chars``."""
        if tokenizer.vocab_size != self.config.vocab_size:
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but the model was built for {self.config.vocab_size}"
            )
        if isinstance(self.token_encoder, CharCNNEncoder):
            self.token_encoder.set_token_chars(vocab_char_ids(tokenizer, self.config.max_chars_per_token))
        self.tokenizer = tokenizer

    @property
    def hidden_size(self) -> int:
        """Width C of every layer ``hidden_states`` returns: both directions concatenated (2P)."""
        return 2 * self.config.projection_dim

    # -- the biLM ------------------------------------------------------------------------------
    def _contextualize(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
        """Token vectors and both directions' layers, in *packed* order (real tokens first in each row).

        Returns:
            x (B, T, P) token vectors; ``num_layers`` forward and backward outputs (B, T, P) each;
            ``perm`` (B, T) such that packed[b, j] = original[b, perm[b, j]] (None when the rows were
            already right-padded); ``lengths`` (B,) real tokens per row (None without a mask).
        """
        B, T = input_ids.shape
        perm = lengths = None
        if attention_mask is not None:
            mask = attention_mask.bool()
            lengths = mask.sum(dim=1)
            pos = torch.arange(T, device=input_ids.device).unsqueeze(0)  # (1, T)
            if not torch.equal(mask, pos < lengths.unsqueeze(1)):
                # stable sort: real tokens keep their order and come first, padding after
                perm = torch.argsort(torch.where(mask, pos, pos + T), dim=1, stable=True)  # (B, T)
                input_ids = input_ids.gather(1, perm)
            if bool((lengths == T).all()):
                lengths = None
        x = self.token_encoder(input_ids)  # (B, T, P)
        if self.token_norm is not None:
            x = self.token_norm(x)
        h = self.dropout(x)
        fwd = self.forward_lstm(h)
        if lengths is None:
            bwd = [y.flip(1) for y in self.backward_lstm(h.flip(1))]
        else:
            rev = _reverse_index(lengths, T)  # (B, T)
            bwd = [_gather_time(y, rev) for y in self.backward_lstm(_gather_time(h, rev))]
        return x, fwd, bwd, perm, lengths

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Score every position in both directions.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T) 1 = token, 0 = padding (either side); None = no padding.
            labels: (B, T) the tokens to predict, normally ``input_ids`` itself; -100 = ignore.  The
                model shifts them: forward position t is scored against ``labels[t+1]``, backward
                position t against ``labels[t-1]``.
            token_type_ids: ignored (accepted so transfer code can pass BERT-style inputs).
        Returns:
            ModelOutput with logits (2, B, T, V), loss and metrics when labels are given (in eval mode also
            ``token_cos`` of both directions' top layer: :func:`lmforge.nn.diagnostics.token_cosine`).
        """
        B, T = input_ids.shape
        _, fwd, bwd, perm, lengths = self._contextualize(input_ids, attention_mask)
        top = torch.stack([fwd[-1], bwd[-1]])  # (2, B, T, P)
        logits = self.softmax(self.dropout(top))  # (2, B, T, V)
        loss = None
        metrics: dict[str, torch.Tensor] = {}
        if labels is not None:
            if perm is not None:
                labels = labels.gather(1, perm)
            if lengths is not None:
                pos = torch.arange(T, device=labels.device).unsqueeze(0)
                labels = labels.masked_fill(pos >= lengths.unsqueeze(1), -100)
            ignore = labels.new_full((B, 1), -100)
            targets = torch.stack(
                [torch.cat([labels[:, 1:], ignore], dim=1), torch.cat([ignore, labels[:, :-1]], dim=1)]
            )  # (2, B, T)
            V = logits.shape[-1]
            valid = targets.view(2, -1) != -100  # (2, B*T)
            counts = valid.sum(dim=1).clamp(min=1)  # (2,)
            # each direction's mean NLL, summed: rows weighted by 1 / (tokens of their direction); the
            # gradient is made in one pass over the scores (nn.losses.cross_entropy_rows)
            weights = (valid / counts[:, None]).reshape(-1)  # (2*B*T,)
            loss, nll = cross_entropy_rows(logits.view(-1, V), targets.reshape(-1), weights)
            per_dir = nll.view(2, -1).sum(dim=1) / counts  # (2,)
            metrics = {
                "fwd_loss": per_dir[0].detach(),
                "bwd_loss": per_dir[1].detach(),
                "lm_loss": per_dir.mean().detach(),
            }
            if not self.training:  # validation: the collapse diagnostic on both directions' top layer
                real = None if lengths is None else torch.arange(T, device=top.device) < lengths[:, None]
                metrics["token_cos"] = token_cosine(torch.cat([top[0], top[1]], dim=-1), real)
        if perm is not None:
            inverse = torch.argsort(perm, dim=1)  # (B, T)
            logits = torch.stack([_gather_time(logits[0], inverse), _gather_time(logits[1], inverse)])
        return ModelOutput(loss=loss, logits=logits, metrics=metrics)

    # -- the body interface (models.base.TransferBody) -------------------------------------------
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """ELMo's three (``num_layers + 1``) representations of every token.

        Args:
            input_ids: (B, T); attention_mask: (B, T) or None; token_type_ids: ignored.
        Returns:
            ``[[x; x], [fwd_1; bwd_1], [fwd_2; bwd_2]]``, each (B, T, 2P), lowest first; padding
            positions are zero.
        """
        x, fwd, bwd, perm, lengths = self._contextualize(input_ids, attention_mask)
        layers = [torch.cat([x, x], dim=-1)] + [torch.cat([f, b], dim=-1) for f, b in zip(fwd, bwd)]  # (B, T, 2P)
        if lengths is not None:
            T = input_ids.shape[1]
            keep = torch.arange(T, device=input_ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
            layers = [h * keep.unsqueeze(-1).to(h.dtype) for h in layers]
        if perm is not None:
            inverse = torch.argsort(perm, dim=1)
            layers = [_gather_time(h, inverse) for h in layers]
        return layers

    def transfer_layers(self) -> list[nn.Module]:
        """``[token encoder (+ its norm), LSTM layer 1 (both directions), LSTM layer 2 (both directions)]``."""
        token = self.token_encoder if self.token_norm is None else nn.ModuleList([self.token_encoder, self.token_norm])
        return [token] + [
            nn.ModuleList([f, b]) for f, b in zip(self.forward_lstm.layers, self.backward_lstm.layers)
        ]

    # embed (part of TransferBody) is the shared one (lmforge.models.base.PretrainedModel.embed); the LSTMs read
    # any length, so a text is one window however long
    def layer_names(self) -> list[str]:
        return ["token"] + [f"lstm{i + 1}" for i in range(self.config.num_layers)]
