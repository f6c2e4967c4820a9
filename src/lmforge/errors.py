"""User-facing errors.

Library code raises :class:`LmforgeError` (or a subclass) for anything a user can fix: a missing
file, a wrong config key, shards made by another tokenizer.  The CLI prints its message as one
line on stderr and exits non-zero, without a traceback.  Bugs stay ordinary exceptions.
"""

from __future__ import annotations


class LmforgeError(Exception):
    """An error caused by the user's input; its message says what is wrong and what to do."""


class ConfigError(LmforgeError):
    """A config file or ``--set key=value`` override that does not fit the config's fields."""


class DataError(LmforgeError):
    """Unreadable, empty, binary or mis-encoded input data, or shards that do not fit."""


class CheckpointError(LmforgeError):
    """A model folder or training state that is missing, corrupt or incompatible."""


class MissingExtraError(LmforgeError):
    """An optional dependency is not installed."""


def require(module: str, extra: str):
    """Import an optional dependency lazily, or raise a one-line error naming the extra to install.

    Args:
        module: importable module name, e.g. ``"transformers"``.
        extra: the lmforge extra that installs it, e.g. ``"hf"``.
    Returns:
        The imported module.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            f"{module} is not installed; install it with: pip install 'lmforge[{extra}]'"
        ) from e
