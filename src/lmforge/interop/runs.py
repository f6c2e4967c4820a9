"""A finished transfer run (``lmforge finetune --out RUN``) as an HF ``transformers`` task model.

``lmforge export-hf RUN_DIR --out OUT`` writes the run's body (with the weight map of :mod:`lmforge.families.bert.hf` /
:mod:`lmforge.families.gpt.hf` / :mod:`lmforge.families.electra.hf`) plus its head in the HF class of its task, so that
``transformers.pipeline(TASK, model=OUT)`` predicts what ``lmforge predict`` does:

| run | HF class | pipeline |
|---|---|---|
| BERT ``classify`` / ``pair`` | ``BertForSequenceClassification`` | ``text-classification`` |
| BERT ``tokens`` | ``BertForTokenClassification`` | ``token-classification`` |
| BERT ``qa`` | ``BertForQuestionAnswering`` | ``question-answering`` (transformers 4; 5 has none) |
| GPT ``classify`` / ``pair`` | ``GPT2ForSequenceClassification`` | ``text-classification`` |
| ELECTRA ``classify`` / ``pair`` | ``ElectraForSequenceClassification`` | ``text-classification`` |
| ELECTRA ``tokens`` / ``qa`` | ``ElectraForTokenClassification`` / ``ElectraForQuestionAnswering`` | as BERT's |

How the head maps, exactly (anything that cannot map exactly is refused with one line saying why and
the ``lmforge finetune`` command that retrains the run in a form that maps; nothing approximate is written):

- the head's output Linear becomes ``classifier`` / ``qa_outputs`` / ``score``; its feature
  standardisation ``(x - mean) / std`` (features mode) is folded into it: ``W / std`` and
  ``b - (W / std) @ mean``;
- only a head that reads the top layer maps (HF classes read the top layer): a ScalarMix, another
  layer, or an ``mlp`` / ``bilstm`` classifier is refused;
- BERT sentence tasks: ``BertForSequenceClassification`` reads ``[CLS]`` through the tanh pooler, which
  is exactly ``--pool pooler`` (fine-tuning's default, the family's ``hf_pool``, so a default run exports);
  ``--pool cls`` (the raw top ``[CLS]``) and ``--pool mean`` have no exact HF form and are refused (no
  weights make ``tanh`` the identity: a pooler scaled towards 0 only approaches it);
- ELECTRA sentence tasks: ``ElectraForSequenceClassification`` reads the raw top ``[CLS]`` (``--pool cls``)
  through ``out_proj(gelu(dense(x)))``, which carries the run's Linear exactly by ``gelu(z) - gelu(-z) = z``
  (:mod:`lmforge.families.electra.runs`); ``--pool mean`` is refused;
- GPT: the tokenizer gets the run's start / delimiter / extract tokens (ids V, V+1, V+2, rows of
  ``wte``) and a post-processor that frames every input as ``start text extract`` (pairs: ``start a
  delim b extract``), so the pipeline feeds the run's ids; ``<|endoftext|>`` is the pad token, and
  ``GPT2ForSequenceClassification`` reads the last non-pad token: the extract token.  Its ``score``
  Linear has no bias, so the head's bias ``b`` moves into ``ln_f``'s bias, whose output feeds only the
  score: ``Δβ`` solves ``W Δβ = b`` (least squares), exact when the ``num_labels`` rows of ``W`` are
  independent; a bias that does not fit exactly is refused.  Only pre-LN GPTs (GPT-2 style) map.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Protocol

import torch

from ..config import load_json
from ..data.tasks import KINDS
from ..errors import LmforgeError
from ..families import FAMILIES, Family
from ..storage.cards import display_name
from ..storage.files import atomic_write_text, save_json, save_safetensors
from ..transfer import load_run
from ..transfer.config import saved_config
from ..transfer.specs import SPECS

logger = logging.getLogger(__name__)


class RunExport(Protocol):
    """What a family's run-export module (``Family.run_export()``: :mod:`lmforge.families.bert.runs`,
    :mod:`lmforge.families.gpt.runs`, :mod:`lmforge.families.electra.runs`) gives :func:`export_run`."""

    #: ``TaskSpec.hf_head`` -> the HF class a run of that task exports to (a task not here does not export)
    HEADS: dict[str, str]

    def check(self, data: dict, arch: str) -> list[tuple[str, str]]:
        """``(why, flags that retrain it so)`` for the run's read-out when it has no exact form in ``arch``."""

    def weights(self, run, arch: str, W: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
        """The HF state dict and ``config.json`` of the run with the folded head ``W`` (K, C), ``b`` (K,)."""

    def write_tokenizer(self, run, out: Path, max_len: int) -> None:
        """The tokenizer files of the HF folder ``out``."""


def family_export(family: Family) -> RunExport:
    """The module that exports ``family``'s runs (its ``run_export()``)."""
    return family.run_export()  # type: ignore[return-value]


def _exporting() -> dict[str, Family]:
    """The families whose runs export, in the registry's order."""
    return {name: f for name, f in FAMILIES.items() if f.exports_runs}


def is_run_folder(path: str | Path) -> bool:
    """Whether ``path`` is a transfer run folder (its ``config.json`` has a ``transfer`` key)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return "transfer" in json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def retrain_command(data: dict, run_dir: str | Path | None, flags: str) -> str:
    """The commands that repeat the run with ``flags`` changed, into a new folder, and export that run.

    The run's ``config.json`` carries every transfer setting, so ``--config`` repeats the run; only the
    data files are not recorded, and the line names them ``TRAIN`` and ``TEST``.
    """
    run = str(run_dir).rstrip("/") if run_dir is not None else "RUN"
    model = data.get("model_dir") or "MODEL"
    retrained = shlex.quote(run + "-retrained")
    return (f"lmforge finetune {shlex.quote(str(model))} --config {shlex.quote(run + '/config.json')} {flags} "
            f"--train TRAIN --test TEST --out {retrained} (TRAIN, TEST: the run's data files), then "
            f"lmforge export-hf {retrained} --out OUT")


def _hf_class(data: dict, task: str) -> tuple[RunExport, str, str]:
    """(the family's run export, HF architecture, pipeline task) of the run; refuses a family or task without one."""
    name = data.get("family")
    family = FAMILIES.get(name) if isinstance(name, str) else None
    exporting = _exporting()
    if family is None or family.name not in exporting:
        labels = [f.label for f in exporting.values()]
        names = " and ".join([", ".join(labels[:-1]), labels[-1]] if len(labels) > 1 else labels)
        raise LmforgeError(f"export-hf exports {names} runs to HF task classes; this is a {name} run (lmforge "
                           "predict and serve use it as it is)")
    exporter = family_export(family)
    spec = SPECS.get(task)
    if spec is None or spec.hf_head not in exporter.HEADS:
        tasks = ", ".join(t for t, s in SPECS.items() if s.hf_head in exporter.HEADS)
        raise LmforgeError(f"export-hf maps {name} runs of --task {tasks} to HF classes, not --task {task} (lmforge "
                           "predict and serve use the run as it is)")
    return exporter, exporter.HEADS[spec.hf_head], KINDS[task].pipeline_tag  # type: ignore[index]


def check_exportable(data: dict, run_dir: str | Path | None = None) -> tuple[str, str]:
    """Refuse (one line, with the command that retrains the run in a form that exports, every change it needs
    at once) a run whose head has no exact HF counterpart.

    Args:
        data: the run's ``config.json``.
        run_dir: the run folder, named in the commands the refusal suggests.
    Returns:
        (HF architecture, pipeline task).
    """
    cfg = saved_config(data, "this run")
    exporter, arch, pipeline_task = _hf_class(data, cfg.task)
    if cfg.both_orders:
        # a run file cannot switch a flag off, so this one names the change rather than a command
        raise LmforgeError("this run adds the read-outs of both orders of each pair (--both-orders); HF classes "
                           "read one input: retrain without --both-orders to export it")
    problems: list[tuple[str, str]] = []  # (why, the flags that retrain it so)
    classifier = cfg.head_classifier
    if classifier not in ("linear", "logreg"):
        problems.append((f"this run's {classifier} head has no HF counterpart (HF task classes end in one Linear)",
                         "--classifier linear"))
    n, ids = data.get("num_states"), data.get("layer_ids") or []
    if data.get("layer_mix"):
        problems.append(("this run mixes the body's layers (ScalarMix), which HF task classes cannot express",
                         "--layer -1"))
    elif n is None or list(ids) != [n - 1]:
        problems.append((f"this run's head reads layer {ids[0] if len(ids) == 1 else ids} of 0..{(n or 0) - 1}; "
                         "HF task classes read the top layer", "--layer -1"))
    problems += exporter.check(data, arch)
    if problems:
        flags = " ".join(dict.fromkeys(flag for _, flag in problems))
        raise LmforgeError(f"{'; '.join(why for why, _ in problems)} (lmforge predict and serve use the run as it "
                           f"is); retrain it in a form that exports: {retrain_command(data, run_dir, flags)}")
    return arch, pipeline_task


@torch.no_grad()
def folded_linear(head) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's output Linear with its feature standardisation folded in: (W (K, C), b (K,)) in float64."""
    W = head.out.weight.detach().double().cpu()
    b = head.out.bias.detach().double().cpu()
    mean = head.feat_mean[0].detach().double().cpu()  # (C,): the one layer the head reads
    std = head.feat_std[0].detach().double().cpu()
    W = W / std[None, :]
    return W, b - W @ mean


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the transfer run at ``run_dir`` as an HF task model folder (see the module docstring).

    Args:
        run_dir: a finished run folder (``config.json`` with ``transfer``, ``head.safetensors``...).
        out_dir: the folder to write (created).
    Returns:
        ``out_dir`` as a Path.
    Raises:
        LmforgeError: the run's head has no exact HF counterpart (the message says what to retrain with).
    """
    src = Path(run_dir)
    data = load_json(src / "config.json")
    arch, pipeline_task = check_exportable(data, run_dir)
    exporter = family_export(FAMILIES[data["family"]])
    run = load_run(src)
    run.body.eval()
    W, b = folded_linear(run.model.head)
    state, config = exporter.weights(run, arch, W, b)
    config["architectures"] = [arch]
    if SPECS[run.cfg.task].label_outputs:
        config["id2label"] = {str(i): lab for i, lab in enumerate(run.labels)}
        config["label2id"] = {lab: i for i, lab in enumerate(run.labels)}
        if arch.endswith("SequenceClassification"):
            config["problem_type"] = "single_label_classification"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, out / "model.safetensors", metadata={"format": "pt"})
    save_json(config, out / "config.json")
    exporter.write_tokenizer(run, out, run.cfg.max_len)
    _card(out, src, run, arch, pipeline_task)
    logger.info("exported the %s %s run %s as %s", run.family, run.cfg.task, src, arch)
    return out


def _card(out: Path, src: Path, run, arch: str, pipeline_task: str) -> None:
    metrics = load_json(src / "metrics.json") if (src / "metrics.json").is_file() else {}
    scores = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    lines = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {pipeline_task}",
        f"tags: [lmforge, {run.family}, {run.cfg.task}]",
        "---",
        f"# {display_name(out)}: an lmforge {run.family} {run.cfg.task} run as `transformers.{arch}`",
        "",
        f"Written by `lmforge export-hf` from the run folder `{src}` (mode `{run.cfg.mode}`). Use it with "
        f"`transformers.pipeline(\"{pipeline_task}\", model=...)` or `transformers.{arch}.from_pretrained(...)`; "
        "it predicts what `lmforge predict` does on the run.",
        "",
    ]
    if SPECS[run.cfg.task].label_outputs:
        lines += [f"Labels: {', '.join(run.labels)}", ""]
    if scores:
        lines += ["| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in scores.items()] + [""]
    atomic_write_text(out / "README.md", "\n".join(lines))


__all__ = ["RunExport", "check_exportable", "export_run", "family_export", "folded_linear", "is_run_folder",
           "retrain_command"]
