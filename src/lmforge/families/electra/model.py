"""ELECTRA: a BERT encoder trained to tell the tokens a small generator replaced from the original ones.

Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators" (ICLR 2020,
https://arxiv.org/abs/2003.10555).  A masked LM learns from the ~15 % of positions it masks; ELECTRA's
discriminator learns from every position: a small generator (a masked LM) fills the masked positions with
its own samples, and the discriminator classifies each token as original or replaced ("replaced token
detection").  The discriminator is the model a user keeps (the body of ``embed`` and transfer); the
generator serves ``fill-mask``.  The file reads top to bottom:

* :class:`ElectraConfig` - HF ``ElectraConfig``'s fields, the generator's size, λ, and the pretraining data;
* :func:`sample_tokens` - one draw from the generator's softmax per masked position;
* :class:`ElectraModel` - token + position + segment embeddings of width E (BERT's
  :class:`~lmforge.families.bert.model.BertEmbeddings`), a projection to the width C when E != C (HF's
  ``embeddings_project``) and a stack of :class:`~lmforge.nn.transformer.TransformerBlock`;
* :class:`ElectraGenerator` - a narrower ElectraModel over the *same* embeddings, and the masked-LM head;
* :class:`ElectraForPreTraining` - discriminator + generator; ``forward`` with labels is the joint loss.

The recipe, as the paper and its code (google-research/electra) set it; docs/electra.md has the table:

* the generator is a masked LM 1/``generator_size_divisor`` of the discriminator's width, as deep: the
  paper finds 1/4 to 1/2 best (a generator as strong as the discriminator makes the task too hard) and uses
  1/4 for Small and Large, 1/3 for Base; its heads and FFN follow the code's rule (heads = width / 64, at
  least 1; FFN = 4 x width);
* generator and discriminator share the token, position and segment embeddings (and their LayerNorm): the
  generator's softmax updates every token embedding, the discriminator's input only the ones it sees;
  each model projects the width-E embeddings to its own width;
* the generator samples at temperature 1 from its softmax; the samples are discrete data for the
  discriminator, so no gradient flows from the discriminator's loss into the generator (the generator is
  trained by its MLM loss alone, not adversarially: the paper's "maximum likelihood" generator);
* the discriminator's input is the original text with the generator's samples at the masked positions;
  its label at a position is "replaced" exactly when the sample differs from the original token (a sample
  equal to the original counts as original);
* loss = L_MLM(generator) + λ L_RTD(discriminator), λ = ``discriminator_weight`` = 50: the binary loss
  is much smaller than the MLM loss, and the paper weighs it up; L_RTD averages the sigmoid cross-entropy
  over every non-padding position (``[CLS]`` and ``[SEP]`` included, as in the code);
* 15 % of the tokens are picked, 85 % of them shown as ``[MASK]`` and 15 % unchanged
  (:mod:`lmforge.families.electra.data`); no next-sentence prediction.

Module names follow HF's ``ElectraForPreTraining`` (``electra.embeddings``, ``electra.embeddings_project``,
``discriminator_predictions.dense``) and, under ``generator.``, HF's ``ElectraForMaskedLM``
(``generator.electra.encoder``, ``generator.generator_predictions``, ``generator.generator_lm_head``), so
``lmforge/families/electra/hf.py`` maps weights with one small dict.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ...models.base import ModelOutput, PretrainedModel
from ...nn.cpu_ops import Linear, linear
from ...nn.diagnostics import roc_auc, token_cosine
from ...nn.losses import mean_cross_entropy, top1_share
from ...nn.transformer import TransformerBlock, document_mask, init_weights, padding_mask
from ..bert.model import SUPPORTED_ACTS, BertEmbeddings, ClsSepReading

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ElectraConfig:
    """ELECTRA's architecture (HF field names), its generator and loss weight.

    The first block matches ``transformers.ElectraConfig`` and describes the discriminator; the defaults are
    the paper's ELECTRA-Small.  HF keeps a generator in a config of its own; here its shape follows from
    ``generator_size_divisor`` d (:attr:`generator_shape`: width round(C / d), heads width // 64 (at least
    1), FFN 4 x width, as many layers: ``get_generator_config`` of the paper's code).
    ``discriminator_weight`` is λ in loss = L_MLM + λ L_RTD.  The pretraining-data recipe is
    :class:`lmforge.families.bert.data.MaskedLMRecipe`.
    """

    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # the replaced-token-detection recipe
    generator_size_divisor: int = 4
    discriminator_weight: float = 50.0
    #: the discriminator's output bias at initialisation, the log-odds of "replaced" before any step: -2 is
    #: about the replaced share (12 %), so the detector starts at the prior and its token vectors do not
    #: collapse (docs/electra.md, the recipe search); 0 = even odds, the paper's code
    discriminator_bias_init: float = -2.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size", "generator_size_divisor"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ElectraConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"ElectraConfig: hidden_size {self.hidden_size} must be divisible by "
                              f"num_attention_heads {self.num_attention_heads}")
        width, heads, _ = self.generator_shape
        if width % heads:
            raise ConfigError(f"ElectraConfig: the generator's width {width} (hidden_size / generator_size_divisor) "
                              f"must be divisible by its {heads} heads; choose another generator_size_divisor")
        if self.hidden_act not in SUPPORTED_ACTS:
            raise ConfigError(
                f"ElectraConfig: hidden_act must be one of {', '.join(SUPPORTED_ACTS)}, got '{self.hidden_act}'"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"ElectraConfig: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.discriminator_weight <= 0 or self.layer_norm_eps <= 0 or self.initializer_range <= 0:
            raise ConfigError("ElectraConfig: discriminator_weight, layer_norm_eps and initializer_range must be > 0")
        if not math.isfinite(self.discriminator_bias_init):
            raise ConfigError("ElectraConfig: discriminator_bias_init must be a finite log-odds (e.g. -2), "
                              f"got {self.discriminator_bias_init}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(
                f"ElectraConfig: pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})"
            )

    @property
    def generator_shape(self) -> tuple[int, int, int]:
        """The generator's (width, attention heads, FFN size)."""
        width = max(1, round(self.hidden_size / self.generator_size_divisor))
        return width, max(1, width // 64), 4 * width


def sample_tokens(logits: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from ``softmax(logits)`` (temperature 1), without gradient.

    Args:
        logits: (N, V) scores.
        noise: (N,) uniforms in [0, 1): row i takes the first token whose cumulative probability exceeds
            ``noise[i]`` (inverse-CDF sampling: each token with its probability, and the draw a function of
            the given number).  None: ``torch.multinomial`` on the global generator.
    Returns:
        (N,) int64 token ids.
    """
    with torch.no_grad():
        probs = torch.softmax(logits.detach().float(), dim=-1)  # (N, V)
        if noise is None:
            return torch.multinomial(probs, 1).squeeze(1) if len(probs) else probs.new_zeros(0, dtype=torch.long)
        cdf = probs.cumsum(dim=-1)  # (N, V)
        at = (noise.to(cdf) * cdf[:, -1]).unsqueeze(1)  # (N, 1): scaled by the total, which rounding leaves near 1
        return torch.searchsorted(cdf, at, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def _detector_diagnostics(h: torch.Tensor, logits: torch.Tensor, replaced: torch.Tensor, original: torch.Tensor,
                          real: torch.Tensor) -> dict[str, torch.Tensor]:
    """``token_cos`` of the discriminator's top layer (non-padding tokens) and ``rtd_auc``, its scores' ROC AUC
    for replaced vs original over the tokens the recipe could mask (:mod:`lmforge.nn.diagnostics`).

    ``[CLS]`` and ``[SEP]`` are never masked, so they are always original: counting them would credit the
    detector for knowing them.  Every pretraining row starts with ``[CLS]`` and ends with ``[SEP]`` (packed
    documents are joined by ``[SEP]``), so their ids are read off each row's first and last real position.
    """
    ends = (real.sum(1) - 1).clamp(min=0)  # (B,) the last real position of each row (rows are right-padded)
    specials = torch.cat([original[:, 0], original.gather(1, ends[:, None]).squeeze(1)])
    ordinary = real & ~torch.isin(original, specials)  # (B, T)
    return {"token_cos": token_cosine(h, real), "rtd_auc": roc_auc(logits[ordinary], replaced[ordinary])}


@dataclasses.dataclass
class ElectraPreTrainingOutput(ModelOutput):
    """:class:`ModelOutput` of :class:`ElectraForPreTraining`.

    ``logits`` are the discriminator's scores (B, T), > 0 = replaced (HF's ``ElectraForPreTraining``).  With
    labels, also: ``generator_logits`` (N, V) at the N masked positions (row-major order of
    ``labels != -100``); ``generator_loss`` and ``discriminator_loss``, the two parts of ``loss`` with their
    graphs; ``replaced`` (B, T) bool, the discriminator's targets; ``discriminator_input`` (B, T), the ids it read.
    """

    generator_logits: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    discriminator_loss: torch.Tensor | None = None
    replaced: torch.Tensor | None = None
    discriminator_input: torch.Tensor | None = None


class ElectraEncoder(nn.Module):
    """A stack of post-LN Transformer blocks (HF's ``ElectraEncoder``)."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, num_layers: int,
                 config: ElectraConfig):
        super().__init__()
        self.layer = nn.ModuleList(
            TransformerBlock(hidden_size, num_heads, intermediate_size, dropout=config.hidden_dropout_prob,
                             attn_dropout=config.attention_probs_dropout_prob, layer_norm_eps=config.layer_norm_eps,
                             act=config.hidden_act)
            for _ in range(num_layers)
        )

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, all_states: bool = False):
        states = [x]
        for block in self.layer:
            x = block(x, attn_mask)
            states.append(x)
        return states if all_states else x


