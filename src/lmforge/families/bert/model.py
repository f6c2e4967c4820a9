"""BERT: a bidirectional Transformer encoder pretrained with masked LM + next-sentence prediction.

Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding" (https://arxiv.org/abs/1810.04805).  The file reads top to bottom:

* :class:`BertConfig` - one flat config with HF field names (the pretraining-data recipe is
  :class:`lmforge.families.bert.data.MaskedLMRecipe`);
* :class:`BertEmbeddings` - token + position + segment embeddings, summed, LayerNorm, dropout;
* :class:`BertBody` - embeddings, a stack of :class:`~lmforge.nn.transformer.TransformerBlock`
  (post-LN as in the paper, pre-LN as an option) and the tanh pooler on ``[CLS]``;
* :class:`BertForPreTraining` - the body plus the MLM head (decoder tied to the token embeddings)
  and the NSP head; loss = MLM + NSP.

Module names follow HF's ``BertForPreTraining`` (``bert.embeddings.LayerNorm``, ``bert.pooler.dense``,
``cls.predictions.transform.dense`` ...) so that ``lmforge/families/bert/hf.py`` maps weights with one
small dict; only the inside of a layer uses lmforge's shared names (fused ``attn.qkv`` etc.).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError, DataError, LmforgeError
from ...models.base import ModelOutput, PretrainedModel
from ...nn.cpu_ops import Dropout, Linear, compiling, linear
from ...nn.diagnostics import token_cosine
from ...nn.losses import mean_cross_entropy, top1_share
from ...nn.transformer import TransformerBlock, document_mask, init_weights, padding_mask

logger = logging.getLogger(__name__)

#: activations of the FFN and the MLM transform that lmforge implements (HF names).
SUPPORTED_ACTS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
#: with labels, the top layer runs on the scored positions alone where they are at most this share of a row
#: (their queries, attention output and MLP; keys and values still come from every position).  At half the
#: row it still does about 60 % of the full layer's matmul work; at 15 % masking about a quarter.
SPARSE_TOP_SHARE = 0.5


@dataclasses.dataclass
class BertConfig:
    """BERT architecture (HF field names).

    The fields match ``transformers.BertConfig``; ``norm_first`` switches to a pre-LN encoder (not
    expressible in HF BERT, so such models cannot be exported); ``next_sentence=False`` drops the NSP
    objective (MLM only on single segments, RoBERTa style).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    norm_first: bool = False
    next_sentence: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"BertConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"BertConfig: hidden_size {self.hidden_size} must be divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in SUPPORTED_ACTS:
            raise ConfigError(
                f"BertConfig: hidden_act must be one of {', '.join(SUPPORTED_ACTS)}, got '{self.hidden_act}'"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"BertConfig: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.layer_norm_eps <= 0 or self.initializer_range <= 0:
            raise ConfigError("BertConfig: layer_norm_eps and initializer_range must be > 0")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(
                f"BertConfig: pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})"
            )
        if self.next_sentence and self.type_vocab_size < 2:
            raise ConfigError("BertConfig: next_sentence needs type_vocab_size >= 2 (segments A and B)")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclasses.dataclass
class BertPreTrainingOutput(ModelOutput):
    """:class:`ModelOutput` plus the next-sentence scores.

    ``logits`` are MLM scores: (B, T, V) without labels; with labels only the masked positions are
    scored, (N, V) in row-major order of ``labels != -100``.  ``nsp_logits`` is (B, 2), index 0 =
    IsNext (B follows A), 1 = NotNext, as in HF.
    """

    nsp_logits: torch.Tensor | None = None


class BertEmbeddings(nn.Module):
    """Token + position + segment embeddings, summed, then LayerNorm and dropout."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        layer_norm_eps: float = 1e-12,
        dropout: float = 0.1,
        pad_token_id: int = 0,
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        # camel-case kept from the original TF checkpoints so the HF key map stays one-to-one
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) ids (and segment ids, and positions: default 0..T-1) -> (B, T, C) embeddings."""
        T = input_ids.shape[1]
        n_pos = self.position_embeddings.num_embeddings
        if T > n_pos:
            raise LmforgeError(f"sequence of {T} tokens is longer than max_position_embeddings={n_pos}")
        x = self.word_embeddings(input_ids)  # (B, T, C)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        if position_ids is None:
            x = x + self.position_embeddings.weight[:T]  # (T, C) broadcast over B
        else:
            x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


class BertEncoder(nn.Module):
    """A stack of Transformer blocks; ``ln_f`` (a final LayerNorm) exists only for pre-LN."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(
            TransformerBlock(
                config.hidden_size,
                config.num_attention_heads,
                config.intermediate_size,
                dropout=config.hidden_dropout_prob,
                attn_dropout=config.attention_probs_dropout_prob,
                norm_first=config.norm_first,
                layer_norm_eps=config.layer_norm_eps,
                act=config.hidden_act,
            )
            for _ in range(config.num_hidden_layers)
        )
        # pre-LN leaves the residual stream un-normalised; one LayerNorm at the top fixes its scale
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.norm_first else None

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, all_states: bool = False):
        states = [x]
        for block in self.layer:
            x = block(x, attn_mask)
            states.append(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
            states[-1] = x
        return states if all_states else x

    def forward_at(self, x: torch.Tensor, attn_mask: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor:
        """The top layer's output at the (B, Tq) positions ``index`` only, (B, Tq, C); the layers below in full."""
        for block in self.layer[:-1]:
            x = block(x, attn_mask)
        x = self.layer[-1].forward_at(x, index, attn_mask)
        return x if self.ln_f is None else self.ln_f(x)


class BertPooler(nn.Module):
    """tanh(dense(h[CLS])): the sentence vector the NSP head (and sentence-level tasks) read."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, C)."""
        return torch.tanh(self.dense(h[:, 0]))


class BertBody(nn.Module):
    """Embeddings + encoder + pooler (HF's ``BertModel``)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(
            config.vocab_size,
            config.hidden_size,
            config.max_position_embeddings,
            config.type_vocab_size,
            config.layer_norm_eps,
            config.hidden_dropout_prob,
            config.pad_token_id,
        )
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config.hidden_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        all_states: bool = False,
        document_ids: torch.Tensor | None = None,
    ):
        """Returns the (B, T, C) top layer, or every layer (embeddings first) when ``all_states``.

        ``document_ids`` (B, T) (0 = padding, 1, 2, ... = the documents of a packed row, each a contiguous
        run) keeps attention inside each document and restarts positions in each: document 1 from 0 (its
        ``[CLS]``), later ones from 1, as if each were a row of its own.
        """
        x, mask = self._embed(input_ids, attention_mask, token_type_ids, document_ids)
        return self.encoder(x, mask, all_states)

    def forward_at(
        self,
        index: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The top layer at the (B, Tq) positions ``index`` only: ``forward(...)`` gathered there, (B, Tq, C)."""
        x, mask = self._embed(input_ids, attention_mask, token_type_ids, document_ids)
        return self.encoder.forward_at(x, mask, index)

    def _embed(self, input_ids, attention_mask, token_type_ids, document_ids):
        """(B, T, C) embeddings and the attention mask (padding, or documents with their own positions)."""
        if document_ids is None:
            return self.embeddings(input_ids, token_type_ids), padding_mask(attention_mask)
        mask, positions = document_mask(document_ids)
        return self.embeddings(input_ids, token_type_ids, positions), mask


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, hidden_size: int, act: str, layer_norm_eps: float):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size)
        self.act = "gelu_tanh" if SUPPORTED_ACTS[act] == "tanh" else "gelu"
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(linear(h, self.dense.weight, self.dense.bias, self.act))


