"""GPT's side of ``lmforge export-hf RUN``: a GPT transfer run as HF ``GPT2ForSequenceClassification``.

:mod:`lmforge.interop.runs` checks and folds the head and calls these (the :class:`~lmforge.interop.runs.RunExport`
interface); its docstring says how the task tokens, the pad token and the head's bias map.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as HFTokenizer

from ...errors import CheckpointError, LmforgeError
from ...storage.files import atomic_write_text
from ...tokenizer_pipelines import EOT
from .hf import hf_config_dict, weight_map
from .inputs import TASK_TOKENS

#: TaskSpec.hf_head -> the HF class a GPT run of that task exports to
HEADS = {"SequenceClassification": "GPT2ForSequenceClassification"}
BIAS_TOLERANCE = 1e-6  # largest |W Δβ - b| (relative to max |b|, 1) accepted when the bias moves into ln_f


def check(data: dict, arch: str) -> list[tuple[str, str]]:
    """A run must read the last token (GPT2ForSequenceClassification reads the last non-pad one)."""
    pool = data.get("pool")
    if pool != "last":
        return [(f"this run reads --pool {pool}; GPT2ForSequenceClassification reads the last token", "--pool last")]
    return []


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


def weights(run, arch: str, W: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
    """The HF state dict and ``config.json`` of the run: its body with ``b`` moved into ``ln_f``, ``W`` as ``score``."""
    body = run.body
    if not body.config.norm_first:
        raise LmforgeError("this GPT run's body is post-LN (GPT-1 style); HF GPT-2 is pre-LN, so only pre-LN GPT "
                           "runs export (to GPT2ForSequenceClassification)")
    delta = bias_into_ln_f(W, b)
    own = body.state_dict()
    state = {}
    for ours, (theirs, transpose) in weight_map(body.config.n_layer).items():
        t = own[ours].detach().float().cpu()
        state[theirs] = t.t().contiguous() if transpose else t.contiguous()
    state["transformer.ln_f.bias"] = (own["ln_f.bias"].detach().double().cpu() + delta).float()
    state["score.weight"] = W.float().contiguous()
    config = hf_config_dict(body.config)  # vocab_size counts the three task rows
    config["pad_token_id"] = int(body.tokenizer.eot_id)
    return state, config


def write_tokenizer(run, out: Path, max_len: int) -> None:
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
