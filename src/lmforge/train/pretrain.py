"""The ``lmforge pretrain FAMILY`` driver: shards + the family + TrainConfig -> a model folder.

Everything family-specific comes from the family's :class:`lmforge.families.Family` object: its config
class, presets and training defaults, and how it is built from shards (``pretraining_setup``: model and
sampler) or trained in one pass (``run_pretraining``: word2vec's gensim).

Order of work: every config problem is found before any data is read, the tokenizer is checked
against the shards before any model is built, and ``train_config.json`` is written before the
first step so that a killed run can be resumed with the same settings.

The library takes config objects: ``pretrain("gpt", data, out, preset_config("gpt", "tiny"),
default_train_config("gpt", max_steps=2000))``. The command line's strings (``--set k=v``, run files, ``--init``,
``--resume``) become one resolved run in :mod:`lmforge.train.run_config`, which its
:func:`~lmforge.train.run_config.train_run` trains as given.
``train_config.json`` holds the training fields flat and the model config under ``model`` (the data recipe under
``data``), so ``--config MODEL_DIR/train_config.json`` repeats a run.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ..config import apply_overrides, from_dict, load_json, to_dict
from ..data.shards import Shards
from ..devices import Compute
from ..errors import CheckpointError, ConfigError, DataError, LmforgeError
from ..families import FAMILIES, get_family
from ..families.result import PretrainResult
from ..storage.cards import update_card
from ..storage.checks import read_weights
from ..storage.files import save_json
from ..tokenization import Tokenizer
from ..utils import seed_everything
from .checkpoint import STATE_DIR, find_state_dir
from .config import TrainConfig, format_duration
from .distributed import cleanup, init_distributed
from .precision import resolve_compute
from .trainer import Trainer

logger = logging.getLogger(__name__)

TRAIN_CONFIG_FILE = "train_config.json"


def preset_config(family: str, name: str | None = None, **fields: Any):
    """The config of ``family``'s preset ``name`` (default: the family's default preset) with ``fields`` set.

    Raises:
        ConfigError: an unknown preset, or a field the config does not have or refuses.
    """
    fam = get_family(family)
    choice = name if name is not None else fam.default_preset
    if choice is None:
        return apply_overrides(from_dict(fam.config_class, {}), fields)
    if choice not in fam.presets:
        raise ConfigError(f"unknown {family} preset '{choice}'; presets: {', '.join(fam.presets) or 'none'} "
                          f"(or give a config file: .toml, .json or .yaml)")
    return apply_overrides(from_dict(fam.config_class, dict(fam.presets[choice]), ignore=("model_type",)), fields)


def default_train_config(family: str, **fields: Any) -> TrainConfig:
    """The family's training defaults with ``fields`` set."""
    return apply_overrides(apply_overrides(TrainConfig(), get_family(family).train_defaults), fields)


def saved_train_config(out_dir: str | Path) -> TrainConfig | None:
    """The training settings a run in ``out_dir`` saved (no time budget: that belongs to one invocation)."""
    path = Path(out_dir) / TRAIN_CONFIG_FILE
    if not path.is_file():
        return None
    saved = load_json(path)
    saved["max_time"] = None
    return from_dict(TrainConfig, saved, ignore=("model", "data"))


def recipe_config(family: str, **fields: Any):
    """The family's pretraining-data recipe with ``fields`` set (None for a family without one)."""
    cls = get_family(family).recipe_class
    if cls is None:
        if fields:
            raise ConfigError(f"{family} has no pretraining-data recipe; {', '.join(sorted(fields))} are not its keys")
        return None
    return apply_overrides(cls(), fields)


def recipe_in(family: str, fields: dict):
    """The family's data recipe from the recipe keys among ``fields`` (a plan's or an old config.json's model
    fields); None for a family without one."""
    cls = get_family(family).recipe_class
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    return from_dict(cls, {k: v for k, v in fields.items() if k in names})


