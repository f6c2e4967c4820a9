"""A finished transfer run (``lmforge finetune --out RUN``) as an HF ``transformers`` task model.

``lmforge export-hf RUN_DIR OUT`` writes the run's body (with the weight map of
:mod:`lmforge.interop.bert` / :mod:`lmforge.interop.gpt2`) plus its head in the HF class of its task,
so that ``transformers.pipeline(TASK, model=OUT)`` predicts what ``lmforge predict`` does:

| run | HF class | pipeline |
|---|---|---|
| BERT ``classify`` / ``pair`` | ``BertForSequenceClassification`` | ``text-classification`` |
| BERT ``tokens`` | ``BertForTokenClassification`` | ``token-classification`` |
| BERT ``qa`` | ``BertForQuestionAnswering`` | ``question-answering`` (transformers 4; 5 has none) |
| GPT ``classify`` / ``pair`` | ``GPT2ForSequenceClassification`` | ``text-classification`` |

How the head maps, exactly (anything that cannot map exactly is refused with one line saying why and
the ``lmforge finetune`` command that retrains the run in a form that maps; nothing approximate is written):

- the head's output Linear becomes ``classifier`` / ``qa_outputs`` / ``score``; its feature
  standardisation ``(x - mean) / std`` (features mode) is folded into it: ``W / std`` and
  ``b - (W / std) @ mean``;
- only a head that reads the top layer maps (HF classes read the top layer): a ScalarMix, another
  layer, or an ``mlp`` / ``bilstm`` classifier is refused;
- BERT sentence tasks: ``BertForSequenceClassification`` reads ``[CLS]`` through the tanh pooler, which
  is exactly ``--pool pooler``; ``--pool cls`` (the raw top ``[CLS]``) and ``--pool mean`` have no exact
  HF form and are refused;
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

import torch
from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as HFTokenizer

from ..config import load_json, save_json
from ..errors import CheckpointError, LmforgeError
from ..tokenization import EOT
from ..transfer import load_run
from ..transfer.config import saved_config
from ..transfer.gpt_inputs import TASK_TOKENS
from ..utils import atomic_write_text, save_safetensors
from .bert import hf_config_dict as bert_config_dict
from .bert import to_hf_state_dict as bert_state_dict
from .gpt2 import hf_config_dict as gpt2_config_dict
from .gpt2 import weight_map as gpt2_weight_map

logger = logging.getLogger(__name__)

#: (family, task) -> (HF architecture, pipeline task)
HF_CLASSES = {
    ("bert", "classify"): ("BertForSequenceClassification", "text-classification"),
    ("bert", "pair"): ("BertForSequenceClassification", "text-classification"),
    ("bert", "tokens"): ("BertForTokenClassification", "token-classification"),
    ("bert", "qa"): ("BertForQuestionAnswering", "question-answering"),
    ("gpt", "classify"): ("GPT2ForSequenceClassification", "text-classification"),
    ("gpt", "pair"): ("GPT2ForSequenceClassification", "text-classification"),
}
BIAS_TOLERANCE = 1e-6  # largest |W Δβ - b| (relative to max |b|, 1) accepted when the bias moves into ln_f


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
            f"lmforge export-hf {retrained} OUT")


def check_exportable(data: dict, run_dir: str | Path | None = None) -> tuple[str, str]:
    """Refuse (one line, with the command that retrains the run in a form that exports) a run whose head
    has no exact HF counterpart.

    Args:
        data: the run's ``config.json``.
        run_dir: the run folder, named in the commands the refusal suggests.
    Returns:
        (HF architecture, pipeline task).
    """
    cfg = saved_config(data, "this run")
    family, task = data.get("family"), cfg.task

    def refuse(why: str, flags: str) -> LmforgeError:
        return LmforgeError(f"{why}; retrain it in a form that exports: "
                            f"{retrain_command(data, run_dir, flags)}")

    if family not in ("bert", "gpt"):
        raise LmforgeError(f"export-hf exports BERT and GPT runs to HF task classes; this is a {family} run")
    if (family, task) not in HF_CLASSES:
        tasks = ", ".join(t for f, t in HF_CLASSES if f == family)
        raise LmforgeError(f"export-hf maps {family} runs of --task {tasks} to HF classes, not --task {task}")
    classifier = cfg.head_classifier
    if classifier not in ("linear", "logreg"):
        raise refuse(f"this run's {classifier} head has no HF counterpart (HF task classes end in one Linear)",
                     "--classifier linear")
    if data.get("layer_mix"):
        raise refuse("this run mixes the body's layers (ScalarMix), which HF task classes cannot express",
                     "--layer -1")
    n, ids = data.get("num_states"), data.get("layer_ids") or []
    if n is None or list(ids) != [n - 1]:
        raise refuse(f"this run's head reads layer {ids[0] if len(ids) == 1 else ids} of 0..{(n or 0) - 1}; "
                     "HF task classes read the top layer", "--layer -1")
    if cfg.both_orders:
        # a run file cannot switch a flag off, so this one names the change rather than a command
        raise LmforgeError("this run adds the read-outs of both orders of each pair (--both-orders); HF classes "
                           "read one input: retrain without --both-orders to export it")
    pool = data.get("pool")
    if family == "bert" and task in ("classify", "pair") and pool != "pooler":
        what = {"cls": "the raw top [CLS] (--pool cls)", "mean": "the mean of the token vectors (--pool mean)"}
        raise refuse(f"this run reads {what.get(pool, f'--pool {pool}')}, but BertForSequenceClassification reads "
                     "[CLS] through BERT's tanh pooler, so it cannot be exported exactly", "--pool pooler")
    if family == "gpt" and pool != "last":
        raise refuse(f"this run reads --pool {pool}; GPT2ForSequenceClassification reads the last token",
                     "--pool last")
    return HF_CLASSES[(family, task)]


@torch.no_grad()
def folded_linear(head) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's output Linear with its feature standardisation folded in: (W (K, C), b (K,)) in float64."""
    W = head.out.weight.detach().double().cpu()
    b = head.out.bias.detach().double().cpu()
    mean = head.feat_mean[0].detach().double().cpu()  # (C,): the one layer the head reads
    std = head.feat_std[0].detach().double().cpu()
    W = W / std[None, :]
    return W, b - W @ mean


