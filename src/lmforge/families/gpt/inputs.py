"""GPT-1's input transformations for fine-tuning (Radford et al. 2018, section 3.3 and figure 1).

A task's structured input is turned into token sequences the pretrained GPT can read, framed by three
new special tokens that get fresh embedding rows (nothing else in the vocabulary moves):

- classification: ``start text extract``
- entailment:     ``start premise delim hypothesis extract``
- similarity:     ``start a delim b extract`` and ``start b delim a extract``; the two top states at the
  extract tokens are added before the head (the pair has no natural order)
- multiple choice: ``start context delim choice_i extract`` for each choice; the head gives one score per
  sequence and a softmax over the choices picks the answer

A linear head reads the top state at the ``extract`` token.  Training adds GPT-1's auxiliary language
modelling loss on the same sequences: ``loss = task_loss + lm_weight * lm_loss`` (λ = 0.5 in the paper;
0 switches it off).

Two ways in: :class:`GPTForTask` is the self-contained model (``encode_examples`` then ``forward``);
:func:`transfer_format` gives ``lmforge.transfer``'s generic input builder the same token framing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import LmforgeError
from ...models.base import ModelOutput
from .model import GPTLMHeadModel, linear_cross_entropy, shift_labels

logger = logging.getLogger(__name__)

TASKS = ("classification", "entailment", "similarity", "multiple_choice")
TASK_TOKENS = ("<|start|>", "<|delim|>", "<|extract|>")
_NEW_ROWS_SEED = 1234  # fixed, so a frozen body gets the same new rows at training and at prediction


def add_task_tokens(model: GPTLMHeadModel) -> tuple[int, int, int]:
    """Give ``model`` the start, delim and extract tokens as three new embedding rows (idempotent).

    The vocabulary grows from V to V + 3: ids V, V+1, V+2 are start, delim, extract; rows 0..V-1 and
    the tokenizer are untouched.  The new rows are drawn from N(0, initializer_range) with a fixed seed,
    so adding them twice to the same pretrained model gives the same rows.  A model whose vocabulary is
    already its tokenizer's + 3 (a fine-tuned body saved and reloaded) is taken to have them.

    Returns:
        ``(start_id, delim_id, extract_id)``.
    """
    ids = getattr(model, "task_token_ids", None)
    if ids is not None:
        return ids
    V = model.config.vocab_size
    tok = model.tokenizer
    if tok is not None and V == tok.vocab_size + 3:
        ids = (V - 3, V - 2, V - 1)
    else:
        model.resize_token_embeddings(V + 3)
        g = torch.Generator().manual_seed(_NEW_ROWS_SEED)
        rows = torch.randn(3, model.config.n_embd, generator=g) * model.config.initializer_range
        with torch.no_grad():
            model.wte.weight[V:] = rows.to(model.wte.weight)
        ids = (V, V + 1, V + 2)
        logger.info("added task tokens %s as ids %s", ", ".join(TASK_TOKENS), ids)
    model.task_token_ids = ids
    return ids


@dataclasses.dataclass
class GPTInputFormat:
    """The token framing: ``start a [delim b] extract``.  ``build`` is what ``lmforge.transfer`` calls."""

    start_id: int
    delim_id: int
    extract_id: int

    def build(self, a: Sequence[int], b: Sequence[int] | None = None) -> tuple[list[int], list[int], list[int]]:
        """Frame one text (``start a extract``) or a pair (``start a delim b extract``).

        Returns:
            ``(ids, a_positions, b_positions)``; the extract token is the last id.
        """
        ids = [self.start_id, *a]
        a_pos = list(range(1, 1 + len(a)))
        b_pos: list[int] = []
        if b is not None:
            ids.append(self.delim_id)
            b_pos = list(range(len(ids), len(ids) + len(b)))
            ids.extend(b)
        ids.append(self.extract_id)
        return ids, a_pos, b_pos


def transfer_format(body: GPTLMHeadModel) -> GPTInputFormat:
    """Add the task tokens to ``body`` (idempotent) and return the framing for ``lmforge.transfer``."""
    return GPTInputFormat(*add_task_tokens(body))


def _fit(a: list[int], b: list[int] | None, room: int) -> tuple[list[int], list[int] | None]:
    """Cut the longer of ``a`` / ``b`` first (from its end) until ``len(a) + len(b) <= room``."""
    if b is None:
        return a[: max(room, 0)], None
    la, lb = len(a), len(b)
    while la + lb > room and la + lb > 0:
        if la >= lb:
            la -= 1
        else:
            lb -= 1
    return a[:la], b[:lb]


def _pad(seqs: list[list[list[int]]], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` (B, S, T): the sequences of each example right-padded with the tokenizer's ``eot_id``
    (else its ``pad_id``, else 0)."""
    S, T = len(seqs[0]), max(len(x) for s in seqs for x in s)
    pad = getattr(tokenizer, "eot_id", None)
    pad = pad if pad is not None else (getattr(tokenizer, "pad_id", None) or 0)
    ids = torch.full((len(seqs), S, T), pad, dtype=torch.long)  # (B, S, T)
    mask = torch.zeros(len(seqs), S, T, dtype=torch.long)
    for i, s in enumerate(seqs):
        for j, x in enumerate(s):
            ids[i, j, : len(x)] = torch.tensor(x)
            mask[i, j, : len(x)] = 1
    return ids, mask


