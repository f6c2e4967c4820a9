"""The three transfer modes as objects: :class:`Frozen`, :class:`Features` and :class:`Finetune`.

A mode's name (``frozen``, ``features``, ``finetune``) is text only where it is read: the CLI's ``--mode``, a run
file, a run folder's ``config.json``.  :func:`mode_of` turns it into the mode object once; from there on the run
asks the object what the mode means:

- what trains: whether the body trains with the head (:attr:`Mode.trains_body`), which parameters of the body
  are frozen (:meth:`Mode.freeze`: finetune's ``freeze_layers`` keeps the lower layers fixed), whether GPT's
  task-token rows train (:meth:`Mode.trains_task_rows`) and whether one body pass can serve a whole fit
  (:meth:`Mode.body_stays_fixed`);
- its parameter groups (:meth:`Mode.body_groups`: finetune's layer-wise learning rates);
- its defaults and rules: the recipe (lr, epochs, warm-up, patience), the head's default classifier, the read-out
  of a fixed body, and which options it takes (:meth:`Mode.check`);
- what it stores: the vectors a fit and a prediction read (:meth:`Mode.fit_vectors`, :meth:`Mode.predict_vectors`:
  features mode's cached body pass), the files of a run folder besides the head (:meth:`Mode.trained_tensors`,
  :meth:`Mode.restore`) and whether the run still reads the model folder's own weights;
- how it exports: whether the run is one ONNX graph (:meth:`Mode.check_onnx`), and what a learning curve shares
  between its runs (:meth:`Mode.shared_vectors`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import LmforgeError
from ..storage.files import load_safetensors

#: the mode of a run that names none
DEFAULT_MODE = "finetune"


class Mode:
    """What one transfer mode trains, reads, stores and exports (see the module docstring)."""

    name: str
    #: body and head train together
    trains_body = False
    #: the head reads stored vectors of one body pass (cached), not the body
    reads_stored = False
    #: the head's classifier when none is given
    default_classifier = "linear"
    #: (lr, epochs, warm-up, layer-wise lr decay, patience) of a run that sets none of them
    recipe: tuple[float, int, float, float | None, int]
    #: a frozen body's vectors are standardised over the training data from a body pass of its own
    standardizes_body_pass = False

    def __repr__(self) -> str:
        return f"<transfer mode {self.name}>"

    # -- rules ------------------------------------------------------------------------------------------------
    def serves(self, supported: tuple[str, ...], cfg) -> bool:
        """Whether a family whose bodies support the modes ``supported`` can run ``cfg`` in this mode."""
        return self.name in supported

    def check(self, cfg, aux_lm: bool) -> None:
        """Refuse, in one line, options this mode does not take (``aux_lm``: the family fine-tunes with GPT-1's
        auxiliary LM loss)."""
        if cfg.from_scratch:
            raise LmforgeError("--from-scratch trains the whole randomly initialised body: use it with --mode finetune")
        if cfg.freeze_layers is not None or cfg.layer_lr_decay is not None:
            raise LmforgeError("--freeze-layers and --layer-lr-decay apply to --mode finetune only")
        if cfg.lm_weight:
            raise LmforgeError("--lm-weight (GPT-1's auxiliary LM loss) applies to GPT in --mode finetune only")

    def layer_decay(self, cfg, default: float | None) -> float | None:
        """The layer-wise lr decay the run uses (None: every layer at the same rate)."""
        return None

    # -- what trains ------------------------------------------------------------------------------------------
    def trains_task_rows(self, cfg) -> bool:
        """Whether GPT's added task-token rows train while the rest of the embeddings stay fixed."""
        return False

    def body_stays_fixed(self, needs_grad: bool, lm_weight: float) -> bool:
        """Whether the eval-mode body gives every example the same vectors in every epoch (one pass serves a fit)."""
        return False

    def freeze(self, body, cfg, family: str | None) -> None:
        """Set ``requires_grad`` on the body's parameters as this mode says."""
        for p in body.parameters():
            p.requires_grad_(self.trains_body)

    def body_groups(self, add: Callable, body, lr: float, decay: float | None) -> None:
        """Add the body's AdamW parameter groups with ``add(name, params, lr)`` (none where the body is fixed)."""

    # -- what it stores ---------------------------------------------------------------------------------------
    def fit_vectors(self, run, train, store):
        """The stored vectors a fit of ``run`` on ``train`` reads (None: the body runs in every step)."""
        return None

    def predict_vectors(self, run, data, encs, use_cache: bool, store):
        """The stored vectors a prediction of ``run`` reads, narrowed to the head's layers (None: the body runs)."""
        return run.vectors.head_store(store) if store is not None else None

    def trained_tensors(self, run) -> dict:
        """file name -> the tensors of the run folder besides the head (what training changed in the body)."""
        if run.trains_task_rows:
            return {"task_tokens.safetensors": {"task_rows": run.net.wte()[list(run.task_token_ids)].detach().cpu()}}
        return {}

    def restore(self, run, folder, read: Callable) -> None:
        """Put back into ``run``'s body what :meth:`trained_tensors` stored in ``folder`` (``read``: a weights
        file's tensors, refused when they hold NaN or infinity)."""
        path = folder / "task_tokens.safetensors"
        if path.is_file():
            rows = load_safetensors(path)["task_rows"]
            with torch.no_grad():
                run.body.wte.weight[list(run.task_token_ids)] = rows

    @property
    def reads_model_weights(self) -> bool:
        """Whether a finished run reads the model folder's own weights (which then must not have changed)."""
        return not self.trains_body

    # -- how it exports ---------------------------------------------------------------------------------------
    def check_onnx(self) -> None:
        """Refuse, in one line, an ONNX Runtime forward of a run in this mode (one that has no single graph)."""

    @property
    def exports_onnx(self) -> bool:
        try:
            self.check_onnx()
        except LmforgeError:
            return False
        return True

    def shared_vectors(self, make_run: Callable, pool, test) -> dict:
        """What every run of a learning curve in this mode shares (``make_run``: a run of the curve):
        ``pool`` / ``test`` stored vectors, or nothing."""
        return {}

    @property
    def changes_body(self) -> bool:
        """Whether a fit may change the body (a learning curve gives each such run its own copy)."""
        return True


