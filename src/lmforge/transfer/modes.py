"""The three ways of carrying a pretrained body over to a labelled task, and one run of each.

- ``frozen``: the body is frozen (``requires_grad=False``, eval mode) and runs inside every training
  step; only the new head (and, for ELMo, the ScalarMix) trains.
- ``features``: the body runs ONCE over the train and test data; the vectors the head reads are
  cached on disk as safetensors, keyed by a hash of the model weights, the data and the settings,
  and a small classifier (logistic regression or an MLP, in torch) trains on the cache.  A second
  run with the same model, data and settings reads the cache instead of running the body.
- ``finetune``: body and head train together; ``freeze_layers=K`` keeps items ``0..K`` of
  ``body.transfer_layers()`` (the embeddings and the lowest K layers) fixed, and
  ``layer_lr_decay=d`` gives item ``i`` of ``n`` the learning rate ``lr * d ** (n - 1 - i)`` (the head
  and the top layer train at ``lr``).  ``from_scratch=True`` re-initialises the body from its config
  first: the same architecture with no pretraining, the baseline of the learning curve.

Which family supports what is :data:`SUPPORTED`; any other combination is a one-line error.

The entry point is :func:`run_transfer`; :func:`load_run` / :meth:`TransferRun.predict` use a
finished run's folder (``config.json``, ``metrics.json``, ``predictions.jsonl``, ``head.safetensors``
and, after fine-tuning, ``body.safetensors``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import from_dict, load_json, save_json, to_dict
from ..errors import CheckpointError, ConfigError, DataError, LmforgeError
from ..utils import atomic_write_text, file_sha256, load_safetensors, save_safetensors, seed_everything
from . import metrics as M
from .encoding import Encoding, InputFormat
from .heads import CLASSIFIERS, TaskHead
from .tasks import (
    SENTENCE_TASKS,
    TASKS,
    ChoiceExample,
    QAExample,
    TaskData,
    TextExample,
    TokensExample,
    check_labels,
    is_bio,
    load_task,
)

logger = logging.getLogger(__name__)

MODES = ("frozen", "features", "finetune")
SUPPORTED: dict[str, tuple[str, ...]] = {
    "bert": ("frozen", "features", "finetune"),
    "gpt": ("frozen", "features", "finetune"),
    "elmo": ("frozen", "features"),
    "word2vec": ("features",),
}
# Tasks a family cannot serve: a static word vector cannot locate an answer span.
UNSUPPORTED_TASKS = {"word2vec": ("qa",)}
# (epochs, lr) when the user does not say: the head alone wants a larger step than a whole body.
MODE_DEFAULTS = {"frozen": (20, 3e-3), "features": (30, 1e-2), "finetune": (4, 1e-4)}
# From-scratch baselines whose architecture wants other settings than fine-tuning a pretrained body:
# a bag of word vectors starting at zero learns at an embedding-bag rate (fastText uses 0.1-1.0).
SCRATCH_DEFAULTS: dict[str, dict] = {"word2vec": {"lr": 1e-2, "epochs": 10}}
CACHE_FORMAT = 2  # bump when what the cache stores changes (2: QA windows, an owner per row group)


@dataclasses.dataclass
class TransferConfig:
    """The settings of one transfer run (saved as the run's ``config.json``).

    Attributes:
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        mode: ``frozen``, ``features`` or ``finetune``.
        epochs: passes over the training data (default by mode: 20 / 30 / 4).
        lr: peak learning rate of AdamW (default by mode: 3e-3 / 1e-2 / 1e-4).
        batch_size: examples per step (also per body pass when extracting features).
        max_len: most positions per input, special tokens included (longer inputs are cut).
        seed: seeds the head's init, dropout and the order of examples.
        classifier: ``linear`` (dropout + Linear), ``logreg``, ``mlp`` or ``bilstm``; default
            ``logreg`` in features mode, else ``linear``.
        freeze_layers: finetune only: keep embeddings and the lowest K layers fixed (None = none).
        layer_lr_decay: finetune only: multiply the learning rate by this per layer going down.
        pool: how a sentence is read: ``cls`` (BERT), ``last`` (GPT's extract token), ``mean``, or
            ``tokens`` (every token, for the ``bilstm`` head); default by family.
        layer_mix: mix all layers with a learned ScalarMix (default: on for ELMo); else the top layer.
        dropout: dropout of the head.
        head_hidden: hidden width of the ``mlp`` head, LSTM size per direction of the ``bilstm`` head.
        weight_decay: AdamW weight decay (L2 for the logistic regression).
        warmup: fraction of the steps with a linear warm-up; the rest decays linearly to zero.
        from_scratch: re-initialise the body from its config (finetune: the no-pretraining baseline).
        lm_weight: GPT finetune only: weight of GPT-1's auxiliary language-modelling loss on the task's
            own input sequences (``loss = task_loss + lm_weight * lm_loss``; the paper uses 0.5).
        max_answer_tokens: QA: the longest answer span considered.
        doc_stride: QA: a context longer than fits is read in windows starting this many tokens apart
            (default: half the room after the question, so windows overlap by half); 0 cuts it instead.
        both_orders: pair: read each pair in both orders and add the two read-outs (GPT-1's similarity
            tasks; BERT or GPT), so the prediction does not depend on which text comes first.
        cache_dir: where features mode caches vectors (default ``~/.cache/lmforge/features``).
    """

    task: str = "classify"
    mode: str = "finetune"
    epochs: int | None = None
    lr: float | None = None
    batch_size: int = 32
    max_len: int = 128
    seed: int = 0
    classifier: str | None = None
    freeze_layers: int | None = None
    layer_lr_decay: float | None = None
    pool: str | None = None
    layer_mix: bool | None = None
    dropout: float = 0.1
    head_hidden: int = 128
    weight_decay: float = 0.01
    warmup: float = 0.1
    from_scratch: bool = False
    lm_weight: float = 0.0
    max_answer_tokens: int = 30
    doc_stride: int | None = None
    both_orders: bool = False
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.classifier is not None and self.classifier not in CLASSIFIERS:
            raise ValueError(f"classifier must be one of {', '.join(CLASSIFIERS)}, got {self.classifier!r}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError("epochs must be >= 1")
        if self.lr is not None and not self.lr > 0:
            raise ValueError("lr must be > 0")
        if self.batch_size < 1 or self.max_len < 8:
            raise ValueError("batch_size must be >= 1 and max_len >= 8")
        if self.freeze_layers is not None and self.freeze_layers < 0:
            raise ValueError("freeze_layers must be >= 0")
        if self.layer_lr_decay is not None and not 0 < self.layer_lr_decay <= 1:
            raise ValueError("layer_lr_decay must be in (0, 1]")
        if not 0 <= self.warmup < 1:
            raise ValueError("warmup must be in [0, 1)")
        if self.max_answer_tokens < 1:
            raise ValueError("max_answer_tokens must be >= 1")
        if self.doc_stride is not None and self.doc_stride < 0:
            raise ValueError("doc_stride must be >= 0 (0 = no sliding window)")

    # resolved values
    @property
    def n_epochs(self) -> int:
        return self.epochs if self.epochs is not None else MODE_DEFAULTS[self.mode][0]

    @property
    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else MODE_DEFAULTS[self.mode][1]

    @property
    def head_classifier(self) -> str:
        return self.classifier or ("logreg" if self.mode == "features" else "linear")


def scratch_defaults(family: str) -> dict:
    """TransferConfig settings of the from-scratch baseline of ``family`` (user options override them)."""
    return dict(SCRATCH_DEFAULTS.get(family, {}))


def check_supported(family: str, cfg: TransferConfig) -> None:
    """Raise a one-line LmforgeError when ``family`` cannot run ``cfg``'s mode / task / options."""
    if family not in SUPPORTED:
        raise LmforgeError(f"unknown model family '{family}'; transfer supports {', '.join(SUPPORTED)}")
    if cfg.mode not in SUPPORTED[family] and not (cfg.mode == "finetune" and cfg.from_scratch):
        raise LmforgeError(
            f"{family} models support --mode {' / '.join(SUPPORTED[family])}, not {cfg.mode} "
            f"(see docs/transfer.md for which family supports which mode)"
        )
    if cfg.task in UNSUPPORTED_TASKS.get(family, ()):
        raise LmforgeError(f"{family} models cannot do --task {cfg.task}: static word vectors cannot locate a span")
    if cfg.from_scratch and cfg.mode != "finetune":
        raise LmforgeError("--from-scratch trains the whole randomly initialised body: use it with --mode finetune")
    if cfg.mode != "finetune" and (cfg.freeze_layers is not None or cfg.layer_lr_decay is not None):
        raise LmforgeError("--freeze-layers and --layer-lr-decay apply to --mode finetune only")
    if cfg.lm_weight < 0:
        raise LmforgeError(f"--lm-weight must be >= 0, got {cfg.lm_weight}")
    if cfg.lm_weight > 0 and (family != "gpt" or cfg.mode != "finetune"):
        raise LmforgeError("--lm-weight (the auxiliary LM loss) applies to GPT in --mode finetune only")
    if cfg.both_orders and cfg.task != "pair":
        raise LmforgeError(f"--both-orders reads a pair in both orders: it serves --task pair, not {cfg.task}")
    if cfg.head_classifier == "bilstm" and cfg.task == "qa":
        raise LmforgeError("the bilstm classifier serves classify / pair / tokens, not qa")
    if cfg.classifier in ("logreg", "mlp") and cfg.mode != "features":
        logger.info(
            "classifier %s in %s mode: the head is that classifier on top of the body", cfg.classifier, cfg.mode
        )


# -- the model: body + what to read + head -------------------------------------------------------------
class TransferModel(nn.Module):
    """A body (:class:`lmforge.models.base.TransferBody`) and a :class:`TaskHead`, joined by an :class:`InputFormat`.

    Args:
        body: the pretrained model (``hidden_states``, ``transfer_layers``, ``hidden_size``, ``tokenizer``).
        head: the task head.
        fmt: builds encodings and knows the pooling.
        layer_ids: which of ``body.hidden_states`` the head reads (lowest first).
    """

    def __init__(self, body: nn.Module, head: TaskHead, fmt: InputFormat, layer_ids: list[int]):
        super().__init__()
        self.body = body
        self.head = head
        self.fmt = fmt
        self.layer_ids = list(layer_ids)

    def blocks(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the body and cut out what the head reads.

        Returns:
            blocks (B, n, L, C) and their (B, n) row mask.  The body's top states (B, T, C) stay in
            ``self.last_top`` for an auxiliary loss.
        """
        states = self.body.hidden_states(
            batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
        )
        self.last_top = states[-1]
        h = torch.stack([states[i] for i in self.layer_ids], dim=2)  # (B, T, L, C)
        if "mean_segments" in batch:
            segs = batch["mean_segments"]  # (B, S) segment ids, -2 = none
            seg = batch["segment"]  # (B, T)
            pooled = []
            for s in range(segs.shape[1]):
                m = (seg == segs[:, s : s + 1]).to(h.dtype)  # (B, T)
                denom = m.sum(1).clamp_min(1.0)[:, None, None]  # (B, 1, 1)
                pooled.append((h * m[:, :, None, None]).sum(1) / denom)  # (B, L, C)
            return torch.stack(pooled, dim=1), batch["row_mask"]  # (B, S, L, C)
        rows = batch["rows"]  # (B, n)
        B, n = rows.shape
        L, C = h.shape[2], h.shape[3]
        idx = rows[:, :, None, None].expand(B, n, L, C)
        return h.gather(1, idx), batch["row_mask"]  # (B, n, L, C)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        blocks, mask = self.blocks(batch)
        return self.head(blocks, mask)


def collate(encs: Sequence[Encoding], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad encodings into body inputs plus the head's read-out indices.

    Returns:
        ``input_ids``, ``attention_mask``, ``token_type_ids``, ``segment`` (B, T); and either
        ``rows`` (B, n) or ``mean_segments`` (B, S); ``row_mask`` (B, n or S).
    """
    B = len(encs)
    T = max(1, max(len(e.input_ids) for e in encs))
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    types = torch.zeros(B, T, dtype=torch.long)
    seg = torch.full((B, T), -1, dtype=torch.long)
    for b, e in enumerate(encs):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        att[b, :n] = 1
        types[b, :n] = torch.tensor(e.token_type_ids, dtype=torch.long)
        seg[b, :n] = torch.tensor(e.segment, dtype=torch.long)
    out = {"input_ids": ids, "attention_mask": att, "token_type_ids": types, "segment": seg}
    if encs[0].mean_segments:
        S = max(len(e.mean_segments) for e in encs)
        ms = torch.full((B, S), -2, dtype=torch.long)
        rm = torch.zeros(B, S, dtype=torch.long)
        for b, e in enumerate(encs):
            ms[b, : len(e.mean_segments)] = torch.tensor(e.mean_segments)
            rm[b, : len(e.mean_segments)] = 1
        out["mean_segments"], out["row_mask"] = ms, rm
    else:
        n = max(1, max(len(e.rows) for e in encs))
        rows = torch.zeros(B, n, dtype=torch.long)
        rm = torch.zeros(B, n, dtype=torch.long)
        for b, e in enumerate(encs):
            rows[b, : len(e.rows)] = torch.tensor(e.rows, dtype=torch.long)
            rm[b, : len(e.rows)] = 1
        out["rows"], out["row_mask"] = rows, rm
    return out


# -- labels, loss and decoding per task -----------------------------------------------------------------
def _targets(task: str, examples: Sequence, encs: Sequence[Encoding], label_index: dict[str, int]):
    """Training targets for a batch: (B,) classes or (B, n) tags (-100 = none); QA: see :func:`_qa_targets`."""
    if task in ("classify", "pair"):
        return torch.tensor([label_index[ex.label] for ex in examples], dtype=torch.long)
    if task == "tokens":
        n = max(1, max(len(e.rows) for e in encs))
        y = torch.full((len(encs), n), -100, dtype=torch.long)
        for b, (ex, e) in enumerate(zip(examples, encs)):
            done = set()
            for w, r in enumerate(e.word_rows):
                if r >= 0 and r not in done:  # a token shared by two words is labelled by the first
                    y[b, r] = label_index[ex.tags[w]]
                    done.add(r)
        return y
    raise ValueError(f"no batch targets for task {task!r}")


def _qa_targets(examples: Sequence, encs: Sequence[Encoding], fmt) -> tuple[torch.Tensor, int]:
    """(W, 2) start/end positions for every window, and how many examples have their answer in none.

    A window holding the (first) answer points at it; the other windows of that example point at
    position 0 (BERT's ``[CLS]``: "not in this window"), so that scores compare across windows.
    An example whose answer no window holds wholly is skipped (-100) in all its windows.
    """
    y = torch.full((len(encs), 2), -100, dtype=torch.long)
    found: set[int] = set()
    for w, e in enumerate(encs):
        for text, start in examples[e.example].answers[:1]:
            span = fmt.qa_target(e, start, text)
            if span is not None:
                y[w, 0], y[w, 1] = span
                found.add(e.example)
    for w, e in enumerate(encs):
        if e.example in found and y[w, 0] < 0:
            y[w] = 0
    return y, len({e.example for e in encs} - found)


def _context_mask(encs: Sequence[Encoding], n: int) -> torch.Tensor:
    m = torch.zeros(len(encs), n, dtype=torch.bool)
    for b, e in enumerate(encs):
        for p, off in enumerate(e.offsets):
            if off is not None and p < n:
                m[b, p] = True
    return m


def _loss(task: str, logits: torch.Tensor, y: torch.Tensor, ctx: torch.Tensor | None) -> torch.Tensor:
    if task in SENTENCE_TASKS:  # choice: (B, N) scores of the choices, padded with -1e9
        return F.cross_entropy(logits, y)
    if task == "tokens":
        if bool((y == -100).all()):
            return logits.sum() * 0.0
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
    allowed = ctx.clone()
    allowed[:, 0] = True  # position 0: "the answer is not in this window"
    scores = logits.masked_fill(~allowed[..., None], -1e4)  # (B, n, 2)
    keep = y[:, 0] >= 0
    if not bool(keep.any()):
        return logits.sum() * 0.0
    return 0.5 * (F.cross_entropy(scores[keep, :, 0], y[keep, 0]) + F.cross_entropy(scores[keep, :, 1], y[keep, 1]))


def _best_span(
    start: torch.Tensor, end: torch.Tensor, ctx: torch.Tensor, max_len: int
) -> tuple[int, int, float] | None:
    """(start, end, score) of the highest start+end score over context spans of at most ``max_len`` tokens."""
    if not bool(ctx.any()):
        return None
    s = start.masked_fill(~ctx, -1e9)
    e = end.masked_fill(~ctx, -1e9)
    scores = s[:, None] + e[None, :]  # (n, n)
    n = scores.shape[0]
    i = torch.arange(n)
    ok = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_len)
    scores = scores.masked_fill(~ok, -1e18)
    flat = int(scores.argmax())
    return flat // n, flat % n, float(scores.flatten()[flat])


def _units(task: str, encs: Sequence[Encoding]) -> list[list[int]]:
    """The encodings that train together as one example: a choice question's choices; else each alone."""
    if task != "choice":
        return [[i] for i in range(len(encs))]
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(encs):
        groups.setdefault(e.example, []).append(i)
    return list(groups.values())


def _choice_scores(scores: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """(E,) scores of consecutive choices -> (B, max choices), padded with -1e9, one row per question."""
    out = scores.new_full((len(sizes), max(sizes)), -1e9)
    at = 0
    for b, n in enumerate(sizes):
        out[b, :n] = scores[at : at + n]
        at += n
    return out


def _with_twins(encs: Sequence[Encoding]) -> list[Encoding]:
    """``encs`` followed by their twins (pairs read in both orders), or ``encs`` when none has one."""
    twins = [e.twin for e in encs if e.twin is not None]
    if twins and len(twins) != len(encs):  # pragma: no cover - a pair task gives every example a twin
        raise ValueError("a batch mixes pairs read in both orders with single inputs")
    return [*encs, *twins]


# -- the run ----------------------------------------------------------------------------------------
class TransferRun:
    """One transfer setup: body, config, labels, input format and head.

    Build it with ``TransferRun(body, cfg, labels)`` (a new run; :meth:`fit` trains it) or
    :func:`load_run` (a finished run folder); :meth:`predict` / :meth:`evaluate` use it.
    """

    def __init__(self, body: nn.Module, cfg: TransferConfig, labels: list[str], model_dir: str | None = None):
        self.family = getattr(body, "model_type", None)
        check_supported(self.family, cfg)
        self.cfg = cfg
        self.labels = list(labels)
        self.label_index = {lab: i for i, lab in enumerate(self.labels)}
        self.model_dir = model_dir
        self.body = body
        pool = cfg.pool
        if cfg.head_classifier == "bilstm" and cfg.task in SENTENCE_TASKS:
            pool = "tokens"
        gpt = None
        if self.family == "gpt":
            gpt = _gpt_format(body)
        self.fmt = InputFormat(
            self.family,
            body.tokenizer,
            cfg.max_len,
            pool if cfg.task in SENTENCE_TASKS else None,
            gpt=gpt,
            doc_stride=cfg.doc_stride,
            both_orders=cfg.both_orders,
        )
        if self.fmt.pool == "tokens" and cfg.task in SENTENCE_TASKS and cfg.head_classifier != "bilstm":
            raise LmforgeError("--pool tokens feeds every token vector to a BiLSTM: use it with --classifier bilstm")
        self.layer_mix = cfg.layer_mix if cfg.layer_mix is not None else self.family == "elmo"
        self.num_states = None  # filled on the first body pass
        self.pair_rows = cfg.task in ("pair", "choice") and self.fmt.pool == "mean"
        self._weights_hash: str | None = None
        self.model: TransferModel | None = None

    # -- construction ---------------------------------------------------------------------------
    def _layer_ids(self) -> list[int]:
        if self.num_states is None:
            with torch.no_grad():
                enc = self.fmt.encode_text("a")
                batch = collate([enc], self.fmt.pad_id)
                was = self.body.training
                self.body.eval()
                self.num_states = len(
                    self.body.hidden_states(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
                )
                self.body.train(was)
        return list(range(self.num_states)) if self.layer_mix else [self.num_states - 1]

    def build(self) -> TransferModel:
        """Create the head (seeded) and join it to the body."""
        ids = self._layer_ids()
        torch.manual_seed(self.cfg.seed)
        head = TaskHead(
            self.cfg.task,
            int(self.body.hidden_size),
            len(ids),
            1 if self.cfg.task == "choice" else len(self.labels),
            classifier=self.cfg.head_classifier,
            layer_mix=self.layer_mix,
            pair_rows=self.pair_rows,
            dropout=self.cfg.dropout,
            mlp_hidden=self.cfg.head_hidden,
        )
        self.model = TransferModel(self.body, head, self.fmt, ids)
        return self.model

    def encode(self, data: TaskData) -> list[Encoding]:
        """The body inputs of ``data``: one encoding per example, in order (QA: one per window; choice:
        one per choice, each read as the pair ``(context, choice)``).

        Each encoding's ``example`` is the index of its example in ``data``.
        """
        fmt = self.fmt
        out = []
        for i, ex in enumerate(data.examples):
            if isinstance(ex, TextExample):
                encs = [fmt.encode_text(ex.text, ex.text_pair)]
            elif isinstance(ex, TokensExample):
                encs = [fmt.encode_words(ex.words)]
            elif isinstance(ex, QAExample):
                encs = fmt.encode_qa(ex.question, ex.context)
            elif isinstance(ex, ChoiceExample):
                encs = [fmt.encode_text(ex.context, choice) for choice in ex.choices]
            else:  # pragma: no cover - TaskData holds one of the four
                raise TypeError(type(ex))
            for e in encs:
                e.example = i
            out.extend(encs)
        return out

    # -- body passes --------------------------------------------------------------------------------
    def _body_blocks(self, encs: Sequence[Encoding]) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's input for ``encs``; pairs read in both orders get their twin's read-out added."""
        seqs = _with_twins(encs)
        blocks, mask = self.model.blocks(collate(seqs, self.fmt.pad_id))
        if len(seqs) > len(encs):
            B = len(encs)
            return blocks[:B] + blocks[B:], mask[:B]
        return blocks, mask

    @torch.no_grad()
    def extract(self, encs: list[Encoding]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the (eval-mode) body over all encodings once.

        Returns:
            vectors (R, L, C): every example's rows one after another; lengths (N,) rows per example.
        """
        self.body.eval()
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].input_ids))  # similar lengths batch well
        per: list[torch.Tensor | None] = [None] * len(encs)
        bs = self.cfg.batch_size
        for k in range(0, len(order), bs):
            chunk = order[k : k + bs]
            blocks, mask = self._body_blocks([encs[i] for i in chunk])
            for j, i in enumerate(chunk):
                per[i] = blocks[j, : int(mask[j].sum())].float().clone()  # (n_i, L, C)
        lengths = torch.tensor([p.shape[0] for p in per], dtype=torch.long)
        L, C = len(self.model.layer_ids), int(self.body.hidden_size)
        vectors = torch.cat(per) if per else torch.zeros(0, L, C)
        return vectors, lengths

    def weights_hash(self) -> str:
        """sha256 of the body's weights file (or of its tensors when it was not loaded from a folder)."""
        if self._weights_hash is None:
            f = Path(self.model_dir) / "model.safetensors" if self.model_dir else None
            if f is not None and f.is_file():
                self._weights_hash = file_sha256(f)
            else:
                h = hashlib.sha256()
                for k, v in sorted(self.body.state_dict().items()):
                    h.update(k.encode())
                    h.update(v.detach().cpu().contiguous().numpy().tobytes())
                self._weights_hash = h.hexdigest()
        return self._weights_hash

    def cache_key(self, data: TaskData) -> str:
        settings = {
            "format": CACHE_FORMAT,
            "family": self.family,
            "task": self.cfg.task,
            "max_len": self.cfg.max_len,
            "pool": self.fmt.pool,
            "layers": self.model.layer_ids,
            "doc_stride": self.cfg.doc_stride,
            "both_orders": self.cfg.both_orders,
            "tokenizer": getattr(self.body.tokenizer, "hash", None),
        }
        h = hashlib.sha256()
        h.update(self.weights_hash().encode())
        h.update(data.content_hash().encode())
        h.update(json.dumps(settings, sort_keys=True).encode())
        return h.hexdigest()[:32]

    def cached_features(self, data: TaskData, encs: list[Encoding]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(vectors, lengths, owners)`` of ``data``'s encodings (see :class:`_RowStore`) from the cache,
        or from one body pass that is then cached."""
        cache_dir = Path(self.cfg.cache_dir) if self.cfg.cache_dir else Path.home() / ".cache" / "lmforge" / "features"
        path = cache_dir / f"{self.cache_key(data)}.safetensors"
        if path.is_file():
            try:
                t = load_safetensors(path)
                owners = torch.tensor([e.example for e in encs], dtype=torch.long)
                if "owners" in t and torch.equal(t["owners"], owners):
                    logger.info("features: reusing cached vectors %s (%d inputs)", path, len(encs))
                    return t["vectors"], t["lengths"], t["owners"]
            except CheckpointError:
                pass
            logger.warning("features: cache file %s is unreadable; recomputing it", path)
        t0 = time.time()
        vectors, lengths = self.extract(encs)
        owners = torch.tensor([e.example for e in encs], dtype=torch.long)
        meta = {"source": str(data.source), "examples": str(len(data)), "family": str(self.family)}
        save_safetensors({"vectors": vectors, "lengths": lengths, "owners": owners}, path, metadata=meta)
        logger.info("features: ran the body over %d examples in %.1fs; cached to %s", len(encs), time.time() - t0, path)
        return vectors, lengths, owners

    # -- training -------------------------------------------------------------------------------------
    def _param_groups(self) -> list[dict]:
        cfg = self.cfg
        lr = cfg.peak_lr
        head_params = [p for p in self.model.head.parameters() if p.requires_grad]
        groups = [{"params": head_params, "lr": lr, "name": "head"}]
        if cfg.mode != "finetune":
            return groups
        parts = list(self.body.transfer_layers())
        seen: set[int] = set()
        decay = cfg.layer_lr_decay or 1.0
        n = len(parts)
        for i, part in enumerate(parts):
            ps = [p for p in part.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in part.parameters())
            if ps:
                groups.append({"params": ps, "lr": lr * decay ** (n - 1 - i), "name": f"body.{i}"})
        rest = [p for p in self.body.parameters() if p.requires_grad and id(p) not in seen]
        if rest:  # e.g. an LM output layer: not part of the body's layer list, trains at the top rate
            groups.append({"params": rest, "lr": lr, "name": "body.rest"})
        return groups

    def _freeze(self) -> None:
        cfg = self.cfg
        if cfg.mode in ("frozen", "features"):
            for p in self.body.parameters():
                p.requires_grad_(False)
            return
        for p in self.body.parameters():
            p.requires_grad_(True)
        if cfg.freeze_layers is not None:
            parts = list(self.body.transfer_layers())
            if cfg.freeze_layers >= len(parts) - 1:
                raise LmforgeError(
                    f"--freeze-layers {cfg.freeze_layers} is too large: this {self.family} body has the embeddings "
                    f"and {len(parts) - 1} layers, so K can be 0..{len(parts) - 2}"
                )
            for part in parts[: cfg.freeze_layers + 1]:
                for p in part.parameters():
                    p.requires_grad_(False)

    def fit(
        self, train: TaskData, progress: Callable[[str], None] | None = None, store: _RowStore | None = None
    ) -> dict:
        """Train on ``train``; returns a small dict of training facts (loss, steps, seconds).

        Args:
            train: the labelled examples.
            progress: called with one line per epoch.
            store: features mode: the vectors of ``train`` already at hand (the learning curve's subsets).
        """
        cfg = self.cfg
        seed_everything(cfg.seed)
        if cfg.from_scratch:
            _reinit(self.body, cfg.seed)
        if self.model is None:
            self.build()
        self._freeze()
        encs = self.encode(train)
        examples = [train.examples[e.example] for e in encs]  # one per encoding (QA: per window)
        t0 = time.time()
        features = None
        if cfg.mode == "features":
            features = store if store is not None else _RowStore(*self.cached_features(train, encs))
            mean, std = features.stats()
            self.model.head.set_standardization(mean, std)
        qa_y = None
        if cfg.task == "qa":
            qa_y, n_lost = _qa_targets(train.examples, encs, self.fmt)
            if len(encs) > len(train):
                logger.info("qa: %d questions read as %d context windows", len(train), len(encs))
            if n_lost == len(train):
                raise DataError(
                    f"qa: none of the {len(train)} training answers lies inside an input of --max-len "
                    f"{cfg.max_len}; raise --max-len or leave --doc-stride unset (a sliding window)"
                )
            if n_lost:
                logger.warning(
                    "qa: %d of %d training answers lie in no window (cut at --max-len %d, or wider than a "
                    "window) and are skipped",
                    n_lost,
                    len(train),
                    cfg.max_len,
                )
        groups = self._param_groups()
        opt = torch.optim.AdamW(groups, lr=cfg.peak_lr, weight_decay=cfg.weight_decay)
        for g in opt.param_groups:
            g["initial_lr"] = g["lr"]
        units = _units(cfg.task, encs)  # what one training example is: its encodings (a choice question: all)
        steps_per_epoch = math.ceil(len(units) / cfg.batch_size)
        total = steps_per_epoch * cfg.n_epochs
        warm = int(cfg.warmup * total)
        rng = np.random.default_rng(cfg.seed)
        step = 0
        losses: list[float] = []
        for epoch in range(cfg.n_epochs):
            self.model.head.train()
            if cfg.mode == "finetune":
                self.body.train()
            else:
                self.body.eval()
            order = rng.permutation(len(units))
            ep_loss, ep_n = 0.0, 0
            for k in range(0, len(order), cfg.batch_size):
                b_units = [units[u] for u in order[k : k + cfg.batch_size].tolist()]
                idx = [i for u in b_units for i in u]
                b_encs = [encs[i] for i in idx]
                b_ex = [examples[i] for i in idx]
                if qa_y is not None:
                    y = qa_y[idx]
                elif cfg.task == "choice":
                    y = torch.tensor([examples[u[0]].label for u in b_units], dtype=torch.long)
                else:
                    y = _targets(cfg.task, b_ex, b_encs, self.label_index)
                if features is not None:
                    blocks, mask = features.batch(idx)
                elif cfg.mode == "frozen":
                    with torch.no_grad():
                        blocks, mask = self._body_blocks(b_encs)
                else:
                    blocks, mask = self._body_blocks(b_encs)
                logits = self.model.head(blocks, mask)
                if cfg.task == "choice":
                    logits = _choice_scores(logits[:, 0], [len(u) for u in b_units])
                ctx = _context_mask(b_encs, logits.shape[1]) if cfg.task == "qa" else None
                loss = _loss(cfg.task, logits, y, ctx)
                if cfg.lm_weight > 0:
                    loss = loss + cfg.lm_weight * self._lm_loss(b_encs)
                frac = (step + 1) / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
                for g in opt.param_groups:
                    g["lr"] = g["initial_lr"] * frac
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
                opt.step()
                step += 1
                ep_loss += float(loss.detach()) * len(b_units)
                ep_n += len(b_units)
            losses.append(ep_loss / max(1, ep_n))
            msg = f"epoch {epoch + 1}/{cfg.n_epochs}: train loss {losses[-1]:.4f}"
            logger.info(msg)
            if progress is not None:
                progress(msg)
        self.model.eval()
        return {
            "train_loss": losses[-1] if losses else None,
            "train_losses": losses,
            "steps": step,
            "train_seconds": round(time.time() - t0, 2),
        }

    def _lm_loss(self, encs: Sequence[Encoding]) -> torch.Tensor:
        """GPT-1's auxiliary LM loss: next-token prediction over the batch's own input sequences."""
        from ..models.gpt import linear_cross_entropy, shift_labels

        top = self.model.last_top  # (B, T, C) of the batch just run (twins included)
        ids = collate(_with_twins(encs), self.fmt.pad_id)
        labels = ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100)
        targets = shift_labels(labels).reshape(-1)  # (B*T,)
        return linear_cross_entropy(top.reshape(-1, top.shape[-1]), self.body.lm_head.weight, targets)

    # -- inference -------------------------------------------------------------------------------------
    @torch.no_grad()
    def _logits(
        self, data: TaskData, encs: list[Encoding], use_cache: bool = True, store: _RowStore | None = None
    ) -> list[torch.Tensor]:
        """Per encoding: (K,) class scores, (n, K) tag scores or (n, 2) span scores."""
        self.model.eval()
        if self.cfg.mode == "features":
            if store is None:
                store = _RowStore(*(self.cached_features(data, encs) if use_cache else self.extract(encs)))
            get = store.batch
        else:
            get = None
        out: list[torch.Tensor | None] = [None] * len(encs)
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].input_ids))
        for k in range(0, len(order), self.cfg.batch_size):
            idx = order[k : k + self.cfg.batch_size]
            blocks, mask = get(idx) if get else self._body_blocks([encs[i] for i in idx])
            logits = self.model.head(blocks, mask).float()
            for j, i in enumerate(idx):
                if self.cfg.task in SENTENCE_TASKS:
                    out[i] = logits[j]
                else:
                    out[i] = logits[j, : int(mask[j].sum())]
        return out

    def predict(self, data: TaskData, use_cache: bool = True, store: _RowStore | None = None) -> list[dict]:
        """Predictions for each example of ``data`` (labels may be absent).

        Args:
            data: the examples.
            use_cache: features mode: read/write the vector cache (off for one-off texts).
            store: features mode: the vectors of ``data`` already at hand.

        Returns:
            classify/pair: ``{"label", "probs"}``; tokens: ``{"words", "tags"}``; qa: ``{"id", "answer"}``;
            choice: ``{"label": index of the chosen choice, "probs": [one per choice]}``.
        """
        encs = self.encode(data)
        logits = self._logits(data, encs, use_cache, store)
        if self.cfg.task == "qa":
            return self._qa_answers(data, encs, logits)
        if self.cfg.task == "choice":
            scores: list[list[float]] = [[] for _ in data.examples]
            for e, lg in zip(encs, logits):
                scores[e.example].append(float(lg[0]))
            preds = []
            for sc in scores:
                probs = torch.softmax(torch.tensor(sc, dtype=torch.float64), -1)
                preds.append({"label": int(probs.argmax()), "probs": [round(float(q), 5) for q in probs]})
            return preds
        preds = []
        for ex, e, lg in zip(data.examples, encs, logits):
            if self.cfg.task in ("classify", "pair"):
                probs = torch.softmax(lg, -1)
                preds.append(
                    {
                        "label": self.labels[int(probs.argmax())],
                        "probs": {lab: round(float(p), 5) for lab, p in zip(self.labels, probs)},
                    }
                )
            elif self.cfg.task == "tokens":
                row_tags = [self.labels[int(i)] for i in lg.argmax(-1)] if lg.numel() else []
                tags = [row_tags[r] if 0 <= r < len(row_tags) else "O" for r in e.word_rows]
                preds.append({"words": ex.words, "tags": tags})
        return preds

    def _qa_answers(self, data: TaskData, encs: list[Encoding], logits: list[torch.Tensor]) -> list[dict]:
        """Each question's answer: the best-scoring span over all of its windows."""
        best: list[tuple[float, str] | None] = [None] * len(data)
        for e, lg in zip(encs, logits):
            span = _best_span(lg[:, 0], lg[:, 1], _context_mask([e], lg.shape[0])[0], self.cfg.max_answer_tokens)
            if span is None:
                continue
            s, t, score = span
            if best[e.example] is None or score > best[e.example][0]:
                best[e.example] = (score, data.examples[e.example].context[e.offsets[s][0] : e.offsets[t][1]])
        return [{"id": ex.id, "answer": b[1] if b else ""} for ex, b in zip(data.examples, best)]

    def evaluate(self, data: TaskData, store: _RowStore | None = None) -> tuple[dict[str, float], list[dict]]:
        """Task metrics on labelled ``data`` and the prediction records (gold included)."""
        preds = self.predict(data, store=store)
        records = []
        if self.cfg.task in ("classify", "pair"):
            gold = [ex.label for ex in data.examples]
            metrics = M.classification_metrics(gold, [p["label"] for p in preds])
            for ex, p in zip(data.examples, preds):
                rec = {"text": ex.text}
                if ex.text_pair is not None:
                    rec["text_pair"] = ex.text_pair
                records.append({**rec, "label": ex.label, "pred": p["label"], "probs": p["probs"]})
        elif self.cfg.task == "choice":
            metrics = {"accuracy": M.accuracy([ex.label for ex in data.examples], [p["label"] for p in preds])}
            records = [
                {
                    "context": ex.context,
                    "choices": ex.choices,
                    "label": ex.label,
                    "pred": p["label"],
                    "probs": p["probs"],
                }
                for ex, p in zip(data.examples, preds)
            ]
        elif self.cfg.task == "tokens":
            gold_tags, pred_tags = [ex.tags for ex in data.examples], [p["tags"] for p in preds]
            if is_bio(self.labels):
                metrics = M.entity_metrics(gold_tags, pred_tags)
            else:  # plain tagging (POS): no entities to match
                flat_g = [t for ts in gold_tags for t in ts]
                flat_p = [t for ts in pred_tags for t in ts]
                metrics = {"token_accuracy": M.accuracy(flat_g, flat_p), "macro_f1": M.macro_f1(flat_g, flat_p)}
            records = [{"words": ex.words, "tags": ex.tags, "pred": p["tags"]} for ex, p in zip(data.examples, preds)]
        else:
            metrics = M.qa_metrics([p["answer"] for p in preds], [[t for t, _ in ex.answers] for ex in data.examples])
            records = [
                {"id": ex.id, "question": ex.question, "answers": [t for t, _ in ex.answers], "pred": p["answer"]}
                for ex, p in zip(data.examples, preds)
            ]
        return metrics, records

    # -- saving ----------------------------------------------------------------------------------------
    def save(self, out_dir: str | Path, metrics: dict, records: list[dict]) -> Path:
        """Write config.json, metrics.json, predictions.jsonl, head.safetensors (+ body.safetensors)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_safetensors(self.model.head.state_dict(), out / "head.safetensors")
        if self.cfg.mode == "finetune":
            body = self.body
            tied = set(body.tied_weight_keys()) if hasattr(body, "tied_weight_keys") else set()
            save_safetensors({k: v for k, v in body.state_dict().items() if k not in tied}, out / "body.safetensors")
        extra = {
            "model_dir": str(Path(self.model_dir).resolve()) if self.model_dir else None,
            "family": self.family,
            "labels": self.labels,
            "layer_ids": self.model.layer_ids,
            "num_states": self.num_states,
            "layer_mix": self.layer_mix,
            "pool": self.fmt.pool,
            "weights_sha256": self.weights_hash() if self.model_dir else None,
        }
        save_json({"transfer": to_dict(self.cfg), **extra}, out / "config.json")
        atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")
        atomic_write_text(out / "predictions.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        return out


class _RowStore:
    """Cached vectors (R, L, C) of N encodings, served as padded (B, n, L, C) batches.

    Args:
        vectors: every encoding's rows one after another.
        lengths: (N,) rows per encoding.
        owners: (N,) the example each encoding belongs to (QA windows share one; default: its own).
    """

    def __init__(self, vectors: torch.Tensor, lengths: torch.Tensor, owners: torch.Tensor | None = None):
        self.vectors = vectors.float()
        self.lengths = lengths.long()
        self.owners = torch.arange(len(self.lengths)) if owners is None else owners.long()
        self.starts = torch.cat([torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)])

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per (layer, channel) mean and std over all rows: (L, C) each."""
        if self.vectors.shape[0] == 0:
            L, C = self.vectors.shape[1:]
            return torch.zeros(L, C), torch.ones(L, C)
        return self.vectors.mean(0), self.vectors.std(0, unbiased=False)

    def subset(self, idx: Sequence[int]) -> _RowStore:
        """The store of the examples at ``idx`` (in that order; each with all of its encodings)."""
        by_owner: dict[int, list[int]] = {}
        for w, o in enumerate(self.owners.tolist()):
            by_owner.setdefault(o, []).append(w)
        windows, owners = [], []
        for k, i in enumerate(idx):
            windows += by_owner.get(int(i), [])
            owners += [k] * len(by_owner.get(int(i), []))
        parts = [self.vectors[int(self.starts[w]) : int(self.starts[w + 1])] for w in windows]
        L, C = self.vectors.shape[1:]
        vectors = torch.cat(parts) if parts else torch.zeros(0, L, C)
        return _RowStore(vectors, self.lengths[windows], torch.tensor(owners, dtype=torch.long))

    def batch(self, idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        n = max(1, max(int(self.lengths[i]) for i in idx))
        L, C = self.vectors.shape[1:]
        blocks = torch.zeros(len(idx), n, L, C)
        mask = torch.zeros(len(idx), n, dtype=torch.long)
        for b, i in enumerate(idx):
            s, ln = int(self.starts[i]), int(self.lengths[i])
            blocks[b, :ln] = self.vectors[s : s + ln]
            mask[b, :ln] = 1
        return blocks, mask


def _reinit(body: nn.Module, seed: int) -> None:
    """Replace the body's weights with a fresh random init of the same config (no pretraining)."""
    torch.manual_seed(seed)
    fresh = dict(type(body)(body.config).named_parameters())
    with torch.no_grad():  # parameters only: buffers (e.g. ELMo's spelled vocabulary) stay as they are
        for name, p in body.named_parameters():
            p.copy_(fresh[name])
    logger.info(
        "from scratch: the %s body was re-initialised at random (seed %d)", getattr(body, "model_type", "?"), seed
    )


def _gpt_format(body):
    """GPT-1's input transformations from ``lmforge.transfer.gpt_inputs`` (the GPT family's module)."""
    try:
        from . import gpt_inputs
    except ImportError:
        raise LmforgeError("GPT transfer needs lmforge/transfer/gpt_inputs.py, which this installation lacks") from None
    return gpt_inputs.transfer_format(body)


# -- public entry points ------------------------------------------------------------------------------
def _as_data(d: TaskData | str | Path, task: str, labelled: bool = True) -> TaskData:
    return d if isinstance(d, TaskData) else load_task(d, task, labelled)


def _load_body(model: nn.Module | str | Path) -> tuple[nn.Module, str | None]:
    if isinstance(model, nn.Module):
        return model, None
    from .. import load

    return load(model), str(model)


def run_transfer(
    model: nn.Module | str | Path,
    task: str,
    train: TaskData | str | Path,
    test: TaskData | str | Path,
    mode: str = "finetune",
    out_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    **options,
) -> dict:
    """Carry a pretrained body over to a labelled task and measure it.

    Args:
        model: a model folder (any family) or a loaded body (a ``TransferBody``) with ``.tokenizer``.
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        train, test: data files (see :mod:`lmforge.transfer.tasks`) or loaded :class:`TaskData`.
        mode: ``frozen``, ``features`` or ``finetune``.
        out_dir: when given, the run folder (metrics.json, predictions.jsonl, config.json, weights).
        progress: called with a line per epoch.
        **options: any other :class:`TransferConfig` field (epochs, lr, freeze_layers, ...).
    Returns:
        The metrics dict (also written to ``out_dir/metrics.json``): the task's metrics on ``test``
        plus ``mode``, ``family``, ``n_train``, ``n_test``, ``train_loss``, ``train_seconds`` and,
        with a ScalarMix, ``layer_weights`` and ``gamma``.
    """
    try:
        cfg = TransferConfig(task=task, mode=mode, **options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid transfer settings: {e}") from None
    body, model_dir = _load_body(model)
    check_supported(getattr(body, "model_type", None), cfg)
    train_d = _as_data(train, task)
    test_d = _as_data(test, task)
    check_labels(train_d, test_d)
    run = TransferRun(body, cfg, train_d.labels, model_dir)
    facts = run.fit(train_d, progress)
    metrics, records = run.evaluate(test_d)
    result = {
        **{k: round(v, 6) for k, v in metrics.items()},
        "task": task,
        "mode": mode,
        "family": run.family,
        "from_scratch": cfg.from_scratch,
        "n_train": len(train_d),
        "n_test": len(test_d),
        "epochs": cfg.n_epochs,
        "lr": cfg.peak_lr,
        "train_loss": facts["train_loss"],
        "train_seconds": facts["train_seconds"],
    }
    if run.model.head.scalar_mix is not None:
        result["layer_weights"] = [round(w, 4) for w in run.model.head.layer_weights()]
        result["gamma"] = round(run.model.head.gamma(), 4)
    if cfg.freeze_layers is not None:
        result["freeze_layers"] = cfg.freeze_layers
    if out_dir is not None:
        run.save(out_dir, result, records)
    return result


def load_run(run_dir: str | Path) -> TransferRun:
    """Open a finished run folder for prediction: body (+ fine-tuned weights) and trained head."""
    p = Path(run_dir)
    if not (p / "config.json").is_file() or not (p / "head.safetensors").is_file():
        raise CheckpointError(
            f"{p} is not a transfer run folder (needs config.json and head.safetensors from finetune)"
        )
    data = load_json(p / "config.json")
    if "transfer" not in data:
        raise CheckpointError(f"{p / 'config.json'} is not a transfer run config")
    cfg = from_dict(TransferConfig, data["transfer"])
    model_dir = data.get("model_dir")
    if not model_dir or not Path(model_dir).is_dir():
        raise CheckpointError(f"the run's model folder {model_dir} is gone; the run needs it to predict")
    from .. import load

    body = load(model_dir)
    if cfg.mode != "finetune" and data.get("weights_sha256"):
        if file_sha256(Path(model_dir) / "model.safetensors") != data["weights_sha256"]:
            raise CheckpointError(f"{model_dir} changed since this run was trained; retrain the run on this model")
    run = TransferRun(body, cfg, data["labels"], model_dir)  # (GPT: adds its task tokens to the body first)
    if cfg.mode == "finetune":
        body.load_weights(load_safetensors(p / "body.safetensors"))
    run.num_states = data.get("num_states")
    run.build()
    head_state = load_safetensors(p / "head.safetensors")
    try:
        run.model.head.load_state_dict(head_state)
    except RuntimeError as e:
        raise CheckpointError(f"{p / 'head.safetensors'} does not fit the run's config ({str(e)[:120]})") from None
    run.model.eval()
    return run