class GPTForTask(nn.Module):
    """A pretrained GPT fine-tuned on a task the GPT-1 way.

    Args:
        gpt: the pretrained :class:`GPTLMHeadModel` (its embedding grows by the three task tokens, in place).
        task: ``classification``, ``entailment``, ``similarity`` or ``multiple_choice``.
        num_labels: classes (1 = regression with a mean squared error, for classification / similarity);
            ignored for multiple choice, whose head gives one score per choice.
        lm_weight: λ of the auxiliary LM loss (0 = off).
        dropout: dropout on the extract state before the head (GPT-1: 0.1).
    """

    def __init__(
        self, gpt: GPTLMHeadModel, task: str, num_labels: int = 2, lm_weight: float = 0.5, dropout: float = 0.1
    ):
        super().__init__()
        if task not in TASKS:
            raise LmforgeError(f"unknown GPT task '{task}'; choose one of {', '.join(TASKS)}")
        if task != "multiple_choice" and num_labels < 1:
            raise LmforgeError(f"num_labels must be >= 1, got {num_labels}")
        if task == "entailment" and num_labels == 1:
            raise LmforgeError("entailment is a classification; give num_labels >= 2")
        if lm_weight < 0:
            raise LmforgeError(f"lm_weight must be >= 0, got {lm_weight}")
        self.gpt = gpt
        self.task = task
        self.num_labels = 1 if task == "multiple_choice" else num_labels
        self.lm_weight = lm_weight
        self.format = transfer_format(gpt)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(gpt.hidden_size, self.num_labels)
        nn.init.normal_(self.head.weight, std=gpt.config.initializer_range)
        nn.init.zeros_(self.head.bias)

    @property
    def regression(self) -> bool:
        return self.task in ("classification", "similarity") and self.num_labels == 1

    # -- inputs --------------------------------------------------------------------------------------
    def encode_examples(self, tokenizer, examples: Sequence, max_len: int | None = None) -> dict[str, torch.Tensor]:
        """Turn raw examples into the model's inputs (right-padded).

        Args:
            tokenizer: the GPT's tokenizer (``encode``; ``eot_id`` pads).
            examples: per task: classification ``"text"`` (or ``("text",)``); entailment ``(premise,
                hypothesis)``; similarity ``(a, b)``; multiple choice ``(context, [choice, ...])`` with the
                same number of choices in every example.
            max_len: the most tokens per sequence, specials included (default: the model's n_positions);
                longer texts are cut (pairs: the longer side first; multiple choice: the context keeps its end).
        Returns:
            ``{"input_ids", "attention_mask"}``: (B, T) for classification / entailment, (B, 2, T) for
            similarity, (B, N, T) for N choices.  The extract token is the last real token of each sequence.
        """
        n_pos = self.gpt.config.n_positions
        max_len = min(max_len or n_pos, n_pos)
        if max_len < 4:
            raise LmforgeError(f"max_len {max_len} leaves no room for text between the task tokens")
        if not examples:
            raise LmforgeError("no examples to encode")
        seqs = [self._sequences(tokenizer.encode, ex, max_len) for ex in examples]  # per example, its sequences
        n_seq = {len(s) for s in seqs}
        if len(n_seq) != 1:
            raise LmforgeError(f"every multiple-choice example needs the same number of choices, got {sorted(n_seq)}")
        ids, mask = _pad(seqs, tokenizer)  # (B, S, T)
        if self.task in ("classification", "entailment"):
            ids, mask = ids[:, 0], mask[:, 0]  # (B, T)
        return {"input_ids": ids, "attention_mask": mask}

    def _sequences(self, enc, ex, max_len: int) -> list[list[int]]:
        """The framed token sequences of one example (one; similarity: both orders; multiple choice: one a choice)."""
        build = self.format.build
        if self.task == "classification":
            a, _ = _fit(enc(ex if isinstance(ex, str) else ex[0]), None, max_len - 2)
            return [build(a)[0]]
        if self.task in ("entailment", "similarity"):
            a, b = _fit(enc(ex[0]), enc(ex[1]), max_len - 3)
            return [build(a, b)[0]] + ([build(b, a)[0]] if self.task == "similarity" else [])
        context, choices = ex
        if isinstance(choices, str) or not choices:
            raise LmforgeError("a multiple-choice example is (context, [choice, ...]) with at least one choice")
        row = []
        room = max_len - 3
        for choice in choices:
            c, ans = enc(context), enc(choice)
            if len(c) + len(ans) > room:  # the answer keeps up to half; the context keeps its end
                ans = ans[: max(room - len(c), max(1, room // 2))]
                keep = room - len(ans)
                c = c[len(c) - keep :] if keep > 0 else []
            row.append(build(c, ans)[0])
        return row

    # -- model ---------------------------------------------------------------------------------------
    def extract_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top states of flattened sequences and their extract-token states.

        Args:
            input_ids: (B, T) or (B, S, T).
            attention_mask: same shape, 1 = real token (right padding).
        Returns:
            ``(h, e)``: h (B*S, T, C) top states, e (B*S, C) the states at each sequence's last real token.
        """
        T = input_ids.shape[-1]
        flat = input_ids.reshape(-1, T)  # (B*S, T)
        fmask = attention_mask.reshape(-1, T) if attention_mask is not None else None
        h, _ = self.gpt.body(flat, fmask)  # (B*S, T, C)
        last = fmask.sum(-1) - 1 if fmask is not None else torch.full((flat.shape[0],), T - 1, device=flat.device)
        e = h[torch.arange(flat.shape[0], device=flat.device), last]  # (B*S, C)
        return h, e

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Task scores, and with labels the loss ``task_loss + lm_weight * lm_loss``.

        Args:
            input_ids, attention_mask: from :meth:`encode_examples`.
            labels: (B,) class ids (or the correct choice; -100 = ignore), or (B,) floats for regression.
        Returns:
            ModelOutput with ``logits`` (B, num_labels), (B,) for regression, or (B, N) choice scores;
            ``metrics`` ``task_loss``, ``lm_loss`` (when λ > 0) and ``acc`` (classification-like tasks).
        """
        B = input_ids.shape[0]
        h, e = self.extract_states(input_ids, attention_mask)
        if self.task == "similarity":
            e = e.view(B, 2, -1).sum(1)  # (B, C): GPT-1 adds the two orders' representations
        scores = self.head(self.dropout(e))  # (B, num_labels), or (B*N, 1) for multiple choice
        if self.task == "multiple_choice":
            scores = scores.view(B, -1)  # (B, N): softmax over the choices happens in the loss
        logits = scores.squeeze(-1) if self.regression else scores
        if labels is None:
            return ModelOutput(logits=logits)
        if self.regression:
            task_loss = F.mse_loss(logits.float(), labels.float())
            metrics = {"task_loss": task_loss.detach()}
        else:
            task_loss = F.cross_entropy(logits.float(), labels, ignore_index=-100)
            ok = labels != -100
            acc = (logits.argmax(-1)[ok] == labels[ok]).float().mean() if bool(ok.any()) else task_loss.new_zeros(())
            metrics = {"task_loss": task_loss.detach(), "acc": acc.detach()}
        loss = task_loss
        if self.lm_weight > 0:
            T = input_ids.shape[-1]
            lm_labels = input_ids.reshape(-1, T)
            if attention_mask is not None:
                lm_labels = lm_labels.masked_fill(attention_mask.reshape(-1, T) == 0, -100)
            targets = shift_labels(lm_labels).reshape(-1)  # (B*S*T,)
            lm_loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.gpt.lm_head.weight, targets)
            metrics["lm_loss"] = lm_loss.detach()
            loss = task_loss + self.lm_weight * lm_loss
        return ModelOutput(loss=loss, logits=logits, metrics=metrics)

    def predict(self, tokenizer, examples: Sequence, max_len: int | None = None) -> torch.Tensor:
        """Predicted class / choice index (or the regression value) of each example, in eval mode."""
        was = self.training
        self.eval()
        with torch.no_grad():
            device = self.head.weight.device
            batch = {k: v.to(device) for k, v in self.encode_examples(tokenizer, examples, max_len).items()}
            logits = self(**batch).logits
        self.train(was)
        return logits if self.regression else logits.argmax(-1)

    # the body interface (TransferBody) passes through to the GPT
    def hidden_states(self, input_ids, attention_mask=None, token_type_ids=None) -> list[torch.Tensor]:
        return self.gpt.hidden_states(input_ids, attention_mask, token_type_ids)

    def transfer_layers(self) -> list[nn.Module]:
        return self.gpt.transfer_layers()

    @property
    def hidden_size(self) -> int:
        return self.gpt.hidden_size


__all__ = ["TASKS", "TASK_TOKENS", "GPTForTask", "GPTInputFormat", "add_task_tokens", "transfer_format"]
