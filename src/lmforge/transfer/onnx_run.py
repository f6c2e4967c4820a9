"""A fine-tuned run (body and task head) as one ONNX graph, run by ONNX Runtime for ``predict``.

The graph is :class:`~lmforge.transfer.model.TransferModel`'s forward on a collated batch
(:func:`~lmforge.transfer.model.collate`): inputs ``input_ids``, ``attention_mask``, ``token_type_ids``,
``segment`` and the head's read-out (``rows``, or ``mean_segments``) with its ``row_mask``, all (B, ·) int64 with
dynamic sizes; output the head's logits.  Export, caching by weight hash and int8 are
:mod:`lmforge.models.onnx_backend`'s.  Runs whose head reads stored vectors (``features`` mode) or a pair in both
orders have no single graph, and are refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import LmforgeError
from ..models import onnx_backend
from ..nn import autotune
from .model import collate
from .specs import SPECS


class _Positional(nn.Module):
    """``TransferModel`` with its batch dict given as positional tensors (what the exporter traces)."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(dict(zip(self.names, tensors)))


def _padded_example(run, encs) -> dict[str, torch.Tensor]:
    """A two-row batch of ``encs[0]`` whose first row is padded (so the traced graph keeps the padding mask)."""
    e = encs[0]
    pad = run.fmt.pad_id
    longer = dataclasses.replace(e, input_ids=[*e.input_ids, pad, pad, pad],
                                 token_type_ids=[*e.token_type_ids, 0, 0, 0], segment=[*e.segment, -1, -1, -1])
    return collate([e, longer], run.fmt.pad_id)


def _example_encodings(run) -> list:
    """An encoding of the run's kind of input, for tracing (sentence and pair tasks, token tagging)."""
    spec = SPECS[run.cfg.task]
    if spec.label_outputs and spec.sentence:  # classify, pair
        return [run.fmt.encode_text("an example text", "and its pair" if spec.text_pair else None)]
    if spec.label_outputs:  # tokens
        return [run.fmt.encode_words(["an", "example", "text"])]
    raise LmforgeError(f"export-onnx writes classify, pair and tokens runs, not {run.cfg.task}")


def run_graph(run, quantize: str = "none", encs=None) -> Path:
    """The cached ONNX graph of ``run`` (body and head; see the module docstring) and its input names."""
    return _graph(run, encs or _example_encodings(run), quantize)[0]


def _graph(run, encs, quantize: str) -> tuple[Path, list[str]]:
    run.mode.check_onnx()  # (features: the head reads stored vectors)
    if any(e.twin is not None for e in encs):
        raise LmforgeError("a run that reads pairs in both orders has no single ONNX graph; use --backend torch")
    example = _padded_example(run, encs)
    names = [k for k in example if k != "segment" or "mean_segments" in example]
    model = _Positional(run.model.cpu().eval(), names)
    out_axes = {"logits": {0: "batch"} if run.spec.sentence else {0: "batch", 1: "rows"}}
    path = onnx_backend.cached_graph(model, f"{run.cfg.task} run", tuple(example[k] for k in names), names,
                                     out_axes, quantize)
    return path, names


def run_forward(run, encs, quantize: str = "none"):
    """``batch dict -> logits`` of ``run`` on ONNX Runtime (exported, and int8-quantized if asked, on first use).

    Args:
        run: a :class:`~lmforge.transfer.run.TransferRun` (frozen or finetune mode).
        encs: some of its encodings (the first one shapes the traced example).
        quantize: ``none`` or ``int8``.
    """
    path, names = _graph(run, encs, quantize)
    sess = onnx_backend.session(path)
    wanted = {i.name for i in sess.get_inputs()}  # inputs the graph does not read are not fed

    def forward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        feed = {k: np.ascontiguousarray(batch[k].cpu().numpy()) for k in names if k in wanted}
        return torch.from_numpy(sess.run(None, feed)[0])

    return forward


def auto_forward(run, encs):
    """The faster of torch and ONNX Runtime for ``run``, timed on a batch of ``encs`` once per run, batch shape
    and machine (cached: :mod:`lmforge.nn.autotune`): the ONNX Runtime forward, or None for torch (also where a
    run has no single graph)."""
    if not run.mode.exports_onnx or any(e.twin is not None for e in encs):
        return None
    batch = collate(encs[: run.cfg.batch_size], run.fmt.pad_id)
    B, T = batch["input_ids"].shape
    width = 1 << max(0, T - 1).bit_length()  # lengths up to the same power of two share an answer
    question = f"predict backend | {onnx_backend.weights_key(run.model, 'run')[:16]} | batch {B}x<={width}"
    known = autotune.lookup(question)
    if known is not None and known["choice"] == "torch":
        return None
    onnx = run_forward(run, encs)
    model = run.model

    @torch.no_grad()
    def on_torch():
        model(batch)

    choice = autotune.choose(question, {"torch": on_torch, "onnx": lambda: onnx(batch)}, "torch", reps=3)
    return onnx if choice == "onnx" else None