def saved_recipe(family: str, folder: str | Path):
    """The data recipe a run in ``folder`` trained with: ``data`` of its train_config.json, else the defaults
    (None: no recipe)."""
    cls = get_family(family).recipe_class
    if cls is None:
        return None
    path = Path(folder) / TRAIN_CONFIG_FILE
    saved = load_json(path) if path.is_file() else {}
    if isinstance(saved.get("data"), dict):
        return from_dict(cls, saved["data"])
    return cls()


def saved_model_config(family: str, out_dir: str | Path):
    """The model config saved in ``out_dir/config.json``."""
    return from_dict(get_family(family).config_class, load_json(Path(out_dir) / "config.json"), ignore=("model_type",))


def check_resumable(out: Path, family: str) -> None:
    """Refuse ``resume`` when ``out`` holds no training state of a Trainer family."""
    if get_family(family).trainer and find_state_dir(out) is None:
        raise CheckpointError(f"no {STATE_DIR}/ in {out} to resume from; run without --resume to start afresh")


def check_fresh_out(out: Path, family: str) -> None:
    """Refuse a new run into a file, or into a folder that already holds a model."""
    if out.exists() and not out.is_dir():
        raise LmforgeError(f"--out {out} is a file; give a folder for the model")
    if get_family(family).trainer and ((out / "config.json").exists() or find_state_dir(out) is not None):
        raise LmforgeError(
            f"{out} already holds a model; pass --resume to continue its training, --overwrite to replace it, or "
            f"choose another --out"
        )


def open_shards(data_dir: str | Path) -> Shards:
    """Open the token shards in ``data_dir`` (a DataError when they are missing or unreadable)."""
    return Shards.open(data_dir)


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path)
    if not (p / "tokenizer.json").is_file():
        raise DataError(f"no tokenizer.json in {p}; give the folder written by `lmforge tokenizer train`")
    return Tokenizer.load(p)


def check_tokenizer(shards, data_dir: str | Path, tokenizer, source: str) -> None:
    """Refuse shards made by another tokenizer, naming both hashes."""
    made_by = str(shards.tokenizer_hash)
    if str(tokenizer.hash) != made_by:
        raise DataError(
            f"shards in {data_dir} were made by tokenizer {made_by[:8]}, not {str(tokenizer.hash)[:8]} ({source}); "
            f"prepare the corpus again with that tokenizer, or use the one that made these shards"
        )


def check_init(init: str | Path, family: str, resume: bool, preset: str | None) -> Path:
    """The ``--init`` model folder, checked against the other options (one-line errors)."""
    if resume:
        raise LmforgeError(
            "--init starts a new run from a model folder and --resume continues the run in --out; give one of them"
        )
    if not get_family(family).trainer:
        trained = ", ".join(n for n, f in FAMILIES.items() if f.trainer)
        raise LmforgeError(f"--init continues the pretraining of {trained}; {family} trains in one pass")
    if preset is not None:
        raise LmforgeError("--init takes the model config from its folder; drop --config (use --set for e.g. dropout)")
    p = Path(init)
    if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
        raise CheckpointError(f"--init {p} is not a model folder (it needs config.json and model.safetensors)")
    mt = load_json(p / "config.json").get("model_type")
    if mt != family:
        raise CheckpointError(
            f"--init {p} holds a '{mt}' model; `lmforge pretrain {family}` continues a {family} model"
        )
    if not (p / "tokenizer.json").is_file():
        raise CheckpointError(f"--init {p} has no tokenizer.json; the shards must be made with the model's tokenizer")
    return p


def _model_config(family: str, out: Path, model, resume: bool, init_dir: Path | None):
    """The model config of a run: the given one, else the saved one (resume), the --init one, or a preset's."""
    if resume:
        check_resumable(out, family)
        if isinstance(model, str):
            logger.warning("--resume: ignoring the model config of --config %s; it comes from %s", model, out)
        return model if model is not None and not isinstance(model, str) else saved_model_config(family, out)
    check_fresh_out(out, family)
    if model is not None and not isinstance(model, str):
        return model
    if init_dir is not None:
        return get_family(family).model_class.config_from_folder(init_dir)
    return preset_config(family, model)


