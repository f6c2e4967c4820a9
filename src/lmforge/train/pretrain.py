"""The ``lmforge pretrain FAMILY`` driver: shards + family hooks + TrainConfig -> a model folder.

Which families exist, and their config classes, presets and training defaults, come from the
registry (:data:`lmforge.models.FAMILIES`); how each is built from shards (model and sampler), or
trained by gensim (word2vec), from :mod:`lmforge.train.families`.

Order of work: every config problem is found before any data is read, the tokenizer is checked
against the shards before any model is built, and ``train_config.json`` is written before the
first step so that a killed run can be resumed with the same settings.

A run file (``--config run.toml``, ``.json`` or ``.yaml``) holds a whole run: model fields under
``[model]``, training fields under ``[train]``, or both as flat keys (each goes to the config that has
it; a key of both is a model key), and optionally ``preset = "tiny"`` as the base of the model fields.
``train_config.json`` is such a file (the training fields flat, the model config under ``model``), so
``--config MODEL_DIR/train_config.json`` repeats a run.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from pathlib import Path

from ..cards import update_card
from ..config import (
    _field_types,
    apply_overrides,
    from_dict,
    load_config_file,
    load_json,
    parse_overrides,
    save_json,
    synonyms_in,
    to_dict,
)
from ..data.shards import Shards
from ..errors import CheckpointError, ConfigError, DataError, LmforgeError
from ..models import FAMILIES, get_family
from ..tokenization import Tokenizer
from ..utils import load_safetensors, seed_everything
from .checkpoint import STATE_DIR, find_state_dir
from .config import TrainConfig, format_duration, parse_duration
from .distributed import cleanup, init_distributed
from .families import PretrainHooks, pretrain_hooks
from .precision import upgrade_legacy_keys
from .result import PretrainResult
from .trainer import Trainer

logger = logging.getLogger(__name__)

TRAIN_CONFIG_FILE = "train_config.json"


def family_module(family: str) -> PretrainHooks:
    """The family's pretraining hooks (presets, defaults, setup or gensim run); unknown -> ConfigError."""
    return pretrain_hooks(family)


def family_config_class(family: str, module=None) -> type:
    """The family's config dataclass, from the registry (``module`` is not used)."""
    return get_family(family).config_class


def is_config_file(choice: str | dict | None) -> bool:
    """Whether ``--config`` names a file (a path or a config suffix) rather than a preset."""
    if choice is None or isinstance(choice, dict):
        return False
    path = Path(choice)
    return (path.suffix.lower() in (".json", ".toml", ".yaml", ".yml") or path.exists()
            or any(sep in choice for sep in "/\\"))