class Frozen(Mode):
    """The body stays fixed (eval mode); the head (and ELMo's ScalarMix, GPT's task-token rows) trains."""

    name = "frozen"
    recipe = (3e-3, 60, 0.05, None, 5)
    standardizes_body_pass = True

    def trains_task_rows(self, cfg) -> bool:
        return True

    def body_stays_fixed(self, needs_grad: bool, lm_weight: float) -> bool:
        return not needs_grad and lm_weight == 0

    def fit_vectors(self, run, train, store):
        return run.kept_vectors(train) if run.body_stays_fixed else None

    def shared_vectors(self, make_run: Callable, pool, test) -> dict:
        run = make_run()  # every run scores the same test set with the same fixed body: one pass
        return {"test": run.features(test, use_cache=False)} if run.body_stays_fixed else {}


class Features(Mode):
    """One body pass per split, cached; the head (scikit-learn's logistic regression by default) fits the
    stored vectors."""

    name = "features"
    reads_stored = True
    default_classifier = "logreg"
    recipe = (1e-2, 100, 0.05, None, 8)

    def fit_vectors(self, run, train, store):
        return store if store is not None else run.features(train)

    def predict_vectors(self, run, data, encs, use_cache: bool, store):
        return run.vectors.head_store(store if store is not None else run.features(data, encs, use_cache))

    def check_onnx(self) -> None:
        raise LmforgeError("a features-mode run's head reads stored vectors; --backend onnx needs a frozen or "
                           "finetune run")

    def shared_vectors(self, make_run: Callable, pool, test) -> dict:
        run = make_run()  # the body runs once over the whole pool and the test set; subsets select rows
        return {"pool": run.features(pool), "test": run.features(test)}

    @property
    def changes_body(self) -> bool:
        return False


class Finetune(Mode):
    """Body and head train together; ``freeze_layers`` keeps the lowest layers fixed, ``layer_lr_decay`` lowers
    the learning rate layer by layer going down; ``from_scratch`` re-initialises the body first."""

    name = "finetune"
    trains_body = True
    recipe = (1e-4, 20, 0.1, 0.9, 3)

    def serves(self, supported: tuple[str, ...], cfg) -> bool:
        return self.name in supported or cfg.from_scratch  # a baseline from a random init fine-tunes any body

    def check(self, cfg, aux_lm: bool) -> None:
        if cfg.lm_weight and not aux_lm:
            raise LmforgeError("--lm-weight (GPT-1's auxiliary LM loss) applies to GPT in --mode finetune only")

    def layer_decay(self, cfg, default: float | None) -> float | None:
        if cfg.layer_lr_decay is not None:
            return None if cfg.layer_lr_decay == 1 else cfg.layer_lr_decay
        return default

    def trains_task_rows(self, cfg) -> bool:
        return cfg.freeze_layers is not None  # the embeddings are frozen, the task tokens' rows are new

    def freeze(self, body, cfg, family: str | None) -> None:
        super().freeze(body, cfg, family)
        if cfg.freeze_layers is None:
            return
        parts = list(body.transfer_layers())
        if cfg.freeze_layers >= len(parts) - 1:
            raise LmforgeError(
                f"--freeze-layers {cfg.freeze_layers} is too large: this {family} body has the embeddings "
                f"and {len(parts) - 1} layers, so K can be 0..{len(parts) - 2}"
            )
        for part in parts[: cfg.freeze_layers + 1]:
            for p in part.parameters():
                p.requires_grad_(False)

    def body_groups(self, add: Callable, body, lr: float, decay: float | None) -> None:
        parts = list(body.transfer_layers())
        n = len(parts)
        for i in reversed(range(n)):  # top first, so a module shared with a lower part trains at the top rate
            add(f"body.{i}", parts[i].parameters(), lr * (decay or 1.0) ** (n - 1 - i))
        add("body.rest", body.parameters(), lr)  # e.g. an LM output layer outside the layer list

    def trained_tensors(self, run) -> dict:
        body = run.body
        tied = set(body.tied_weight_keys()) if hasattr(body, "tied_weight_keys") else set()
        return {"body.safetensors": {k: v.cpu() for k, v in body.state_dict().items() if k not in tied}}

    def restore(self, run, folder, read: Callable) -> None:
        run.body.load_weights(read(folder / "body.safetensors"))


FROZEN, FEATURES, FINETUNE = Frozen(), Features(), Finetune()
#: name -> mode, in the order the CLI lists them
MODE_OBJECTS: dict[str, Mode] = {m.name: m for m in (FROZEN, FEATURES, FINETUNE)}
#: the modes' names (what ``--mode`` and a run file's ``mode`` take)
MODES: tuple[str, ...] = tuple(MODE_OBJECTS)


def mode_of(name: str | Mode) -> Mode:
    """The mode object of a mode's name (a mode object is returned as it is).

    Raises:
        LmforgeError: ``name`` is no mode (the message lists them).
    """
    if isinstance(name, Mode):
        return name
    mode = MODE_OBJECTS.get(name)
    if mode is None:
        raise LmforgeError(f"mode must be one of {', '.join(MODES)}, got {name!r}")
    return mode
