"""The network of a transfer run: the head joined to the body, what trains, parameter groups, body passes.

:class:`RunNetwork` is the model-building part of :class:`~lmforge.transfer.run.TransferRun` (the run keeps
the data part: encoding, fitting, predicting). It reads the run's setup from the
:class:`~lmforge.transfer.state.RunState` it is given, and asks the run's mode
(:mod:`lmforge.transfer.modes`) what trains:

- ``frozen``: the body is frozen (eval mode); only the head (and, for ELMo, the ScalarMix) trains.  Where
  nothing of the body trains (:attr:`RunNetwork.body_stays_fixed`) it runs once and the head trains on the kept
  vectors; GPT's task-token rows train through it, so GPT runs it inside every training step.
- ``finetune``: body and head train together; ``freeze_layers=K`` keeps items ``0..K`` of
  ``body.transfer_layers()`` (the embeddings and the lowest K layers) fixed, and ``layer_lr_decay=d``
  gives item ``i`` of ``n`` the learning rate ``lr * d ** (n - 1 - i)``.  ``from_scratch=True``
  re-initialises the body from its config first (:func:`reinit_body`).

GPT's start / delimiter / extract tokens (GPT-1's input transformations) are new embedding rows: they
train in ``frozen`` mode and whenever the embeddings are otherwise frozen (only those rows change).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import LmforgeError
from ..nn.losses import linear_cross_entropy, shift_labels
from ..train.precision import autocast as precision_autocast
from .encoding import Encoding
from .heads import TaskHead
from .model import TransferModel, collate, with_twins
from .state import RunState

logger = logging.getLogger(__name__)


def reinit_body(body: nn.Module, seed: int) -> None:
    """Replace the body's weights with a fresh random init of the same config (no pretraining)."""
    torch.manual_seed(seed)
    fresh = dict(type(body)(body.config).named_parameters())
    with torch.no_grad():  # parameters only: buffers (e.g. ELMo's spelled vocabulary) stay as they are
        for name, p in body.named_parameters():
            p.copy_(fresh[name])  # every parameter: a baseline must keep none of the pretrained weights
    logger.info(
        "from scratch: the %s body was re-initialised at random (seed %d)", getattr(body, "model_type", "?"), seed
    )


def body_positions(body: nn.Module) -> int | None:
    """The most positions one input of ``body`` may take, special tokens included (None: any length)."""
    window = getattr(body, "embed_window", lambda: None)()
    if window is None:
        return None
    before, after = body.embed_specials()
    return int(window) + len(before) + len(after)


@torch.no_grad()
def start_pooler_at_identity(body: nn.Module) -> None:
    """Set the tanh pooler of a BERT that no loss trained it on (pretrained without next-sentence prediction) to
    ``tanh([CLS])``: dense = identity, bias 0.

    Fine-tuning reads the pooler by default (``BertForSequenceClassification`` reads it, so the run exports).
    A pooler at its random initialisation shrinks ``[CLS]`` to a small random projection, through which a
    fine-tuned head learns far slower than from ``[CLS]`` itself; at the identity it starts from ``[CLS]``
    (squashed by tanh) and trains from there.  A run folder keeps the trained pooler in ``body.safetensors``.
    """
    dense = body.bert.pooler.dense
    dense.weight.copy_(torch.eye(dense.weight.shape[0], dtype=dense.weight.dtype, device=dense.weight.device))
    dense.bias.zero_()