class ElectraModel(nn.Module):
    """HF's ``ElectraModel``: embeddings (width E), ``embeddings_project`` (E -> C, only when E != C), encoder.

    Args:
        embeddings: the token/position/segment embeddings.
        hidden_size, num_heads, intermediate_size: this model's width, heads and FFN size.
        config: depth, dropout, activation, LayerNorm epsilon.
        owns_embeddings: False for the generator, which reads the discriminator's ``embeddings``: they are
            then not a submodule here, so that their weights are saved once, under the discriminator's names.
    """

    def __init__(self, embeddings: BertEmbeddings, hidden_size: int, num_heads: int, intermediate_size: int,
                 config: ElectraConfig, owns_embeddings: bool = True):
        super().__init__()
        self._embeddings = [embeddings]  # a plain list: shared modules are registered by their owner only
        if owns_embeddings:
            self.embeddings = embeddings
        E = embeddings.word_embeddings.embedding_dim
        self.embeddings_project = Linear(E, hidden_size) if E != hidden_size else None
        self.encoder = ElectraEncoder(hidden_size, num_heads, intermediate_size, config.num_hidden_layers, config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, all_states: bool = False,
                document_ids: torch.Tensor | None = None):
        """The (B, T, C) top layer, or every layer (the projected embeddings first) when ``all_states``.

        ``document_ids`` (B, T) (1, 2, ... per packed document, 0 for padding) keeps attention inside each
        document and restarts positions in each, as :class:`~lmforge.families.bert.model.BertBody` does.
        """
        mask, positions = padding_mask(attention_mask), None
        if document_ids is not None:
            mask, positions = document_mask(document_ids)
        x = self._embeddings[0](input_ids, token_type_ids, positions)  # (B, T, E)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)  # (B, T, C)
        return self.encoder(x, mask, all_states)