def _train_config(family: str, out: Path, train: TrainConfig | None, resume: bool) -> TrainConfig | None:
    """The training settings of a run: the given ones, else the saved ones (resume) or the family's defaults."""
    if not get_family(family).trainer:
        if train is not None:
            logger.warning("%s trains with gensim in one pass: the training settings are not used", family)
        return None
    if train is not None:
        return train
    return (saved_train_config(out) if resume else None) or default_train_config(family)


def _recipe(family: str, out: Path, recipe, resume: bool, init_dir: Path | None):
    """The data recipe of a run: the given one, else the saved one (resume, --init) or the family's defaults."""
    if recipe is not None or get_family(family).recipe_class is None:
        return recipe
    if resume:
        return saved_recipe(family, out)
    return saved_recipe(family, init_dir) if init_dir is not None else recipe_config(family)


def _open_checked(data_dir, tokenizer_dir, init_dir: Path | None, out: Path, resume: bool):
    """The shards and their tokenizer, checked against every tokenizer the run names."""
    shards = open_shards(data_dir)
    tokenizer = shards.tokenizer()
    if tokenizer_dir is not None:
        check_tokenizer(shards, data_dir, load_tokenizer(tokenizer_dir), f"the tokenizer in {tokenizer_dir}")
    if init_dir is not None:
        check_tokenizer(shards, data_dir, load_tokenizer(init_dir), f"the tokenizer of the model in {init_dir}")
    if resume and (out / "tokenizer.json").is_file():
        check_tokenizer(shards, data_dir, load_tokenizer(out), f"the tokenizer of the model in {out}")
    shards.check_tokenizer(tokenizer)
    return shards, tokenizer


def pretrain(
    family: str,
    data_dir: str | Path,
    out_dir: str | Path,
    model: Any = None,
    train: TrainConfig | None = None,
    recipe: Any = None,
    *,
    resume: bool = False,
    tokenizer_dir: str | Path | None = None,
    init: str | Path | None = None,
    progress: bool | None = None,
    compute: Compute | None = None,
) -> PretrainResult:
    """Pretrain a ``family`` model on the shards in ``data_dir`` and write the model folder ``out_dir``.

    Args:
        family: a key of :data:`lmforge.families.FAMILIES` (``bert``, ``gpt``, ``elmo``, ``electra``, ``word2vec``).
        data_dir: shards written by ``lmforge prepare``.
        out_dir: the model folder to write (config.json, model.safetensors, tokenizer, training_state/,
            train_config.json, metrics.jsonl, training_curves.png).
        model: the family's config object, or a preset name (default: the family's default preset; on
            resume the saved ``config.json``; with ``init`` that folder's config).
        train: the :class:`TrainConfig` (default: the family's training defaults; on resume the saved ones).
            Device, precision and a time budget (``max_time``) are its fields. Not used by word2vec.
        recipe: the pretraining-data recipe of a family that has one (BERT, ELECTRA:
            :class:`lmforge.families.bert.data.MaskedLMRecipe`; default: its defaults; on resume the saved one).
        resume: continue the run saved in ``out_dir/training_state``.
        tokenizer_dir: if given, the tokenizer the user expects; it must be the one that made the shards.
        init: continue pretraining from this model folder of the same family (domain-adaptive
            pretraining): its config and weights are the start, its tokenizer must have made the
            shards; the optimizer, schedule and step count start afresh (bert, gpt, elmo, electra).
        progress: show the progress bar (``None``: only on a terminal).
        compute: the device and precision already resolved (:func:`lmforge.train.precision.resolve_compute`);
            default: resolved from ``train``'s ``device`` and ``precision``.
    Returns:
        A :class:`PretrainResult` with the final validation metrics.
    """
    out = Path(out_dir)
    get_family(family)  # an unknown family is the first error
    init_dir = None
    if init is not None:
        init_dir = check_init(init, family, resume, model if isinstance(model, str) else None)
    model_config = _model_config(family, out, model, resume, init_dir)
    train_config = _train_config(family, out, train, resume)
    recipe = _recipe(family, out, recipe, resume, init_dir)
    return train_configs(family, data_dir, out, (model_config, train_config, recipe), compute, init_dir=init_dir,
                         resume=resume, tokenizer_dir=tokenizer_dir, progress=progress)


