"""ONNX export and an ONNX Runtime backend, with optional dynamic int8 quantization.

A model's graph is exported with ``torch.onnx.export`` (batch and length dynamic) and run by ONNX Runtime's
CPU provider; ``int8`` is ONNX Runtime's dynamic quantization (``quantize_dynamic``: int8 weights, one scale per
output channel, activations quantized per batch at run time).  Exported graphs are cached by the hash of the
module's weights, so a model is exported once per machine:

    $LMFORGE_CACHE/onnx/<sha256>.onnx   (default: $XDG_CACHE_HOME/lmforge, else ~/.cache/lmforge)

``LMFORGE_CACHE=off`` exports into a temporary folder in every process.  ``onnx`` and ``onnxruntime`` are the
``onnx`` extra.  The exporter is the TorchScript tracer (``dynamo=False``): ``torch.export`` stops at the data-
dependent "no padding?" test of the attention mask, which tracing with a padded example records as its padded
branch, correct for every mask.  lmforge's oneDNN routes (:mod:`lmforge.nn.cpu_ops`) are off while tracing, so
the graph holds public operators only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import tempfile
import warnings
import weakref
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import LmforgeError, require
from ..nn import autotune, cpu_ops
from .sentence import Forward

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx", "auto")
QUANTIZE = ("none", "int8")
OPSET = 17
GRAPH_VERSION = 2  # raised whenever the way a graph is exported changes, so cached graphs are made again
_TMP: tempfile.TemporaryDirectory | None = None


class TopStates(nn.Module):
    """A body's top layer, (B, T) ids and mask -> (B, T, C): what a sentence pipeline pools."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.body.hidden_states(input_ids, attention_mask)[-1]


def weights_key(module: nn.Module, *parts: str) -> str:
    """sha256 of the module's weights and buffers (names, shapes, bytes) and ``parts`` (what else the graph
    depends on): the cache key of its graph."""
    h = hashlib.sha256("|".join((torch.__version__, str(OPSET), str(GRAPH_VERSION), *parts)).encode())
    for name, t in module.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cache_dir() -> Path:
    """Where exported graphs are kept (see the module docstring)."""
    global _TMP
    path = autotune.cache_path()
    if path is not None:
        return path.parent / "onnx"
    if _TMP is None:
        _TMP = tempfile.TemporaryDirectory(prefix="lmforge-onnx-")
    return Path(_TMP.name)