class ElectraDiscriminatorPredictions(nn.Module):
    """dense + activation + ``dense_prediction``: one score per position, > 0 = replaced."""

    def __init__(self, hidden_size: int, act: str):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size)
        self.dense_prediction = Linear(hidden_size, 1)
        self.act = "gelu_tanh" if SUPPORTED_ACTS[act] == "tanh" else "gelu"

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T)."""
        return self.dense_prediction(linear(h, self.dense.weight, self.dense.bias, self.act)).squeeze(-1)


class ElectraGeneratorPredictions(nn.Module):
    """dense (C_g -> E) + GELU + LayerNorm: back to the embedding width, where the output layer is tied."""

    def __init__(self, hidden_size: int, embedding_size: int, layer_norm_eps: float):
        super().__init__()
        self.dense = Linear(hidden_size, embedding_size)
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=layer_norm_eps)  # HF's name

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(linear(h, self.dense.weight, self.dense.bias, "gelu"))  # HF's: exact GELU always


class ElectraTiedHead(nn.Module):
    """The generator's output layer: the token embedding matrix (tied: not a parameter of its own) and a bias."""

    def __init__(self, word_embeddings: nn.Embedding):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))
        self._decoder = [word_embeddings]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., E) -> (..., V)."""
        return linear(x, self._decoder[0].weight, self.bias)


class ElectraGenerator(nn.Module):
    """HF's ``ElectraForMaskedLM`` over the discriminator's embeddings: the masked LM that proposes replacements."""

    def __init__(self, config: ElectraConfig, embeddings: BertEmbeddings):
        super().__init__()
        width, heads, ffn = config.generator_shape
        self.electra = ElectraModel(embeddings, width, heads, ffn, config, owns_embeddings=False)
        self.generator_predictions = ElectraGeneratorPredictions(width, config.embedding_size, config.layer_norm_eps)
        self.generator_lm_head = ElectraTiedHead(embeddings.word_embeddings)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, T, C_g) top layer."""
        return self.electra(input_ids, attention_mask, token_type_ids, document_ids=document_ids)

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        """(..., C_g) top-layer vectors -> (..., V) masked-LM scores."""
        return self.generator_lm_head(self.generator_predictions(h))


