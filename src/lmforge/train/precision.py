"""Where a run computes and in which precision: ``--device`` and ``--precision``, resolved once.

Every training command (pretrain, finetune, benchmark curve, demo) takes the same two settings:

- ``device``: ``auto`` (CUDA when torch sees a GPU, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
- ``precision``: ``auto``, ``fp32``, ``bf16`` or ``fp16``.  ``bf16`` and ``fp16`` run the forward pass and
  the loss under autocast; weights and optimizer state stay fp32.  ``fp16`` needs a GPU and a gradient
  scaler (:func:`grad_scaler`); on a CPU it is refused.

``auto`` is chosen by measurement where the answer depends on the model:

- a CUDA GPU that supports bf16: bf16;
- a CPU without native bf16 (no ``avx512_bf16`` or ``amx_bf16`` flag): fp32 (emulated bf16 runs far below it);
- a CPU with native bf16: fp32 for a narrow model (typical matmul width below :data:`MIN_BF16_WIDTH`,
  where autocast's casts cost more than the bf16 matmuls save); otherwise a few training steps of
  both, timed on the run's own model and batch (:mod:`lmforge.nn.autotune`, cached per CPU model, torch
  version, threads and model shape), and bf16 only where it is at least :data:`BF16_MARGIN` times faster.
  Without a step to time (a transfer run), a measurement cached for the same shape, else bf16.

:func:`resolve_compute` turns the two names into one :class:`lmforge.devices.Compute`, once per command; where
``auto`` waits for the model it is finished by :func:`settle` where the model first exists, and every part reads the
object from then on. :func:`choose_precision` returns the choice with its reason; :func:`resolve_precision` just the
name. Every caller that has a model passes it: the Trainer (its model and first micro-batch), the budget planner
(the shape it probes, built and batched as the run will be: :func:`lmforge.train.budget_probe.shape_precision`),
transfer runs and ``benchmark curve`` (their body). The run saves and reports the concrete choice, so a saved config
or plan repeats the same arithmetic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..devices import Compute, check_device, check_precision
from ..errors import ConfigError
from ..nn import autotune, cpu_features

# CPU flags (Linux /proc/cpuinfo) that mean native bf16 arithmetic
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO_PATH = "/proc/cpuinfo"
# Below this typical matmul width bf16 autocast loses to fp32 on a CPU, native bf16 or not: the casts of
# weights and activations cost more than the narrow matmuls save (measurements in docs/training.md).
MIN_BF16_WIDTH = 64
# bf16 is chosen where its measured step is at least this much faster: a near tie keeps fp32's precision.
BF16_MARGIN = 1.1


def resolve_device(name: str) -> torch.device:
    """The torch device of a ``--device`` value (``auto``: CUDA when available, else the CPU; ``cuda`` under
    torchrun: ``cuda:LOCAL_RANK``, each process its own GPU).

    Raises:
        ConfigError: a malformed name, or a CUDA device that torch does not see.
    """
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: torch sees no CUDA GPU here; use --device cpu (or auto)")
        index = int(name.split(":")[1]) if ":" in name else _default_cuda_index()
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA GPU(s) here (cuda:0 ...)")
        return torch.device("cuda", index)
    return torch.device(name)


def _default_cuda_index() -> int:
    """The GPU of plain ``cuda``: under torchrun this process's LOCAL_RANK, else torch's current device."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    return torch.cuda.current_device()


