"""Imports inside lmforge run one way: a module never imports from a layer above its own.

Layers, bottom to top: the shared base (errors, config, utils); nn, data, tokenization, folders and cards; models
(with generation); train; transfer, evaluate and interop; the user-facing commands (cli, commands,
demo, serve...).  Function-local imports count too: hiding an upward import in a function does not
make it go away.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lmforge

SRC = Path(lmforge.__file__).resolve().parent

# top-level name under lmforge -> layer (higher = may import everything below)
LAYERS = {
    "errors": 0, "config": 0, "utils": 0, "provenance": 0,
    "nn": 1, "data": 1, "tokenization": 1, "folders": 1, "guards": 1, "cards": 1,
    "models": 2, "generation": 2,
    "train": 3,
    "transfer": 4, "evaluate": 4, "interop": 4,
    "cli": 5, "commands": 5, "demo": 5, "serve": 5,
}
# uphill imports known and still to fix, as (file, imported module); any other one fails the test
PENDING = {
    # the output-folder kind inference asks the family registry which model_types exist
    ("folders.py", "lmforge.models"),
}


def _part(module: str) -> str:
    """``lmforge.models.gpt`` -> ``models``; the package root -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every lmforge import in ``path`` (relative ones resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "lmforge"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "lmforge":
                continue
            if not node.module and node.level and target != "lmforge":
                out += [(node.lineno, f"{target}.{a.name}") for a in node.names]  # `from . import x`: a sibling
            elif target == "lmforge":  # `from lmforge import x`: a submodule, or a name of the package root
                out += [(node.lineno, f"lmforge.{a.name}" if a.name in LAYERS else "lmforge")
                        for a in node.names if a.name != "__version__"]  # the version string is everyone's
            else:
                out.append((node.lineno, target))
    return out


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


def test_every_top_level_module_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert names <= set(LAYERS), f"give these a layer in LAYERS: {sorted(names - set(LAYERS))}"


def test_imports_only_run_downhill():
    bad = []
    for path, module in _modules():
        own = _part(module)
        if own == "":
            continue  # the package root re-exports from below
        for line, target in _imports(path, module):
            other = _part(target)
            if other == "":
                bad.append(f"{path.relative_to(SRC)}:{line} imports the package root (import from the owner instead)")
            elif other != own and LAYERS[other] > LAYERS[own] and (str(path.relative_to(SRC)), target) not in PENDING:
                bad.append(f"{path.relative_to(SRC)}:{line} ({own}, layer {LAYERS[own]}) imports {target} "
                           f"(layer {LAYERS[other]})")
    assert not bad, "imports running uphill:\n" + "\n".join(bad)
