"""What every lmforge model family shares: the model folder, the output types and the body interface.

A model folder holds ``config.json`` (with ``model_type``), ``model.safetensors``, the tokenizer
files and, after pretraining, ``training_state/``.  ``Model(config)`` never needs weights;
:meth:`PretrainedModel.from_pretrained` is the separate loading step, and reads safetensors only.
:class:`TransferBody` is what transfer, ``embed`` and the evaluations use of a model, whatever its family.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from ..config import from_dict, load_json
from ..errors import CheckpointError, LmforgeError
from ..storage.checks import check_dtypes, check_recorded_tokenizer, check_tokenizer_fits, read_weights
from ..storage.files import save_json
from ..storage.writing import save_weights
from ..tokenization import Tokenizer
from . import sentence, vectors
from .family_hook import family_of
from .windows import Window, plan_windows

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ModelOutput:
    """What ``forward`` returns in every family.

    Attributes:
        loss: scalar training loss when labels were given, else ``None``.
        logits: the main prediction scores (family-specific shape, documented on each model).
        metrics: extra detached scalars for logging, e.g. ``{"mlm_loss": ..., "nsp_acc": ...}``.
        hidden_states: per-layer representations when asked for, else ``None``.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    metrics: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class TokenLayers:
    """Contextual (or static) vectors of one text, as ``embed`` returns them in every family.

    Attributes:
        tokens: the model's tokens for the text (no special tokens).
        offsets: (start, end) character span of each token in the original text.
        layers: (L, n_tokens, C) float tensor, one row per layer, lowest first (embedding layer
            first for the Transformers, token layer then LSTM-1, LSTM-2 for ELMo, a single layer for
            word2vec).
        layer_names: a short name per layer, e.g. ``["emb", "layer1", ...]``.
        cls: (L, C) every layer's vector of the model's ``[CLS]`` token (BERT: the one of the text's first
            window); None for families without one.
    """

    tokens: list[str]
    offsets: list[tuple[int, int]]
    layers: torch.Tensor
    layer_names: list[str]
    cls: torch.Tensor | None = None