def example_inputs(vocab_size: int, n_inputs: int) -> tuple[torch.Tensor, ...]:
    """A padded (2, 8) batch: ids, mask with a padded row (so the traced graph keeps the mask), zeros."""
    ids = torch.randint(1, max(2, vocab_size), (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return (ids, mask, torch.zeros_like(ids))[:n_inputs]


def export(module: nn.Module, example: tuple[torch.Tensor, ...], path: str | Path, input_names: list[str],
           output_axes: dict[str, dict[int, str]]) -> Path:
    """Write ``module`` (eval mode) as an ONNX graph whose inputs are (B, ·) with both sizes dynamic (each input's
    second one its own) and whose outputs have the dynamic axes ``output_axes`` names (output name -> {axis:
    name}); written atomically."""
    require("onnx", "onnx")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    was = cpu_ops.onednn_mode()
    cpu_ops.set_onednn("off")  # public operators only in the graph
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python branches and its own deprecation
            torch.onnx.export(module.eval(), example, str(tmp), input_names=input_names,
                              output_names=list(output_axes),
                              dynamic_axes={**{n: {0: "batch", 1: f"{n}_width"} for n in input_names}, **output_axes},
                              opset_version=OPSET, dynamo=False)
        tmp.replace(path)
    finally:
        cpu_ops.set_onednn(was)
        tmp.unlink(missing_ok=True)
    return path


def quantize_int8(src: Path, dst: Path) -> Path:
    """ONNX Runtime's dynamic int8 quantization of ``src`` (weights per output channel) into ``dst``."""
    quantization = require("onnxruntime.quantization", "onnx")
    tmp = dst.with_name(f".{dst.name}.tmp")
    try:
        # it logs advice on the root logger (pre-processing) that a user cannot act on: muted while it runs
        with contextlib.redirect_stdout(None), _root_quiet():
            quantization.quantize_dynamic(str(src), str(tmp), per_channel=True,
                                          weight_type=quantization.QuantType.QInt8)
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


@contextlib.contextmanager
def _root_quiet():
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def cached_graph(module: nn.Module, kind: str, example: tuple[torch.Tensor, ...], input_names: list[str],
                 output_axes: dict[str, dict[int, str]], quantize: str = "none") -> Path:
    """The module's graph (int8 if asked) from the cache, exported (and quantized) the first time."""
    if quantize not in QUANTIZE:
        raise LmforgeError(f"unknown --quantize '{quantize}'; choose one of {', '.join(QUANTIZE)}")
    key = weights_key(module, kind, ",".join(input_names))
    fp32 = cache_dir() / f"{key}.onnx"
    if not fp32.is_file():
        logger.info("exporting %s to ONNX: %s", kind, fp32)
        export(module, example, fp32, input_names, output_axes)
    if quantize == "none":
        return fp32
    int8 = cache_dir() / f"{key}.int8.onnx"
    if not int8.is_file():
        quantize_int8(fp32, int8)
    return int8


def session(path: str | Path, threads: int | None = None):
    """An ONNX Runtime CPU session of ``path`` on ``threads`` intra-op threads (default: torch's count)."""
    ort = require("onnxruntime", "onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # no busy-waiting between runs: spinning threads take the cores a server's other work (tokenizing,
    # HTTP) and torch need, and on a shared machine they slow every run
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def body_graph(body, quantize: str = "none") -> Path:
    """The cached ONNX graph of ``body``'s top layer (:class:`TopStates`): inputs ``input_ids`` and
    ``attention_mask`` (B, T) int64, output ``states`` (B, T, C) float32."""
    body = body.cpu().eval()
    example = example_inputs(int(body.tokenizer.vocab_size) if body.tokenizer is not None else 2, 2)
    return cached_graph(TopStates(body), f"{body.model_type} top states", example, ["input_ids", "attention_mask"],
                        {"states": {0: "batch", 1: "length"}}, quantize)


def onnx_forward(body, quantize: str = "none", threads: int | None = None) -> Forward:
    """A sentence pipeline's forward pass (:data:`lmforge.models.sentence.Forward`) on ONNX Runtime."""
    try:
        sess = session(body_graph(body, quantize), threads)
    except LmforgeError:
        raise
    except Exception as e:  # noqa: BLE001 - the exporter or ONNX Runtime refusing the graph (ELMo's LSTMs)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise LmforgeError(f"the {body.model_type} model's top layer does not run on ONNX Runtime ({type(e).__name__}: "
                           f"{first}); use --backend torch") from None
    # a graph whose states do not depend on the mask (GPT: causal, padding only at the end) has no mask input
    takes_mask = "attention_mask" in {i.name for i in sess.get_inputs()}

    def forward(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return sess.run(None, {"input_ids": ids, **({"attention_mask": mask} if takes_mask else {})})[0]

    return forward


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (n, C) arrays (a zero row gives 0)."""
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.maximum(na * nb, 1e-12)


# -- choosing a backend ------------------------------------------------------------------------------
_FORWARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # body -> {(quantize, threads): Forward}


def cached_forward(body, quantize: str = "none") -> Forward:
    """:func:`onnx_forward` of ``body``, made once per body, quantization and thread count in this process
    (a server asks for it on every request)."""
    mine = _FORWARDS.setdefault(body, {})
    key = (quantize, torch.get_num_threads())
    if key not in mine:
        mine[key] = onnx_forward(body, quantize)
    return mine[key]


def select(body, backend: str, quantize: str, probe: tuple[np.ndarray, np.ndarray]) -> tuple[Forward | None, str]:
    """The forward pass ``backend`` names for ``body``, and the name of the one taken.

    Args:
        body: a model with ``hidden_states``.
        backend: ``torch``, ``onnx`` or ``auto`` (the faster of the two on a batch like ``probe``, measured once
            per model, quantization and machine and cached: :mod:`lmforge.nn.autotune`).
        quantize: ``none`` or ``int8`` (ONNX Runtime's dynamic quantization: int8 runs on ONNX Runtime only,
            so ``auto`` with ``int8`` is ``onnx``).
        probe: (ids, mask) of a typical batch, timed by ``auto``.
    Returns:
        (forward, name): forward is None for torch (the caller's own torch path).
    """
    if backend not in BACKENDS:
        raise LmforgeError(f"unknown backend '{backend}'; choose one of {', '.join(BACKENDS)}")
    if quantize not in QUANTIZE:
        raise LmforgeError(f"unknown quantization '{quantize}'; choose one of {', '.join(QUANTIZE)}")
    if backend == "torch":
        if quantize != "none":
            raise LmforgeError("int8 runs on ONNX Runtime: use --backend onnx (or auto) with --quantize int8")
        return None, "torch"
    if backend == "onnx" or quantize != "none":
        return cached_forward(body, quantize), "onnx"
    ids, mask = probe
    length = 1 << max(0, ids.shape[1] - 1).bit_length()  # lengths up to the same power of two share an answer
    question = f"encode backend | {weights_key(body, 'top states')[:16]} | batch {ids.shape[0]}x<={length}"
    known = autotune.lookup(question)
    if known is not None and known["choice"] == "torch":  # measured before: no graph needed
        return None, "torch"
    try:
        onnx = cached_forward(body, quantize)
    except LmforgeError:  # no graph of this body runs on ONNX Runtime (ELMo): auto takes torch
        return None, "torch"
    top = TopStates(body)

    @torch.no_grad()
    def run_torch():
        with body.evaluating():
            top(torch.from_numpy(ids), torch.from_numpy(mask))

    choice = autotune.choose(question, {"torch": run_torch, "onnx": lambda: onnx(ids, mask)}, "torch", reps=3)
    return (onnx if choice == "onnx" else None), choice
