"""The network of a transfer run: the head joined to the body, what trains, parameter groups, body passes.

:class:`RunModel` is the model-building half of :class:`~lmforge.transfer.run.TransferRun` (the run keeps
the data half: encoding, fitting, predicting). It reads the attributes the run sets up: ``body``, ``cfg``,
``spec``, ``recipe``, ``labels``, ``family``, ``device``, ``fmt``, ``layer``, ``pooler``, ``pair_rows``,
``task_token_ids``, ``num_states``, ``extract_ids`` and ``model``.

- ``frozen``: the body is frozen (eval mode); only the head (and, for ELMo, the ScalarMix) trains.  Where
  nothing of the body trains (:attr:`RunModel.body_stays_fixed`) it runs once and the head trains on the kept
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


class RunModel:
    """Building the run's network and training it: see the module docstring for the attributes it reads."""

    def _count_states(self) -> int:
        if self.num_states is None:
            with torch.no_grad():
                batch = collate([self.fmt.encode_text("a")], self.fmt.pad_id)
                was = self.body.training
                self.body.eval()
                states = self.body.hidden_states(
                    batch["input_ids"].to(self._body_device()),
                    batch["attention_mask"].to(self._body_device()),
                    batch["token_type_ids"].to(self._body_device()),
                )
                self.num_states = len(states)
                self.body.train(was)
        return self.num_states

    def _body_device(self) -> torch.device:
        return next(self.body.parameters()).device

    def default_layer_ids(self, stored: bool = False) -> list[int]:
        """The layers the head reads, or with ``stored`` the layers a features pass stores (``auto``: all
        of them, until cross-validation picks one; the head reads the top one until then)."""
        n = self._count_states()
        if self.pooler:
            return [n - 1]
        if self.layer == "mix" or (self.layer == "auto" and stored):
            return list(range(n))
        if self.layer == "auto":
            return [n - 1]
        k = int(self.layer)
        if not -n <= k < n:
            raise LmforgeError(
                f"--layer {k} is out of range: this {self.family} body has {n} hidden states (0..{n - 1})"
            )
        return [k % n]

    def build(self, layer_ids: list[int] | None = None) -> TransferModel:
        """Create the head (seeded) and join it to the body; it reads ``layer_ids`` (default: see above)."""
        ids = list(layer_ids) if layer_ids is not None else self.default_layer_ids()
        if self.extract_ids is None:
            self.extract_ids = self.default_layer_ids(stored=True) if layer_ids is None else list(ids)
        torch.manual_seed(self.cfg.seed)
        head = TaskHead(
            self.cfg.task,
            int(self.body.hidden_size),
            len(ids),
            self.spec.num_outputs(self.labels),
            classifier=self.cfg.head_classifier,
            layer_mix=self.layer == "mix",
            pair_rows=self.pair_rows,
            dropout=self.cfg.dropout,
            mlp_hidden=self.cfg.head_hidden,
        )
        self.model = TransferModel(self.body, head, ids, pooler=self.pooler).to(self.device)
        return self.model

    # -- what trains ----------------------------------------------------------------------------------
    @property
    def body_trains(self) -> bool:
        return self.cfg.mode == "finetune"

    @property
    def trains_task_rows(self) -> bool:
        """GPT's added task-token rows train although the embeddings are frozen (frozen mode, or
        finetune with ``freeze_layers``)."""
        if not self.task_token_ids:
            return False
        return self.cfg.mode == "frozen" or (self.cfg.mode == "finetune" and self.cfg.freeze_layers is not None)

    @property
    def body_needs_grad(self) -> bool:
        return self.body_trains or self.trains_task_rows

    @property
    def body_stays_fixed(self) -> bool:
        """Frozen mode with nothing of the body training and no auxiliary LM loss: the eval-mode body gives
        every example the same vectors in every epoch, so one pass can serve the whole fit."""
        return self.cfg.mode == "frozen" and not self.body_needs_grad and self.recipe.lm_weight == 0

    def _wte(self) -> nn.Parameter:
        return self.body.wte.weight

    def freeze(self) -> None:
        """Set ``requires_grad`` on the body as the mode says."""
        cfg = self.cfg
        for p in self.body.parameters():
            p.requires_grad_(self.body_trains)
        if cfg.mode == "finetune" and cfg.freeze_layers is not None:
            parts = list(self.body.transfer_layers())
            if cfg.freeze_layers >= len(parts) - 1:
                raise LmforgeError(
                    f"--freeze-layers {cfg.freeze_layers} is too large: this {self.family} body has the embeddings "
                    f"and {len(parts) - 1} layers, so K can be 0..{len(parts) - 2}"
                )
            for part in parts[: cfg.freeze_layers + 1]:
                for p in part.parameters():
                    p.requires_grad_(False)
        if self.trains_task_rows:
            wte = self._wte()
            wte.requires_grad_(True)
            rows = torch.zeros(wte.shape[0], 1, dtype=wte.dtype, device=wte.device)
            rows[list(self.task_token_ids)] = 1.0
            if getattr(self, "_row_hook", None) is not None:
                self._row_hook.remove()
            self._row_hook = wte.register_hook(lambda g: g * rows)  # only the task tokens' rows learn

    def param_groups(self, lr: float) -> list[dict]:
        """AdamW groups: the head, then the body's layers bottom-up with layer-wise decay; biases and
        norms without weight decay; GPT's task-token rows (when the rest of ``wte`` is frozen) without it."""
        decay = self.recipe.layer_lr_decay or 1.0
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
            wte = self._wte()
            seen.add(id(wte))
            groups.append({"params": [wte], "lr": lr, "weight_decay": 0.0, "name": "task_tokens"})
        add("head", self.model.head.parameters(), lr)
        if self.body_trains:
            parts = list(self.body.transfer_layers())
            n = len(parts)
            for i in reversed(range(n)):  # top first, so a module shared with a lower part trains at the top rate
                add(f"body.{i}", parts[i].parameters(), lr * decay ** (n - 1 - i))
            add("body.rest", self.body.parameters(), lr)  # e.g. an LM output layer outside the layer list
        return groups

    def train_mode(self) -> None:
        self.model.head.train()
        self.body.train(self.body_trains)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        if self.body_trains:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        state = {f"head.{k}": v.detach().clone() for k, v in self.model.head.state_dict().items()}
        if self.trains_task_rows:
            state["task_rows"] = self._wte()[list(self.task_token_ids)].detach().clone()
        return state

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.body_trains:
            self.model.load_state_dict(state)
            return
        self.model.head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        if "task_rows" in state:
            with torch.no_grad():
                self._wte()[list(self.task_token_ids)] = state["task_rows"]

    def autocast(self):
        return precision_autocast(self.device, self.cfg.precision)

    # -- body passes ----------------------------------------------------------------------------------
    def body_blocks(self, encs: Sequence[Encoding], grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's input for ``encs``; pairs read in both orders get their twin's read-out added."""
        seqs = with_twins(encs)
        batch = {k: v.to(self.device) for k, v in collate(seqs, self.fmt.pad_id).items()}
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            blocks, mask = self.model.blocks(batch)
        if len(seqs) > len(encs):
            B = len(encs)
            return blocks[:B] + blocks[B:], mask[:B]
        return blocks, mask

    def lm_loss(self, encs: Sequence[Encoding]) -> torch.Tensor:
        """GPT-1's auxiliary LM loss: next-token prediction on the batch's own inputs."""
        top = self.model.last_top  # (B, T, C) of the batch just run (twins included)
        ids = collate(with_twins(encs), self.fmt.pad_id)
        labels = ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100).to(top.device)
        targets = shift_labels(labels).reshape(-1)  # (B*T,)
        return linear_cross_entropy(top.reshape(-1, top.shape[-1]).float(), self.body.lm_head.weight, targets)