@runtime_checkable
class TransferBody(Protocol):
    """The interface every family's model offers to transfer (heads on top of a pretrained body), to
    ``lmforge embed`` and to the evaluations; ``tests/test_body_interface.py`` checks it for each family.

    Attributes:
        model_type: the family name (``"bert"``...).
        tokenizer: the attached :class:`lmforge.tokenization.Tokenizer` (None until loaded or attached).
        hidden_size: the width C of every layer :meth:`hidden_states` returns.
    """

    model_type: str
    tokenizer: Any

    @property
    def hidden_size(self) -> int: ...

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Every layer's (B, T, C) representation, lowest (the token embedding) first.

        ``attention_mask`` (B, T) is 1 for real tokens, 0 for padding; families without segments ignore
        ``token_type_ids``.  The module's train/eval mode is left as it is.
        """
        ...

    def transfer_layers(self) -> list[nn.Module]:
        """The body as consecutive parts from the bottom (embeddings first): what gradual unfreezing and
        layer-wise learning rates walk through."""
        ...

    def embed(self, texts: list[str]) -> list[TokenLayers]:
        """Every layer's vector of every token of each text (uses ``self.tokenizer``).

        Texts longer than the model's positions are read in overlapping windows
        (:meth:`PretrainedModel.embed`); no token is dropped.
        """
        ...

    def encode(self, texts: list[str], *, layer: int | None = None, pool: str | None = None,
               normalize: bool | None = None, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        """One float32 vector per text, (len(texts), C): :func:`lmforge.models.vectors.encode` on this body."""
        ...


class PretrainedModel(nn.Module):
    """Base class: config handling plus safetensors save/load of a model folder."""

    config_class: ClassVar[type]
    model_type: ClassVar[str]

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tokenizer = None  # attached by lmforge.load / from_pretrained when the folder has one
        # how encode reads a whole text when its folder records it (imported from sentence-transformers)
        self.sentence_pipeline: sentence.SentencePipeline | None = None

    @contextlib.contextmanager
    def evaluating(self):
        """Eval mode (no dropout) for the duration, then the mode the model had: every ``embed`` runs in it."""
        was = self.training
        self.eval()
        try:
            yield self
        finally:
            self.train(was)

    # -- the body's token vectors: one embed for every family ---------------------------------
    contextual: ClassVar[bool] = True  # a token's vectors depend on its text (False: word2vec's static vectors)
    embed_causal: ClassVar[bool] = False  # a token sees only the tokens before it (GPT): picks embed's windows

    def embed_window(self) -> int | None:
        """The most text tokens one forward pass of :meth:`embed` reads (special tokens not counted); None = any."""
        return None

    def embed_specials(self) -> tuple[list[int], list[int]]:
        """Token ids :meth:`embed` puts before and after every window's text (BERT: ``[CLS]`` and ``[SEP]``)."""
        return [], []

    def layer_names(self) -> list[str]:
        """A short name per layer of :meth:`hidden_states`, lowest first."""
        raise NotImplementedError

    @torch.no_grad()
    def embed(self, texts: list[str], batch_size: int = 32,
              forward: sentence.Forward | None = None) -> list[TokenLayers]:
        """Every layer's vector of every token of each text, in eval mode (uses ``self.tokenizer``).

        Each text is read as ``specials-before + tokens + specials-after``; a text longer than
        :meth:`embed_window` is read in overlapping windows, each token taking its vectors from the window
        where it sees the most context (:mod:`lmforge.models.windows`), so no token is dropped.

        Args:
            texts: raw strings.
            batch_size: windows per forward pass (shortest first, so a batch holds windows of similar length).
            forward: a top-layer forward pass (:data:`lmforge.models.sentence.Forward`, e.g. an ONNX Runtime
                session) to run the windows on instead of the model; the layers are then the top one alone.
        Returns:
            One :class:`TokenLayers` per text: its tokens (no special tokens), their character offsets and
            layers (L, n_tokens, C) (L = 1 with ``forward``); ``cls`` holds the first window's vectors of the
            first special token before the text, when the family puts one there.
        """
        if self.tokenizer is None:
            raise LmforgeError(f"this {self.model_type} model has no tokenizer attached; "
                               "load it with lmforge.load(MODEL_DIR)")
        encoded = [self.tokenizer.encode_with_offsets(t) for t in texts]
        rows = [(t, w) for t, (ids, _, _) in enumerate(encoded)
                for w in plan_windows(len(ids), self.embed_window(), self.embed_causal)]
        rows.sort(key=lambda row: row[1].end - row[1].start)  # similar lengths share a batch: little padding
        names = self.layer_names() if forward is None else self.layer_names()[-1:]
        width = self.hidden_size
        out = [TokenLayers(list(tokens), [tuple(o) for o in offsets], torch.zeros(len(names), len(ids), width),
                           list(names)) for ids, tokens, offsets in encoded]
        with self.evaluating():
            for start in range(0, len(rows), batch_size):
                self._embed_rows(rows[start : start + batch_size], encoded, out, forward)
        return out

    def _embed_rows(self, rows: list[tuple[int, Window]], encoded: list, out: list[TokenLayers],
                    forward: sentence.Forward | None = None) -> None:
        """Run one batch of windows and copy each window's owned tokens (and first-window [CLS]) into ``out``."""
        before, after = self.embed_specials()
        seqs = [before + list(encoded[t][0][w.start : w.end]) + after for t, w in rows]
        live = [r for r, seq in enumerate(seqs) if seq]  # an empty text of a family without specials: nothing to run
        if not live:
            return
        pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else 0
        T = max(len(seqs[r]) for r in live)
        ids = torch.full((len(live), T), pad, dtype=torch.long)
        mask = torch.zeros((len(live), T), dtype=torch.long)
        for b, r in enumerate(live):
            ids[b, : len(seqs[r])] = torch.tensor(seqs[r], dtype=torch.long)
            mask[b, : len(seqs[r])] = 1
        if forward is not None:  # the top layer alone, (B, 1, T, C)
            stacked = torch.from_numpy(forward(ids.numpy(), mask.numpy())).float().unsqueeze(1)
        else:
            device = next(self.parameters()).device
            states = self.hidden_states(ids.to(device), mask.to(device))
            stacked = torch.stack(states, dim=1).float().cpu()  # (B, L, T, C)
        for b, r in enumerate(live):
            t, w = rows[r]
            lo = len(before) + w.own_start - w.start
            out[t].layers[:, w.own_start : w.own_end] = stacked[b, :, lo : lo + w.own_end - w.own_start]
            if before and w.start == 0:
                out[t].cls = stacked[b, :, 0].clone()  # (L, C)

    # -- vectors out -------------------------------------------------------------------------
    def encode(
        self,
        texts: list[str],
        *,
        layer: int | None = None,
        pool: str | None = None,
        normalize: bool | None = None,
        batch_size: int = 32,
        progress: vectors.Progress = False,
        prompt_name: str | None = None,
        forward: sentence.Forward | None = None,
        backend: str = "torch",
        quantize: str = "none",
    ) -> np.ndarray:
        """One vector per text: :func:`lmforge.models.vectors.encode` on this model (see it for the arguments).

        Returns:
            float32 array (len(texts), hidden_size), row i for text i.
        """
        return vectors.encode(self, texts, layer=layer, pool=pool, normalize=normalize, batch_size=batch_size,
                              progress=progress, prompt_name=prompt_name, forward=forward,
                              backend=backend, quantize=quantize)

    # -- weights -----------------------------------------------------------------------------
    def tied_weight_keys(self) -> list[str]:
        """State-dict keys that alias another parameter and are not written to disk."""
        return []

    def save_pretrained(self, out_dir: str | Path, tokenizer=None) -> None:
        """Write ``config.json`` and ``model.safetensors`` (and the tokenizer) into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v for k, v in self.state_dict().items() if k not in set(self.tied_weight_keys())}
        meta = {"format": "pt", "model_type": self.model_type}
        save_weights(state, out / "model.safetensors", "model", metadata=meta)
        save_json(self.config, out / "config.json", model_type=self.model_type)
        tok = tokenizer if tokenizer is not None else self.tokenizer
        if tok is not None:
            tok.save(out)
        if self.sentence_pipeline is not None:
            sentence.write_pipeline(self.sentence_pipeline, out)

    def load_weights(self, state: dict[str, torch.Tensor], strict: bool = True,
                     where: str | Path = "the weights") -> None:
        """Load a state dict, treating tied keys as optional; mismatches are a CheckpointError.

        Args:
            where: how the messages name the weights (their file).
        """
        tied = set(self.tied_weight_keys())
        own = self.state_dict()
        missing = [k for k in own if k not in state and k not in tied]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise CheckpointError(
                f"weights do not fit this {self.model_type} config: "
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
            )
        bad = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
        if bad:
            k = bad[0]
            raise CheckpointError(
                f"weight '{k}' has shape {tuple(state[k].shape)} but the config expects {tuple(own[k].shape)}"
            )
        check_dtypes(state, own, where)
        self.load_state_dict(state, strict=False)

    @classmethod
    def config_from_folder(cls, path: str | Path):
        data = load_json(Path(path) / "config.json")
        mt = data.get("model_type")
        if mt != cls.model_type:
            raise CheckpointError(f"{path} holds a '{mt}' model, not '{cls.model_type}'")
        return from_dict(cls.config_class, data, ignore=("model_type",))

    @classmethod
    def from_pretrained(cls, path: str | Path, *, load_tokenizer: bool = True):
        """Build the model from ``path/config.json`` and load ``path/model.safetensors``."""
        p = Path(path)
        if not p.is_dir():
            raise CheckpointError(f"model folder not found: {p}")
        config = cls.config_from_folder(p)
        model = cls(config)

        weights = p / "model.safetensors"
        model.load_weights(read_weights(weights), where=weights)
        model.eval()
        model.sentence_pipeline = sentence.read_pipeline(p)
        if load_tokenizer and (p / "tokenizer.json").is_file():
            model.tokenizer = Tokenizer.load(p)
            check_tokenizer_fits(config, model.tokenizer, p, family_of(cls.model_type))
            check_recorded_tokenizer(p, model.tokenizer)
        return model

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