def train_configs(family: str, data_dir, out: Path, configs: tuple, compute: Compute | None, *, init_dir: Path | None,
         resume: bool, tokenizer_dir, progress: bool | None) -> PretrainResult:
    """Open and check the shards, then train (the Trainer) or run gensim (word2vec)."""
    model_config, train_config, recipe = configs
    module = get_family(family)
    shards, tokenizer = _open_checked(data_dir, tokenizer_dir, init_dir, out, resume)
    if train_config is None:
        seed_everything(getattr(model_config, "seed", 0))
        result = module.run_pretraining(shards, tokenizer, model_config, out)
        update_card(out, shards=data_dir)
        return result
    return _train(family, module, (model_config, recipe), train_config, shards, tokenizer, out, data_dir,
                  init_dir=init_dir, resume=resume, progress=progress, compute=compute)


def _train(family, module, configs: tuple, train_config: TrainConfig, shards, tokenizer, out: Path, data_dir,
           *, init_dir: Path | None, resume: bool, progress: bool | None, compute: Compute | None) -> PretrainResult:
    """Build the model, train it with the Trainer and write the folder (a Trainer family)."""
    model_config, recipe = configs
    compute = compute or resolve_compute(train_config.device, train_config.precision)
    env = init_distributed(compute.device)
    finished = False
    try:
        seed_everything(train_config.seed)
        model, sampler = module.pretraining_setup(model_config, shards, tokenizer, recipe)
        if init_dir is not None:
            model.load_weights(read_weights(init_dir / "model.safetensors"), where=init_dir / "model.safetensors")
            (logger.info if env.is_main else logger.debug)("starting from the weights of %s", init_dir)
        _log_start(family, model, train_config, env)
        trainer = Trainer(model, sampler, train_config, out, tokenizer=tokenizer, progress=progress, compute=compute)
        train_config = trainer.config  # the precision settled for the model
        if env.is_main:
            out.mkdir(parents=True, exist_ok=True)
            save_run_config(out, train_config, getattr(model, "config", model_config), family, recipe)
        result = trainer.train(resume=resume)
        finished = True
    finally:
        cleanup(env, wait=finished)
    if env.is_main:
        update_card(out, shards=data_dir)  # the model card (README.md) from the folder's facts and the shards
    logger.debug("final config: %s", to_dict(train_config))
    return PretrainResult(family=family, out_dir=out, val=result.val, step=result.step,
                          stop_reason=result.stop_reason, train_loss=result.train_loss,
                          tokens_seen=result.tokens_seen, elapsed=result.elapsed)


def _log_start(family: str, model, train_config: TrainConfig, env) -> None:
    n_params = sum(p.numel() for p in model.parameters())
    rows = train_config.batch_size * train_config.grad_accum * env.world_size
    (logger.info if env.is_main else logger.debug)(
        "pretraining %s: %.2fM parameters; %d rows/step (%d x accum %d x %d process%s); steps %d%s",
        family, n_params / 1e6, rows, train_config.batch_size, train_config.grad_accum, env.world_size,
        "" if env.world_size == 1 else "es", train_config.max_steps,
        f", time budget {format_duration(train_config.max_time)}" if train_config.max_time else "",
    )


def save_run_config(out: Path, train_config: TrainConfig, model_config, family: str, recipe=None) -> None:
    """Write ``train_config.json``: the training fields flat (what ``--resume`` reads), the model config under
    ``model`` and the data recipe under ``data``, so the file given back as ``--config`` repeats the run
    (config.json comes with each checkpoint)."""
    model = {"model_type": family, **to_dict(model_config)} if dataclasses.is_dataclass(model_config) else None
    extra = {**({"model": model} if model else {}), **({"data": to_dict(recipe)} if recipe is not None else {})}
    save_json({**to_dict(train_config), **extra}, out / TRAIN_CONFIG_FILE)


