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
    "errors": 0, "config": 0, "utils": 0, "provenance": 0, "devices": 0, "malloc": 0, "cpu_quota": 0,
    "nn": 1, "data": 1, "tokenization": 1, "tokenizer_pipelines": 1, "storage": 1,
    "models": 2, "families": 2, "generation": 2,
    "train": 3,
    "transfer": 4, "evaluate": 4, "interop": 4,
    "cli": 5, "commands": 5, "demo": 5, "serve": 5,
}
# uphill imports known and still to fix, as (file, imported module); any other one fails the test
PENDING = {
    # the output-folder kind inference asks the family registry which model_types exist
    ("storage/folders.py", "lmforge.families"),
    # a model folder's tokenizer is checked against the kind its family reads, which the registry knows
    ("storage/checks.py", "lmforge.families"),
    # save_json writes atomically
    ("config.py", "lmforge.storage.files"),
    # gensim's word2vec run returns the pretraining result record
    ("families/word2vec/train.py", "lmforge.train.result"),
}


def _part(module: str) -> str:
    """``lmforge.families.gpt.model`` -> ``models``; the package root -> ``""``."""
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


# optional heavy dependencies: a module that imports one at its top is imported inside the functions that need it
HEAVY = ("fastapi", "gensim", "jieba", "matplotlib", "sklearn", "transformers", "uvicorn", "tensorboard")


def _heavy_modules() -> set[str]:
    """lmforge modules that import an optional heavy dependency at their top."""
    heavy = set()
    for path, module in _modules():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] \
                if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] in HEAVY for n in names):
                heavy.add(module)
    return heavy


def test_function_local_imports_are_for_heavy_dependencies():
    """docs/architecture.md: a function-local import is kept only for an optional, heavy dependency (an lmforge
    module that imports one at its top, and its package, count as one), or says on its line why it is local."""
    heavy = _heavy_modules()
    heavy |= {m.rsplit(".", 1)[0] for m in heavy}  # a package holding one is loaded lazily as a whole (serve)
    bad = []
    for path, module in _modules():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        top = {id(n) for n in ast.parse(text).body}
        tops = {(t, line) for line, t in _imports(path, module)}
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.col_offset == 0 or id(node) in top:
                continue
            targets = [t for t, line in tops if line == node.lineno]
            if not targets or all(t in heavy or t.rsplit(".", 1)[0] in heavy for t in targets):
                continue
            if "#" in lines[node.lineno - 1]:
                continue  # a reason on the line
            bad.append(f"{path.relative_to(SRC).as_posix()}:{node.lineno} {lines[node.lineno - 1].strip()}")
    assert not bad, ("import lmforge's own modules at the top of the module, or say on the import's line why it "
                     "is local (# ...):\n" + "\n".join(bad))