class BertLMPredictionHead(nn.Module):
    """dense + GELU + LayerNorm, then the decoder: the token embedding matrix (tied) plus own bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config.hidden_size, config.hidden_act, config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # a plain attribute, not a submodule: the tied matrix is saved once, under the embeddings
        self._decoder = [word_embeddings]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., V) scores."""
        return linear(self.transform(h), self._decoder[0].weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        # the NSP head is always built so that every model exports to HF's BertForPreTraining; it stays
        # untrained when next_sentence=False
        self.seq_relationship = Linear(config.hidden_size, 2)


class ClsSepReading:
    """How the bidirectional encoders (BERT, ELECTRA) read a text: ``[CLS] text [SEP]``.

    The shared :meth:`PretrainedModel.embed` asks these for its windows; :meth:`_fill_mask_ids` builds the
    input of ``fill_mask`` with the mask id for each literal ``[MASK]``.  Needs ``self.config``
    (``max_position_embeddings``, ``num_hidden_layers``), ``self.tokenizer`` and ``self.model_type``.
    """

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise LmforgeError(f"this {self.model_type} model has no tokenizer attached; "
                               "load it with lmforge.load(MODEL_DIR)")
        return self.tokenizer

    def embed_window(self) -> int:
        """Text tokens per window: the positions less ``[CLS]`` and ``[SEP]``."""
        return self.config.max_position_embeddings - 2

    def embed_specials(self) -> tuple[list[int], list[int]]:
        tok = self._need_tokenizer()
        return [tok.cls_id], [tok.sep_id]

    def layer_names(self) -> list[str]:
        return ["emb"] + [f"layer{i + 1}" for i in range(self.config.num_hidden_layers)]

    def _fill_mask_ids(self, text: str, top_k: int) -> list[int]:
        """``[CLS] text [SEP]`` with the mask id for each literal ``[MASK]``; one-line errors for bad input."""
        tok = self._need_tokenizer()
        pieces = text.split("[MASK]")
        if len(pieces) < 2:
            raise DataError("fill-mask needs at least one [MASK] in the text, e.g. \"my dog is [MASK] .\"")
        if top_k < 1:
            raise LmforgeError(f"top_k must be >= 1, got {top_k}")
        ids: list[int] = [tok.cls_id]
        for i, piece in enumerate(pieces):
            if i:
                ids.append(tok.mask_id)
            if piece.strip():
                ids.extend(tok.encode(piece))
        ids.append(tok.sep_id)
        if len(ids) > self.config.max_position_embeddings:
            raise DataError(
                f"text is {len(ids)} tokens long; this model reads at most {self.config.max_position_embeddings}"
            )
        return ids


class BertForPreTraining(ClsSepReading, PretrainedModel):
    """BERT with the masked-LM and next-sentence heads.

    Args:
        config: a :class:`BertConfig`.
    """

    config_class = BertConfig
    model_type = "bert"

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertBody(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.apply(lambda m: init_weights(m, config.initializer_range))

    # -- the model folder ---------------------------------------------------------------------
    def tied_weight_keys(self) -> list[str]:
        return []  # the decoder is not a parameter of its own: nothing to skip

    # -- forward --------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> BertPreTrainingOutput:
        """Score masked tokens and the sentence relation; add the losses when labels are given.

        Args:
            input_ids: (B, T) token ids, ``[CLS] A [SEP] B [SEP]`` padded with ``[PAD]``.
            attention_mask: (B, T) 1 for real tokens, 0 for padding; None = no padding.
            token_type_ids: (B, T) segment ids (0 for A, 1 for B); None = all 0.
            labels: (B, T) original ids at masked positions, -100 elsewhere.  With labels only the
                masked positions go through the MLM output layer: the loss is the same as scoring
                every position, at ~15 % of the cost of the largest matmul.
            next_sentence_label: (B,) 0 = IsNext, 1 = NotNext (HF convention).
            document_ids: (B, T) for rows packed with several documents (``pack_documents``): 1, 2, ...
                per document, 0 for padding; attention stays within each document and positions
                restart in each (:class:`BertBody`).
        Returns:
            :class:`BertPreTrainingOutput`: ``loss`` = MLM + NSP (mean cross-entropies), ``logits``
            (B, T, V) without labels or (N, V) at the N masked positions with labels, ``nsp_logits``
            (B, 2), and ``metrics`` ``mlm_loss``, ``mlm_acc``, ``nsp_loss``, ``nsp_acc``; in eval mode also
            ``token_cos``, the top layer's collapse measure (:func:`lmforge.nn.diagnostics.token_cosine`).
        """
        if labels is None:
            h = self.bert(input_ids, attention_mask, token_type_ids, document_ids=document_ids)  # (B, T, C)
            nsp_logits = self.cls.seq_relationship(self.bert.pooler(h))  # (B, 2)
            return BertPreTrainingOutput(logits=self.cls.predictions(h), nsp_logits=nsp_logits)

        sel = labels != -100  # (B, T)
        target = labels[sel]  # (N,)
        h, h_sel = self._top_states(sel, input_ids, attention_mask, token_type_ids, document_ids)
        nsp_logits = self.cls.seq_relationship(self.bert.pooler(h))  # (B, 2)
        logits = self.cls.predictions(h_sel)  # (N, V)
        # in fp32 under autocast too; a batch without a masked token: a zero loss that still reaches the MLM head
        mlm_loss = mean_cross_entropy(logits, target)
        # the accuracy in fp32: a row maximum over bf16 is slow on CPU
        mlm_acc = top1_share(logits.detach().float(), target) if target.numel() else torch.zeros((), device=h.device)
        metrics: dict[str, torch.Tensor] = {"mlm_acc": mlm_acc, "mlm_loss": mlm_loss.detach()}
        if not self.training:  # validation: the collapse diagnostic on the full top layer _top_states gave
            real = attention_mask if document_ids is None else document_ids.ne(0)
            metrics["token_cos"] = token_cosine(h, real)
        loss = mlm_loss
        if next_sentence_label is not None and self.config.next_sentence:
            nsp_scores = nsp_logits.float()
            nsp_loss = F.cross_entropy(nsp_scores, next_sentence_label)
            loss = loss + nsp_loss
            metrics["nsp_loss"] = nsp_loss.detach()
            metrics["nsp_acc"] = (nsp_scores.detach().argmax(-1) == next_sentence_label).float().mean()
        return BertPreTrainingOutput(loss=loss, logits=logits, metrics=metrics, nsp_logits=nsp_logits)

    def _top_states(self, sel, input_ids, attention_mask, token_type_ids, document_ids):
        """The top states the heads read: ``(h, h[sel])`` with ``h`` holding at least every row's ``[CLS]``.

        The heads read the top layer at ``[CLS]`` and at the masked positions only, so where those are at
        most half the positions (``SPARSE_TOP_SHARE``), the top layer computes its queries, attention output
        and MLP for them alone (:meth:`TransformerBlock.forward_at`): every output row is the one the full
        layer gives.  ``h`` is then (B, Tq, C) with ``[CLS]`` first in each row, else the full (B, T, C).
        Not in eval mode (validation reads every top vector for ``token_cos``), and not under ``torch.compile``:
        the count of chosen rows changes with every batch (a new graph each).
        """
        need = sel.clone()
        need[:, 0] = True  # [CLS], for the pooler
        counts = need.sum(1)  # (B,)
        # in eval mode the full layer: validation reports every token's top vector (token_cos)
        Tq = 0 if compiling() or not self.training else int(counts.max())
        if not 0 < Tq <= SPARSE_TOP_SHARE * sel.shape[1]:
            h = self.bert(input_ids, attention_mask, token_type_ids, document_ids=document_ids)  # (B, T, C)
            return h, h[sel]
        # the needed positions of each row first, in order (a stable sort of "not needed"), then other ones
        index = torch.sort((~need).to(torch.uint8), dim=1, stable=True).indices[:, :Tq]  # (B, Tq)
        h = self.bert.forward_at(index, input_ids, attention_mask, token_type_ids, document_ids)  # (B, Tq, C)
        sel_q = sel.gather(1, index) & (torch.arange(Tq, device=sel.device) < counts[:, None])  # (B, Tq)
        return h, h[sel_q]  # row-major order of sel, as index keeps each row's positions in order

    # -- the body interface (models.base.TransferBody) ----------------------------------------------
    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Every layer's (B, T, C) output, embeddings first (num_hidden_layers + 1 tensors).

        Pre-LN models return the top layer after the final LayerNorm (what the heads read).
        The module's train/eval mode is left as it is.
        """
        return self.bert(input_ids, attention_mask, token_type_ids, all_states=True)

    def transfer_layers(self) -> list[nn.Module]:
        """The body from the bottom: embeddings, each encoder layer (then ``ln_f`` for pre-LN)."""
        parts: list[nn.Module] = [self.bert.embeddings, *self.bert.encoder.layer]
        if self.bert.encoder.ln_f is not None:
            parts.append(self.bert.encoder.ln_f)
        return parts

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The tanh-pooled ``[CLS]`` vector, (B, C)."""
        return self.bert.pooler(self.bert(input_ids, attention_mask, token_type_ids))

    # -- embed (the shared one, read as ClsSepReading says) and fill-mask ---------------------------
    def _device(self) -> torch.device:
        return self.bert.embeddings.word_embeddings.weight.device

    @torch.no_grad()
    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """Predict the tokens hidden behind each literal ``[MASK]`` in ``text``.

        Args:
            text: e.g. ``"my dog is [MASK] ."``; each ``[MASK]`` stands for one WordPiece token.
            top_k: how many candidates per mask.
        Returns:
            For each ``[MASK]`` (left to right), ``top_k`` pairs (token, probability), most likely first.
        """
        tok = self._need_tokenizer()
        ids = self._fill_mask_ids(text, top_k)
        was_training = self.training
        self.eval()
        try:
            input_ids = torch.tensor([ids], dtype=torch.long, device=self._device())
            h = self.bert(input_ids)  # (1, T, C)
            where = (input_ids[0] == tok.mask_id).nonzero().squeeze(1)  # (M,)
            probs = self.cls.predictions(h[0, where]).float().softmax(-1)  # (M, V)
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        finally:
            self.train(was_training)
        return [
            [(tok.id_to_token(int(i)), float(p)) for p, i in zip(ps.tolist(), ix.tolist())]
            for ps, ix in zip(top.values, top.indices)
        ]


__all__ = [
    "BertConfig",
    "BertForPreTraining",
    "BertPreTrainingOutput",
]