class RunNetwork:
    """The run's network: the head joined to the body, what of it trains and how (see the module docstring)."""

    def __init__(self, state: RunState):
        self.state = state
        self._row_hook = None  # the gradient hook that lets only GPT's task-token rows of the embeddings learn

    def _count_states(self) -> int:
        s = self.state
        if s.num_states is None:
            with torch.no_grad():
                batch = collate([s.fmt.encode_text("a")], s.fmt.pad_id)
                was = s.body.training
                s.body.eval()
                states = s.body.hidden_states(
                    batch["input_ids"].to(self._body_device()),
                    batch["attention_mask"].to(self._body_device()),
                    batch["token_type_ids"].to(self._body_device()),
                )
                s.num_states = len(states)
                s.body.train(was)
        return s.num_states

    def _body_device(self) -> torch.device:
        return next(self.state.body.parameters()).device

    def default_layer_ids(self, stored: bool = False) -> list[int]:
        """The layers the head reads, or with ``stored`` the layers a features pass stores (``auto``: all
        of them, until cross-validation picks one; the head reads the top one until then)."""
        s = self.state
        n = self._count_states()
        if s.pooler:
            return [n - 1]
        if s.layer == "mix" or (s.layer == "auto" and stored):
            return list(range(n))
        if s.layer == "auto":
            return [n - 1]
        k = int(s.layer)
        if not -n <= k < n:
            raise LmforgeError(
                f"--layer {k} is out of range: this {s.family} body has {n} hidden states (0..{n - 1})"
            )
        return [k % n]

    def build(self, layer_ids: list[int] | None = None) -> TransferModel:
        """Create the head (seeded) and join it to the body; it reads ``layer_ids`` (default: see above)."""
        s = self.state
        ids = list(layer_ids) if layer_ids is not None else self.default_layer_ids()
        if s.extract_ids is None:
            s.extract_ids = self.default_layer_ids(stored=True) if layer_ids is None else list(ids)
        torch.manual_seed(s.cfg.seed)
        head = TaskHead(
            s.cfg.task,
            int(s.body.hidden_size),
            len(ids),
            s.spec.num_outputs(s.labels),
            classifier=s.cfg.head_classifier,
            layer_mix=s.layer == "mix",
            pair_rows=s.pair_rows,
            dropout=s.cfg.dropout,
            mlp_hidden=s.cfg.head_hidden,
        )
        s.model = TransferModel(s.body, head, ids, pooler=s.pooler).to(s.device)
        return s.model

    # -- what trains (the mode says) ----------------------------------------------------------------------------
    @property
    def body_trains(self) -> bool:
        return self.state.mode.trains_body

    @property
    def trains_task_rows(self) -> bool:
        """GPT's added task-token rows train although the embeddings are frozen (frozen mode, or
        finetune with ``freeze_layers``)."""
        return bool(self.state.task_token_ids) and self.state.mode.trains_task_rows(self.state.cfg)

    @property
    def body_needs_grad(self) -> bool:
        return self.body_trains or self.trains_task_rows

    @property
    def body_stays_fixed(self) -> bool:
        """Nothing of the body trains and there is no auxiliary LM loss (frozen mode): the eval-mode body gives
        every example the same vectors in every epoch, so one pass can serve the whole fit."""
        return self.state.mode.body_stays_fixed(self.body_needs_grad, self.state.recipe.lm_weight)

    def wte(self) -> nn.Parameter:
        return self.state.body.wte.weight

    def freeze(self) -> None:
        """Set ``requires_grad`` on the body as the mode says; GPT's task-token rows learn where they train."""
        s = self.state
        s.mode.freeze(s.body, s.cfg, s.family)
        if self.trains_task_rows:
            wte = self.wte()
            wte.requires_grad_(True)
            rows = torch.zeros(wte.shape[0], 1, dtype=wte.dtype, device=wte.device)
            rows[list(s.task_token_ids)] = 1.0
            self.drop_row_hook()
            self._row_hook = wte.register_hook(lambda g: g * rows)  # only the task tokens' rows learn

    def drop_row_hook(self) -> None:
        """Remove the task-token gradient hook (a fit is over, or a new one starts)."""
        if self._row_hook is not None:
            self._row_hook.remove()
            self._row_hook = None

    def param_groups(self, lr: float) -> list[dict]:
        """AdamW groups: the head, then the body's (the mode's: layer-wise decay in finetune mode); biases and
        norms without weight decay; GPT's task-token rows (when the rest of ``wte`` is frozen) without it."""
        s = self.state
        groups: list[dict] = []
        seen: set[int] = set()

        def add(name: str, params, rate: float) -> None:
            ps = [p for p in params if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in ps)
            wd = [p for p in ps if p.ndim >= 2]
            no_wd = [p for p in ps if p.ndim < 2]
            if wd:
                groups.append({"params": wd, "lr": rate, "name": name})
            if no_wd:
                groups.append({"params": no_wd, "lr": rate, "weight_decay": 0.0, "name": f"{name}.no_decay"})

        if self.trains_task_rows:  # zero gradient elsewhere; no decay, so the frozen rows stay exactly as they were
            wte = self.wte()
            seen.add(id(wte))
            groups.append({"params": [wte], "lr": lr, "weight_decay": 0.0, "name": "task_tokens"})
        add("head", s.model.head.parameters(), lr)
        s.mode.body_groups(add, s.body, lr, s.recipe.layer_lr_decay)
        return groups

    def train_mode(self) -> None:
        self.state.model.head.train()
        self.state.body.train(self.body_trains)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        s = self.state
        if self.body_trains:
            return {k: v.detach().clone() for k, v in s.model.state_dict().items()}
        state = {f"head.{k}": v.detach().clone() for k, v in s.model.head.state_dict().items()}
        if self.trains_task_rows:
            state["task_rows"] = self.wte()[list(s.task_token_ids)].detach().clone()
        return state

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        s = self.state
        if self.body_trains:
            s.model.load_state_dict(state)
            return
        s.model.head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        if "task_rows" in state:
            with torch.no_grad():
                self.wte()[list(s.task_token_ids)] = state["task_rows"]

    def autocast(self):
        return precision_autocast(self.state.device, self.state.cfg.precision)

    # -- body passes ----------------------------------------------------------------------------------
    def body_blocks(self, encs: Sequence[Encoding], grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's input for ``encs``; pairs read in both orders get their twin's read-out added."""
        s = self.state
        seqs = with_twins(encs)
        batch = {k: v.to(s.device) for k, v in collate(seqs, s.fmt.pad_id).items()}
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            blocks, mask = s.model.blocks(batch)
        if len(seqs) > len(encs):
            B = len(encs)
            return blocks[:B] + blocks[B:], mask[:B]
        return blocks, mask

    def lm_loss(self, encs: Sequence[Encoding]) -> torch.Tensor:
        """GPT-1's auxiliary LM loss: next-token prediction on the batch's own inputs."""
        s = self.state
        top = s.model.last_top  # (B, T, C) of the batch just run (twins included)
        ids = collate(with_twins(encs), s.fmt.pad_id)
        labels = ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100).to(top.device)
        targets = shift_labels(labels).reshape(-1)  # (B*T,)
        return linear_cross_entropy(top.reshape(-1, top.shape[-1]).float(), s.body.lm_head.weight, targets)