class ElectraForPreTraining(ClsSepReading, PretrainedModel):
    """ELECTRA's discriminator (the body) and generator, pretrained jointly by replaced token detection.

    Args:
        config: an :class:`ElectraConfig`.
    """

    config_class = ElectraConfig
    model_type = "electra"

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        embeddings = BertEmbeddings(config.vocab_size, config.embedding_size, config.max_position_embeddings,
                                    config.type_vocab_size, config.layer_norm_eps, config.hidden_dropout_prob,
                                    config.pad_token_id)
        self.electra = ElectraModel(embeddings, config.hidden_size, config.num_attention_heads,
                                    config.intermediate_size, config)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config.hidden_size, config.hidden_act)
        self.generator = ElectraGenerator(config, embeddings)
        self.apply(lambda m: init_weights(m, config.initializer_range))
        if config.discriminator_bias_init:  # draws nothing: the run's random numbers are the same either way
            nn.init.constant_(self.discriminator_predictions.dense_prediction.bias, config.discriminator_bias_init)

    # -- forward --------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        sample_noise: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> ElectraPreTrainingOutput:
        """Without labels: the discriminator's scores of ``input_ids``.  With labels: one step of the objective.

        Args:
            input_ids: (B, T) ids; with labels, the generator's input (masked positions mostly ``[MASK]``).
            attention_mask: (B, T) 1 for real tokens, 0 for padding; None = no padding.
            token_type_ids: (B, T) segment ids; None = all 0.
            labels: (B, T) the original id at the masked positions, -100 elsewhere.
            sample_noise: (B, T) uniforms that draw the generator's samples (:func:`sample_tokens`); None =
                the global torch generator.
            document_ids: (B, T) for rows packed with several documents (see :class:`ElectraModel`).
        Returns:
            :class:`ElectraPreTrainingOutput`; with labels ``loss`` = L_MLM + λ L_RTD and ``metrics``
            ``mlm_loss``, ``mlm_acc`` (generator), ``rtd_loss``, ``rtd_acc`` (discriminator, every non-padding
            position) and ``replaced`` (share of non-padding positions replaced); in eval mode also the
            diagnostics ``token_cos`` and ``rtd_auc`` (:func:`_detector_diagnostics`).
        """
        if labels is None:
            h = self.electra(input_ids, attention_mask, token_type_ids, document_ids=document_ids)  # (B, T, C)
            return ElectraPreTrainingOutput(logits=self.discriminator_predictions(h))
        sel = labels != -100  # (B, T): the masked positions
        original = torch.where(sel, labels, input_ids)  # (B, T): the text before masking
        target = labels[sel]  # (N,)

        # 1. the generator: a masked LM, scored at the masked positions only
        g = self.generator(input_ids, attention_mask, token_type_ids, document_ids)  # (B, T, C_g)
        gen_logits = self.generator.scores(g[sel]).float()  # (N, V), fp32 under autocast too
        gen_loss = mean_cross_entropy(gen_logits, target)  # its gradient made in one pass over the scores, as BERT's

        # 2. its samples replace the masked tokens; they are data, so no gradient passes through them
        sampled = sample_tokens(gen_logits, None if sample_noise is None else sample_noise[sel])  # (N,)
        corrupted = original.masked_scatter(sel, sampled)  # (B, T)
        replaced = corrupted != original  # (B, T): a sample equal to the original is an original token

        # 3. the discriminator: original or replaced, at every non-padding position
        h = self.electra(corrupted, attention_mask, token_type_ids, document_ids=document_ids)  # (B, T, C)
        logits = self.discriminator_predictions(h).float()  # (B, T)
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(sel)
        disc_loss = F.binary_cross_entropy_with_logits(logits[real], replaced[real].float())
        loss = gen_loss + self.config.discriminator_weight * disc_loss

        with torch.no_grad():
            metrics = {
                "mlm_loss": gen_loss.detach(),
                "mlm_acc": top1_share(gen_logits.detach(), target) if target.numel() else gen_loss * 0.0,
                "rtd_loss": disc_loss.detach(),
                "rtd_acc": ((logits[real] > 0) == replaced[real]).float().mean(),
                "replaced": replaced[real].float().mean(),
            }
            if not self.training:  # validation: the diagnostics, from the tensors at hand (no RNG, no pass)
                metrics.update(_detector_diagnostics(h, logits, replaced, original, real))
        return ElectraPreTrainingOutput(
            loss=loss, logits=logits, metrics=metrics, generator_logits=gen_logits, generator_loss=gen_loss,
            discriminator_loss=disc_loss, replaced=replaced, discriminator_input=corrupted,
        )

    def generator_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The generator's masked-LM scores at every position, (B, T, V) (HF's ``ElectraForMaskedLM`` logits)."""
        return self.generator.scores(self.generator(input_ids, attention_mask, token_type_ids))

    # -- the body interface (models.base.TransferBody): the discriminator ----------------------------
    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The discriminator's every layer, (B, T, C) each: the (projected) embeddings, then each block.

        HF's ``ElectraModel(..., output_hidden_states=True).hidden_states``; the train/eval mode is left as it is.
        """
        return self.electra(input_ids, attention_mask, token_type_ids, all_states=True)

    def transfer_layers(self) -> list[nn.Module]:
        """The discriminator from the bottom: the embeddings (with their projection), then each block."""
        bottom: nn.Module = self.electra.embeddings
        if self.electra.embeddings_project is not None:
            bottom = nn.ModuleList([self.electra.embeddings, self.electra.embeddings_project])
        return [bottom, *self.electra.encoder.layer]

    # -- embed (TransferBody) and fill-mask (the generator) ------------------------------------------
    def _device(self) -> torch.device:
        return self.electra.embeddings.word_embeddings.weight.device

    @torch.no_grad()
    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """The generator's top candidates for each literal ``[MASK]`` in ``text``.

        Args:
            text: e.g. ``"my dog is [MASK] ."``; each ``[MASK]`` stands for one WordPiece token.
            top_k: candidates per mask.
        Returns:
            For each ``[MASK]`` (left to right), ``top_k`` pairs (token, probability), most likely first.
        """
        tok = self._need_tokenizer()
        ids = self._fill_mask_ids(text, top_k)
        with self.evaluating():
            input_ids = torch.tensor([ids], dtype=torch.long, device=self._device())
            where = (input_ids[0] == tok.mask_id).nonzero().squeeze(1)  # (M,)
            g = self.generator(input_ids)  # (1, T, C_g)
            probs = self.generator.scores(g[0, where]).float().softmax(-1)  # (M, V)
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        return [
            [(tok.id_to_token(int(i)), float(p)) for p, i in zip(ps.tolist(), ix.tolist())]
            for ps, ix in zip(top.values, top.indices)
        ]


__all__ = [
    "ElectraConfig",
    "ElectraForPreTraining",
    "ElectraPreTrainingOutput",
    "sample_tokens",
]