def bias_into_ln_f(W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``Δβ`` with ``W Δβ = b`` (least squares); raises when no such ``Δβ`` fits exactly."""
    delta = torch.linalg.lstsq(W, b[:, None], driver="gelsd").solution[:, 0]
    err = float((W @ delta - b).abs().max()) if b.numel() else 0.0
    if err > BIAS_TOLERANCE * max(1.0, float(b.abs().max())):
        raise LmforgeError(
            f"this GPT run's head bias cannot move into ln_f exactly (residual {err:.2e}: its {W.shape[0]} "
            f"label rows are not independent in {W.shape[1]} dimensions), and GPT2ForSequenceClassification's "
            "score has no bias; it cannot be exported exactly"
        )
    return delta


def _bert(run, arch: str, W: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
    state = {k: v for k, v in bert_state_dict(run.body).items() if not k.startswith("cls.")}
    if arch != "BertForSequenceClassification":  # these HF classes have no pooler
        state = {k: v for k, v in state.items() if not k.startswith("bert.pooler.")}
    name = "qa_outputs" if arch == "BertForQuestionAnswering" else "classifier"
    state[f"{name}.weight"] = W.float().contiguous()
    state[f"{name}.bias"] = b.float().contiguous()
    config = bert_config_dict(run.body.config)
    return state, config


def _gpt(run, W: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
    body = run.body
    if not body.config.norm_first:
        raise LmforgeError("this GPT run's body is post-LN (GPT-1 style); HF GPT-2 is pre-LN, so only pre-LN GPT "
                           "runs export (to GPT2ForSequenceClassification)")
    delta = bias_into_ln_f(W, b)
    own = body.state_dict()
    state = {}
    for ours, (theirs, transpose) in gpt2_weight_map(body.config.n_layer).items():
        t = own[ours].detach().float().cpu()
        state[theirs] = t.t().contiguous() if transpose else t.contiguous()
    state["transformer.ln_f.bias"] = (own["ln_f.bias"].detach().double().cpu() + delta).float()
    state["score.weight"] = W.float().contiguous()
    config = gpt2_config_dict(body.config)  # vocab_size counts the three task rows
    config["pad_token_id"] = int(body.tokenizer.eot_id)
    return state, config


def _gpt_tokenizer(run, out: Path, max_len: int) -> None:
    """The body's BPE with the task tokens added and every input framed as the run frames it."""
    tok = run.body.tokenizer
    hf = HFTokenizer.from_str(tok.backend.to_str())
    hf.add_special_tokens([AddedToken(t, special=True) for t in TASK_TOKENS])
    ids = tuple(hf.token_to_id(t) for t in TASK_TOKENS)
    if ids != tuple(run.task_token_ids):
        raise CheckpointError(f"the run's task tokens have ids {run.task_token_ids}, the tokenizer gave {ids}")
    start, delim, extract = TASK_TOKENS
    hf.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(
            single=f"{start} $A {extract}",
            pair=f"{start} $A {delim} $B {extract}",
            special_tokens=list(zip(TASK_TOKENS, ids)),
        ),
    ])
    atomic_write_text(out / "tokenizer.json", hf.to_str(pretty=True))
    specials = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # reads tokenizer.json as it is (post-processor included)
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": list(TASK_TOKENS),
        **specials,
    }
    atomic_write_text(out / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    atomic_write_text(out / "special_tokens_map.json", json.dumps(specials, indent=2) + "\n")


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
    arch, pipeline_task = check_exportable(load_json(src / "config.json"), run_dir)
    run = load_run(src)
    run.body.eval()
    W, b = folded_linear(run.model.head)
    if run.family == "bert":
        state, config = _bert(run, arch, W, b)
    else:
        state, config = _gpt(run, W, b)
    config["architectures"] = [arch]
    if run.cfg.task != "qa":
        config["id2label"] = {str(i): lab for i, lab in enumerate(run.labels)}
        config["label2id"] = {lab: i for i, lab in enumerate(run.labels)}
        if arch.endswith("SequenceClassification"):
            config["problem_type"] = "single_label_classification"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, out / "model.safetensors", metadata={"format": "pt"})
    save_json(config, out / "config.json")
    if run.family == "bert":
        run.body.tokenizer.save(out)
        tc = load_json(out / "tokenizer_config.json")
        tc["model_max_length"] = run.cfg.max_len
        save_json(tc, out / "tokenizer_config.json")
    else:
        _gpt_tokenizer(run, out, run.cfg.max_len)
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
        f"# {out.name}: an lmforge {run.family} {run.cfg.task} run as `transformers.{arch}`",
        "",
        f"Written by `lmforge export-hf` from the run folder `{src}` (mode `{run.cfg.mode}`). Use it with "
        f"`transformers.pipeline(\"{pipeline_task}\", model=...)` or `transformers.{arch}.from_pretrained(...)`; "
        "it predicts what `lmforge predict` does on the run.",
        "",
    ]
    if run.cfg.task != "qa":
        lines += [f"Labels: {', '.join(run.labels)}", ""]
    if scores:
        lines += ["| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in scores.items()] + [""]
    atomic_write_text(out / "README.md", "\n".join(lines))


__all__ = ["HF_CLASSES", "check_exportable", "export_run", "folded_linear", "is_run_folder", "retrain_command"]