@functools.lru_cache(maxsize=4)
def _cpuinfo_flags(path: str) -> frozenset[str] | None:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: the ``avx512_bf16`` or ``amx_bf16`` flag in /proc/cpuinfo
    (torch's own CPU probe where there is no /proc/cpuinfo); never under ``LMFORGE_CPU_FEATURES=avx2``
    (:mod:`lmforge.nn.cpu_features`)."""
    if cpu_features.forced_avx2():
        return False
    flags = _cpuinfo_flags(CPUINFO_PATH)
    if flags is not None:
        return any(f in flags for f in BF16_CPU_FLAGS)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (see :func:`cpu_native_bf16`; CUDA: ``is_bf16_supported``)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return cpu_native_bf16()
    return False


def needs_model(precision: str, device: torch.device) -> bool:
    """Whether :func:`choose_precision` needs the model (and a step to time) to resolve ``precision`` on ``device``:
    ``auto`` on a CPU with native bf16, where the width rule and the measurement decide; elsewhere the device does."""
    return precision == "auto" and device.type == "cpu" and native_bf16(device)


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """A resolved precision and why.

    Attributes:
        precision: ``fp32``, ``bf16`` or ``fp16``.
        reason: why ``auto`` chose it (empty when the precision was asked for).
        speedup: fp32's step time over bf16's where measured (above 1: bf16 is faster), else ``None``.
    """

    precision: str
    reason: str = ""
    speedup: float | None = None

    def summary(self, requested: str) -> str:
        """The choice in one line, as a budget plan records it: ``auto: fp32, the model's width 32 is below 64 ...``,
        ``auto: bf16, measured on this CPU: bf16 1.40x fp32's speed ...`` or ``fp32, asked for``."""
        if requested != "auto":
            return f"{self.precision}, asked for"
        return f"auto: {self.precision}, {self.reason}" if self.reason else f"auto: {self.precision}"


def model_width(model: nn.Module) -> int:
    """The typical matmul width of ``model``: the median of the smaller side of its 2-D weights outside
    embeddings (128 for a BERT or GPT of hidden size 128, the LSTM width for ELMo)."""
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    sides = [min(p.shape) for p in model.parameters() if p.ndim == 2 and id(p) not in embedding_weights]
    return int(statistics.median(sides)) if sides else 0


def shape_question(model: nn.Module, tokens: int | None = None) -> str:
    """The cache key of ``auto``'s measurement for ``model``: family, width, parameter count and tokens per
    micro-batch, the last two rounded to powers of two so one measurement serves nearby shapes."""
    family = getattr(model, "model_type", None) or type(model).__name__
    n_params = sum(p.numel() for p in model.parameters())
    bucket = f":n{1 << max(tokens, 1).bit_length() - 1}" if tokens else ""
    return f"precision:{family}:w{model_width(model)}:p{1 << max(n_params, 1).bit_length() - 1}{bucket}"


def choose_precision(
    precision: str,
    device: torch.device,
    model: nn.Module | None = None,
    step: Callable[[str], Callable[[], object]] | None = None,
    tokens: int | None = None,
) -> PrecisionChoice:
    """The concrete precision of ``precision`` on ``device`` for ``model``, and why (see the module docstring).

    Args:
        precision: ``auto``, ``fp32``, ``bf16`` or ``fp16``.
        device: where the run computes.
        model: the model to train; without it ``auto`` follows the device alone.
        step: ``step("fp32" | "bf16")`` gives a function running one training step of ``model`` in that
            precision (forward and backward on a real batch, no optimizer step); ``auto`` times both.
        tokens: tokens per micro-batch of ``step`` (part of the cache key).
    Raises:
        ConfigError: an unknown name, or ``fp16`` on a CPU (no gradient scaler there; use bf16).
    """
    _check_on(precision, device)
    if precision != "auto":
        return PrecisionChoice(precision)
    where = "this CPU" if device.type == "cpu" else f"{device}"
    if device.type == "cuda":
        ok = native_bf16(device)
        return PrecisionChoice("bf16" if ok else "fp32", f"{where} {'computes' if ok else 'has no'} native bf16")
    if not native_bf16(device):
        return PrecisionChoice("fp32", f"{where} has no native bf16")
    if model is None:
        return PrecisionChoice("bf16", f"{where} computes bf16 natively")
    width = model_width(model)
    if width < MIN_BF16_WIDTH:
        return PrecisionChoice("fp32", f"the model's width {width} is below {MIN_BF16_WIDTH}, where bf16 autocast "
                                       f"runs slower than fp32 on a CPU")
    question = shape_question(model, tokens)
    entry = autotune.lookup(question)
    if entry is None and tokens is None:  # no batch to size the key (a transfer run): any batch size measured
        found = autotune.lookup_prefix(question + ":n")
        entry = found[max(found, key=lambda q: int(q.rsplit(":n", 1)[1]))] if found else None
    if entry is None and step is not None:
        candidates = {name: step(name) for name in ("fp32", "bf16")}
        autotune.choose(question, candidates, default="fp32", margin=BF16_MARGIN, reps=2, warmup=1)
        entry = autotune.lookup(question)
    if entry is None or entry.get("choice") not in ("fp32", "bf16"):
        return PrecisionChoice("bf16", f"{where} computes bf16 natively (not measured for this model shape)")
    seconds = entry.get("seconds") or {}
    speedup = seconds["fp32"] / seconds["bf16"] if seconds.get("fp32") and seconds.get("bf16") else None
    measured = f"measured on {where}: bf16 {speedup:.2f}x fp32's speed" if speedup else f"measured on {where}"
    return PrecisionChoice(entry["choice"], f"{measured} for this model", speedup)


def _check_on(precision: str, device: torch.device) -> None:
    """A one-line ConfigError for an unknown precision, or fp16 off a CUDA GPU (no gradient scaler there)."""
    check_precision(precision)
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs a CUDA GPU; on a CPU use --precision bf16 (fast where the CPU "
                          "computes bf16 natively) or fp32")


def resolve_precision(
    precision: str,
    device: torch.device,
    model: nn.Module | None = None,
    step: Callable[[str], Callable[[], object]] | None = None,
    tokens: int | None = None,
) -> str:
    """The concrete precision (``fp32``, ``bf16`` or ``fp16``) of :func:`choose_precision`.

    Raises:
        ConfigError: an unknown name, or ``fp16`` on a CPU (no gradient scaler there; use bf16).
    """
    return choose_precision(precision, device, model, step, tokens).precision


def resolve_compute(
    device: str | torch.device,
    precision: str,
    model: nn.Module | None = None,
    step: Callable[[str], Callable[[], object]] | None = None,
    tokens: int | None = None,
) -> Compute:
    """``--device`` and ``--precision`` as one :class:`Compute`, resolved once for a command.

    Without a model, ``auto`` on a CPU with native bf16 (where the model decides, :func:`needs_model`) stays
    ``pending``: :func:`settle` finishes it where the model first exists.  Every other choice is final here.

    Raises:
        ConfigError: a malformed or unseen device, an unknown precision, or ``fp16`` off a CUDA GPU.
    """
    where = device if isinstance(device, torch.device) else resolve_device(device)
    check_precision(precision)
    if model is None and needs_model(precision, where):
        return Compute(where, precision, "auto", pending=True)
    return _with_choice(Compute(where, precision, precision), choose_precision(precision, where, model, step, tokens))


def settle(
    compute: Compute,
    model: nn.Module,
    step: Callable[[str], Callable[[], object]] | None = None,
    tokens: int | None = None,
) -> Compute:
    """``compute`` with a pending ``auto`` chosen for ``model`` (see :func:`choose_precision`); else ``compute``."""
    if not compute.pending:
        return compute
    return _with_choice(compute, choose_precision(compute.requested, compute.device, model, step, tokens))


def _with_choice(compute: Compute, choice: PrecisionChoice) -> Compute:
    return dataclasses.replace(compute, precision=choice.precision, reason=choice.reason, speedup=choice.speedup,
                               pending=False)


def fixed_precision(compute: Compute, precision: str) -> Compute:
    """``compute``'s device computing in a concrete ``precision`` a plan recorded, as if asked for (a replay
    repeats the arithmetic without choosing again)."""
    if precision == "auto":  # a plan edited by hand: chosen afresh on the run's model
        return resolve_compute(compute.device, precision)
    _check_on(precision, compute.device)
    return Compute(compute.device, precision, precision)


def choice_of(compute: Compute) -> PrecisionChoice:
    """The :class:`PrecisionChoice` a settled ``compute`` holds (what a budget plan records)."""
    return PrecisionChoice(compute.precision, compute.reason, compute.speedup)


def describe(requested: str, resolved: str, device: torch.device, reason: str = "") -> str:
    """One line for the start of a run, e.g. ``precision bf16 (auto: measured on this CPU: ...; ...)``."""
    where = "this CPU" if device.type == "cpu" else f"{device}"
    if requested == "auto":
        if not reason and resolved == "bf16":
            reason = f"{where} computes bf16 natively"
        elif not reason:
            reason = f"chosen for this model on {where}" if native_bf16(device) else f"{where} has no native bf16"
        force = "--precision fp32 forces fp32" if resolved == "bf16" else "--precision bf16 forces bf16"
        return f"precision {resolved} (auto: {reason}; {force}) on {device}"
    note = f"; {slow_bf16_note(device)}" if resolved == "bf16" and not native_bf16(device) else ""
    return f"precision {resolved} (asked for) on {device}{note}"


def slow_bf16_note(device: torch.device) -> str:
    """Why bf16 asked for on ``device`` without native bf16 pays nothing: its matmuls run on PyTorch's own
    (emulated) bf16 kernels, slower than fp32's."""
    where = "this CPU" if device.type == "cpu" else f"{device}"
    return f"{where} has no native bf16: bf16 runs on PyTorch's emulated kernels, slower than --precision fp32"


def inference_precision(precision: str, device: torch.device, model: nn.Module) -> str:
    """The concrete precision a trained ``model`` runs in on ``device`` (see :func:`for_inference`)."""
    return for_inference(resolve_compute(device, precision), model).precision


def for_inference(compute: Compute, model: nn.Module) -> Compute:
    """``compute`` settled for a trained ``model`` that only runs (``encode``, ``generate``, ``serve``).

    ``fp16`` off a CUDA GPU was refused when ``compute`` was resolved, as everywhere; ``auto`` follows
    :func:`choose_precision` for the model and logs what it chose and why, as a training run does; ``bf16``
    on a device without native bf16 runs (PyTorch's own kernels) and says once that fp32 is faster there.
    """
    settled = settle(compute, model)
    if compute.requested == "auto":
        logging.getLogger("lmforge").info("%s", describe("auto", settled.precision, settled.device, settled.reason))
    warn_if_emulated(settled.precision, settled.device)
    return settled


def warn_if_emulated(precision: str, device: torch.device) -> None:
    """Where a resolved ``precision`` is bf16 on a device without native bf16: say once per process that fp32
    is faster there (the run itself is right: PyTorch's own kernels compute it)."""
    if precision == "bf16" and not native_bf16(device):
        _warn_once(slow_bf16_note(device))


@functools.lru_cache(maxsize=8)
def _warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time only (``serve`` opens several models, one process)."""
    logging.getLogger("lmforge").warning("%s", message)


def autocast(device: torch.device, precision: str):
    """The autocast context of a resolved ``precision`` (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 on CUDA (small gradients underflow in fp16 without one); else ``None``."""
    if precision == "fp16" and device.type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None