def evaluate_lm(
    model_dir: str | Path,
    data_dir: str | Path,
    split: str = "val",
    batches: int = 50,
    batch_size: int = 16,
    model_fields: dict[str, Any] | None = None,
    recipe_fields: dict[str, Any] | None = None,
    seed: int = 0,
    device: str = "auto",
) -> dict[str, float]:
    """The pretraining loss of a model folder on other shards: how well it models new text.

    The family's own sampler and objective (GPT next-token, ELMo both directions, BERT MLM (+ NSP)) over
    ``batches`` seeded batches of ``batch_size`` rows of ``split``, as the Trainer's validation does: with
    the batch size, ``eval_batches`` and seed of a pretraining run, on its shards, it gives that run's
    final validation metrics.

    Args:
        model_dir: a bert, gpt or elmo model folder; its tokenizer must have made the shards.
        data_dir: shards written by ``lmforge prepare`` (with the model's tokenizer).
        split: ``val`` or ``train`` (prepare with ``--val-fraction 0`` to score a whole corpus as train).
        model_fields: model-config fields of the sampler, e.g. ``{"next_sentence": False}``.
        recipe_fields: data-recipe fields (BERT, ELECTRA), e.g. ``{"max_seq_length": 64}``.
    Returns:
        ``{"loss", "ppl", ...family metrics}`` as floats.
    """
    p = Path(model_dir)
    if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
        raise CheckpointError(f"{p} is not a model folder (it needs config.json and model.safetensors)")
    family = load_json(p / "config.json").get("model_type")
    if family not in FAMILIES:
        scored = ", ".join(n for n, f in FAMILIES.items() if f.trainer)
        raise CheckpointError(f"{p} holds a '{family}' model; evaluate lm reads {scored} folders")
    module = get_family(family)
    if not get_family(family).trainer:
        raise LmforgeError(f"{family} has no language-model loss to score text with; use `lmforge evaluate wic`")
    if split not in ("val", "train"):
        raise LmforgeError(f"split must be 'val' or 'train', not {split!r}")
    if batches < 1 or batch_size < 1:
        raise LmforgeError(f"--batches and --batch-size must be >= 1, got {batches} and {batch_size}")
    model_config = apply_overrides(get_family(family).model_class.config_from_folder(p), dict(model_fields or {}))
    shards = open_shards(data_dir)
    check_tokenizer(shards, data_dir, load_tokenizer(p), f"the tokenizer of the model in {p}")
    recipe = saved_recipe(family, p)
    if recipe is not None and recipe_fields:
        recipe = apply_overrides(recipe, dict(recipe_fields))
    model, sampler = module.pretraining_setup(model_config, shards, shards.tokenizer(), recipe)
    model.load_weights(read_weights(p / "model.safetensors"), where=p / "model.safetensors")
    config = TrainConfig(batch_size=batch_size, eval_batches=batches, seed=seed, device=device)
    trainer = Trainer(model, sampler, config, p, progress=False, plot=False)
    finished = False
    try:
        metrics = trainer.evaluate(split)
        finished = True
        return metrics
    finally:
        cleanup(trainer.env, wait=finished)


def run_configs(family: str, preset: str | None = None, **fields: Any) -> tuple[Any, TrainConfig | None, Any]:
    """``(model config, training config, data recipe)`` of ``preset``, the family's training defaults and its
    recipe, each of ``fields`` set on the config that has it (model, then recipe, then training); the training
    config is None for word2vec, the recipe None for a family without one.

    ``pretrain("gpt", data, out, *run_configs("gpt", "tiny", n_layer=2, max_steps=100))``
    """
    fam = get_family(family)
    model_keys = {f.name for f in dataclasses.fields(fam.config_class)}
    recipe_keys = {f.name for f in dataclasses.fields(fam.recipe_class)} if fam.recipe_class else set()
    model = preset_config(family, preset, **{k: v for k, v in fields.items() if k in model_keys})
    recipe = recipe_config(family, **{k: v for k, v in fields.items() if k in recipe_keys - model_keys})
    train_fields = {k: v for k, v in fields.items() if k not in model_keys | recipe_keys}
    if not fam.trainer:
        if train_fields:
            raise ConfigError(f"{family} trains in one gensim pass; {', '.join(sorted(train_fields))} "
                              f"are not its keys")
        return model, None, recipe
    return model, default_train_config(family, **train_fields), recipe