def read_run_file(family: str, path: str | Path) -> tuple[str | None, dict, dict]:
    """``(preset, model fields, training fields)`` of a run file (see the module docstring).

    Raises:
        ConfigError: an unreadable file, another family's config, or a key of neither config.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"--config {p} is a directory; give a preset name or a config file (.toml, .json, .yaml)")
    data = dict(load_config_file(p))
    fam = get_family(family)
    model = data.pop("model", {})
    train = data.pop("train", {})
    if not isinstance(model, dict) or not isinstance(train, dict):
        raise ConfigError(f"{p}: 'model' and 'train' must be tables of settings")
    model, train = dict(model), dict(train)
    for where in (data, model):
        mt = where.pop("model_type", None) or (where.pop("family", None) if where is data else None)
        if mt is not None and mt != family:
            raise ConfigError(f"{p} is a '{mt}' config, not a '{family}' one")
    preset = data.pop("preset", None)
    if preset is not None and preset not in fam.presets:
        raise ConfigError(f"{p}: unknown {family} preset '{preset}'; presets: {', '.join(fam.presets)}")
    model_fields = set(_field_types(fam.config_class))
    train_fields = set(_field_types(TrainConfig)) if fam.trainer else set()
    for k, v in data.items():
        if k in model_fields:
            model[k] = v
        elif k in train_fields:
            train[k] = v
        else:
            raise _unknown_override(k, fam.config_class, sorted(train_fields), file=str(p))
    if train and not fam.trainer:
        raise ConfigError(f"{p}: {family} trains in one gensim pass; its settings are model keys, not [train]")
    return preset, model, upgrade_legacy_keys(train)


def build_model_config(family: str, module, preset_or_file: str | dict | None):
    """The family config from a preset name or a config file (unknown keys -> ConfigError); ``module`` is not used.

    A file's model fields start from its ``preset`` when it names one, else from the config class's
    defaults (a complete ``config.json``); a file without model fields gives the family's default preset.
    """
    fam = get_family(family)
    cls = fam.config_class
    presets = fam.presets
    choice = preset_or_file if preset_or_file is not None else fam.default_preset
    if choice is None:
        return from_dict(cls, {})
    if isinstance(choice, dict):  # the fields themselves (a budget plan's model)
        return from_dict(cls, choice, ignore=("model_type",))
    if choice in presets and not Path(choice).is_file():
        return from_dict(cls, dict(presets[choice]), ignore=("model_type",))
    if is_config_file(choice):
        preset, model, _ = read_run_file(family, choice)
        if preset is None and not model:
            preset = fam.default_preset
        base = dict(presets[preset]) if preset is not None else {}
        base.pop("model_type", None)
        return from_dict(cls, {**base, **model})
    raise ConfigError(
        f"unknown {family} preset '{choice}'; presets: {', '.join(presets) or 'none'} (or give a config file: "
        f".toml, .json or .yaml)"
    )


def run_file_train(family: str, preset_or_file: str | dict | None) -> dict:
    """The training fields of a run file given as ``--config`` (empty for a preset)."""
    return read_run_file(family, preset_or_file)[2] if is_config_file(preset_or_file) else {}


def _unknown_override(key: str, model_cls: type, train_fields: list[str], file: str | None = None) -> ConfigError:
    """The error for a key of neither config: this family's name for it, a close key, or the valid keys."""
    model_fields = list(_field_types(model_cls))
    what = f"unknown config key '{key}' in {file}" if file else f"unknown --set key '{key}'"
    same = synonyms_in(model_cls, key)
    if same:
        return ConfigError(f"{what}: {model_cls.__name__} calls it {' or '.join(same)} (e.g. {same[0]} = ...)")
    close = difflib.get_close_matches(key, model_fields + train_fields, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    msg = f"{what}{hint}; model keys ({model_cls.__name__}): {', '.join(sorted(model_fields))}"
    if train_fields:
        msg += f"; training keys: {', '.join(sorted(train_fields))}"
    return ConfigError(msg)


def split_all_overrides(
    pairs: list[str] | None, model_cls: type, trainer_based: bool = True
) -> tuple[dict[str, str], dict[str, str]]:
    """Split ``--set k=v`` pairs into (model overrides, training overrides); a key in neither is an error.

    A key naming a field of both configs goes to the model config (families keep their own
    meaning of e.g. ``seed``-like knobs); for non-Trainer families (word2vec) every key is a model key.
    """
    over = parse_overrides(pairs)
    model_fields = set(_field_types(model_cls))
    train_fields = list(_field_types(TrainConfig)) if trainer_based else []
    model_over, train_over = {}, {}
    for k, v in over.items():
        if k in model_fields:
            model_over[k] = v
        elif k in train_fields:
            train_over[k] = v
        elif not trainer_based and k in _field_types(TrainConfig):
            raise ConfigError(f"'{k}' is a training key of the Trainer's families (bert, gpt, elmo); "
                              f"{model_cls.__name__} trains in one gensim pass and takes model keys only")
        else:
            raise _unknown_override(k, model_cls, train_fields)
    if "max_time" in train_over and train_over["max_time"].lower() not in ("none", "null"):
        train_over["max_time"] = str(parse_duration(train_over["max_time"]))
    return model_over, train_over


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


def _check_init(init: str | Path, family: str, resume: bool, trainer_based: bool, preset: str | None) -> Path:
    """The ``--init`` model folder, checked against the other options (one-line errors)."""
    if resume:
        raise LmforgeError(
            "--init starts a new run from a model folder and --resume continues the run in --out; give one of them"
        )
    if not trainer_based:
        raise LmforgeError(f"--init continues the pretraining of bert, gpt or elmo; {family} trains in one pass")
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


def pretrain(
    family: str,
    data_dir: str | Path,
    out_dir: str | Path,
    preset_or_file: str | dict | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
    max_time: str | float | None = None,
    tokenizer_dir: str | Path | None = None,
    progress: bool | None = None,
    init: str | Path | None = None,
    device: str | None = None,
    precision: str | None = None,
) -> PretrainResult:
    """Pretrain a ``family`` model on the shards in ``data_dir`` and write the model folder ``out_dir``.

    Args:
        family: ``bert``, ``gpt``, ``elmo`` or ``word2vec`` (a key of :data:`lmforge.models.FAMILIES`).
        data_dir: shards written by ``lmforge prepare``.
        out_dir: the model folder to write (config.json, model.safetensors, tokenizer, training_state/,
            train_config.json, metrics.jsonl, training_curves.png).
        preset_or_file: a preset name of the family, a run file (default: ``DEFAULT_PRESET``; see the
            module docstring) or the model config's fields as a mapping (a budget plan's). Its model fields
            are ignored on resume (the saved ``config.json`` is used).
        overrides: ``["key=value", ...]`` for model or training fields (``max_steps=...``, ``lr=...``).
        resume: continue the run saved in ``out_dir/training_state``.
        max_time: time budget of this invocation, e.g. ``"15m"`` or seconds.
        tokenizer_dir: if given, the tokenizer the user expects; it must be the one that made the shards.
        progress: show the progress bar (``None``: only on a terminal).
        init: continue pretraining from this model folder of the same family (domain-adaptive
            pretraining): its config and weights are the start, its tokenizer must have made the
            shards; the optimizer, schedule and step count start afresh (bert, gpt, elmo).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (``None``: the config's, default ``auto``).
        precision: ``auto``, ``fp32``, ``bf16`` or ``fp16`` (``None``: the config's, default ``auto``);
            the resolved choice is saved in ``train_config.json``.
    Returns:
        A :class:`PretrainResult` with the final validation metrics.
    """
    out = Path(out_dir)
    module = family_module(family)
    trainer_based = get_family(family).trainer
    model_cls = family_config_class(family)
    model_over, train_over = split_all_overrides(overrides, model_cls, trainer_based)

    # -- configs (no data read yet) --------------------------------------------------------------
    init_dir = None
    if init is not None:
        init_dir = _check_init(init, family, resume, trainer_based, preset_or_file)
    file_train = run_file_train(family, preset_or_file) if trainer_based else {}
    if resume:
        if find_state_dir(out) is None and trainer_based:
            raise CheckpointError(f"no {STATE_DIR}/ in {out} to resume from; run without --resume to start afresh")
        if preset_or_file is not None:
            logger.warning("--resume: ignoring the model config of --config %s; it comes from %s", preset_or_file,
                           out)
        data = load_json(out / "config.json")
        model_config = from_dict(model_cls, data, ignore=("model_type",))
    else:
        if out.exists() and not out.is_dir():
            raise LmforgeError(f"--out {out} is a file; give a folder for the model")
        if trainer_based and ((out / "config.json").exists() or find_state_dir(out) is not None):
            raise LmforgeError(
                f"{out} already holds a model; pass --resume to continue its training, or choose another --out"
            )
        if init_dir is not None:
            model_config = get_family(family).model_class.config_from_folder(init_dir)
        else:
            model_config = build_model_config(family, module, preset_or_file)
    model_config = apply_overrides(model_config, model_over)

    train_config = TrainConfig()
    if trainer_based:
        if resume and (out / TRAIN_CONFIG_FILE).is_file():
            saved = upgrade_legacy_keys(load_json(out / TRAIN_CONFIG_FILE))
            saved["max_time"] = None  # a time budget belongs to one invocation
            train_config = from_dict(TrainConfig, saved, ignore=("model",))
        else:
            train_config = apply_overrides(TrainConfig(), get_family(family).train_defaults)
        train_config = apply_overrides(apply_overrides(train_config, file_train), train_over)
        if max_time is not None:
            train_config = dataclasses.replace(train_config, max_time=parse_duration(max_time))
        given = {k: v for k, v in (("device", device), ("precision", precision)) if v is not None}
        train_config = apply_overrides(train_config, given)
    elif max_time is not None:
        logger.warning("%s trains without the Trainer and has no time budget: --max-time is not used", family)
    if not trainer_based and (device not in (None, "auto", "cpu") or precision not in (None, "auto", "fp32")):
        logger.warning("%s trains with gensim on the CPU in fp32: --device and --precision are not used", family)

    # -- data and tokenizer ----------------------------------------------------------------------
    shards = open_shards(data_dir)
    tokenizer = shards.tokenizer()
    if tokenizer_dir is not None:
        check_tokenizer(shards, data_dir, load_tokenizer(tokenizer_dir), f"the tokenizer in {tokenizer_dir}")
    if init_dir is not None:
        check_tokenizer(shards, data_dir, load_tokenizer(init_dir), f"the tokenizer of the model in {init_dir}")
    if resume and (out / "tokenizer.json").is_file():
        check_tokenizer(shards, data_dir, load_tokenizer(out), f"the tokenizer of the model in {out}")
    shards.check_tokenizer(tokenizer)

    if not trainer_based:
        seed_everything(getattr(model_config, "seed", 0))
        result = module.run_pretraining(shards, tokenizer, model_config, out)
        update_card(out, shards=data_dir)
        return result

    # -- model and training ----------------------------------------------------------------------
    env = init_distributed(train_config.device)
    finished = False
    try:
        seed_everything(train_config.seed)
        model, sampler = module.pretraining_setup(model_config, shards, tokenizer)
        if init_dir is not None:
            model.load_weights(load_safetensors(init_dir / "model.safetensors"))
            (logger.info if env.is_main else logger.debug)("starting from the weights of %s", init_dir)
        n_params = sum(p.numel() for p in model.parameters())
        rows = train_config.batch_size * train_config.grad_accum * env.world_size
        (logger.info if env.is_main else logger.debug)(
            "pretraining %s: %.2fM parameters; %d rows/step (%d x accum %d x %d process%s); steps %d%s",
            family,
            n_params / 1e6,
            rows,
            train_config.batch_size,
            train_config.grad_accum,
            env.world_size,
            "" if env.world_size == 1 else "es",
            train_config.max_steps,
            f", time budget {format_duration(train_config.max_time)}" if train_config.max_time else "",
        )
        trainer = Trainer(model, sampler, train_config, out, tokenizer=tokenizer, progress=progress)
        train_config = trainer.config  # the precision resolved for the device
        if env.is_main:
            out.mkdir(parents=True, exist_ok=True)
            save_run_config(out, train_config, getattr(model, "config", model_config), family)
        result = trainer.train(resume=resume)
        finished = True
    finally:
        cleanup(env, wait=finished)
    if env.is_main:
        update_card(out, shards=data_dir)  # the model card (README.md) from the folder's facts and the shards
    logger.debug("final config: %s", to_dict(train_config))
    return PretrainResult(
        family=family,
        out_dir=out,
        val=result.val,
        step=result.step,
        stop_reason=result.stop_reason,
        train_loss=result.train_loss,
        tokens_seen=result.tokens_seen,
        elapsed=result.elapsed,
    )


def save_run_config(out: Path, train_config: TrainConfig, model_config, family: str) -> None:
    """Write ``train_config.json``: the training fields flat (what ``--resume`` reads) and the model config under
    ``model``, so the file given back as ``--config`` repeats the run (config.json comes with each checkpoint)."""
    model = {"model_type": family, **to_dict(model_config)} if dataclasses.is_dataclass(model_config) else None
    save_json({**to_dict(train_config), **({"model": model} if model else {})}, out / TRAIN_CONFIG_FILE)


def evaluate_lm(
    model_dir: str | Path,
    data_dir: str | Path,
    split: str = "val",
    batches: int = 50,
    batch_size: int = 16,
    overrides: list[str] | None = None,
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
        overrides: ``["key=value"]`` model-config fields of the sampler, e.g. ``next_sentence=false``.
    Returns:
        ``{"loss", "ppl", ...family metrics}`` as floats.
    """
    p = Path(model_dir)
    if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
        raise CheckpointError(f"{p} is not a model folder (it needs config.json and model.safetensors)")
    family = load_json(p / "config.json").get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(f"{p} holds a '{family}' model; evaluate lm reads bert, gpt or elmo folders")
    module = family_module(family)
    if not get_family(family).trainer:
        raise LmforgeError(f"{family} has no language-model loss to score text with; use `lmforge evaluate wic`")
    if split not in ("val", "train"):
        raise LmforgeError(f"split must be 'val' or 'train', not {split!r}")
    if batches < 1 or batch_size < 1:
        raise LmforgeError(f"--batches and --batch-size must be >= 1, got {batches} and {batch_size}")
    model_over, train_over = split_all_overrides(overrides, family_config_class(family))
    if train_over:
        raise ConfigError(f"evaluate lm takes model-config keys only, not {', '.join(sorted(train_over))}")
    model_config = apply_overrides(get_family(family).model_class.config_from_folder(p), model_over)
    shards = open_shards(data_dir)
    check_tokenizer(shards, data_dir, load_tokenizer(p), f"the tokenizer of the model in {p}")
    model, sampler = module.pretraining_setup(model_config, shards, shards.tokenizer())
    model.load_weights(load_safetensors(p / "model.safetensors"))
    config = TrainConfig(batch_size=batch_size, eval_batches=batches, seed=seed, device=device)
    trainer = Trainer(model, sampler, config, p, progress=False, plot=False)
    finished = False
    try:
        metrics = trainer.evaluate(split)
        finished = True
        return metrics
    finally:
        cleanup(trainer.env, wait=finished)
