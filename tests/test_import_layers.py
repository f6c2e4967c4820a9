"""Imports inside lmforge run one way: a module never imports from a layer above its own, and no modules import
each other in a circle.

Layers, bottom to top: the shared base (errors, config, utils, text...); storage (atomic writes, output folders);
nn and data (corpora, samplers, task data); tokenization; what reads a tokenizer beside the data (token shards, model
cards and model-folder checks); models and families (with generation); train; transfer, evaluate and interop; the
user-facing commands (cli, commands, demo, serve...).  docs/architecture.md's layer table is this one.
Function-local imports count too: hiding an upward import in a function does not make it go away.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lmforge

SRC = Path(lmforge.__file__).resolve().parent

# a top-level name under lmforge, or a module of a package where it sits above the rest of its package
# (``storage.cards``) -> layer; higher = may import everything below, never the other way
LAYERS = {
    "errors": 0, "utils": 0, "text": 0, "config": 0, "provenance": 0, "devices": 0, "malloc": 0, "cpu_quota": 0,
    "storage": 1,
    "nn": 2, "data": 2,
    "tokenization": 3, "tokenizer_pipelines": 3,
    "data.shards": 4, "storage.cards": 4, "storage.checks": 4,
    "models": 5, "families": 5, "generation": 5,
    "train": 6,
    "transfer": 7, "evaluate": 7, "interop": 7,
    "cli": 8, "commands": 8, "demo": 8, "serve": 8,
}


def _part(module: str) -> str:
    """The LAYERS key of a module: ``lmforge.storage.cards`` -> ``storage.cards``, ``lmforge.storage.files`` ->
    ``storage``; the package root -> ``""``."""
    parts = module.split(".")[1:]
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in LAYERS), "")


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
            elif path.name == "__init__.py" and target.startswith(module + "."):
                continue  # a package's __init__ re-exports its own modules (data's Shards, lazily)
            elif other != own and LAYERS[other] > LAYERS[own]:
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


def test_no_private_name_is_imported_across_modules():
    """A ``_name`` is its module's own: a name another module needs is public (or the function moves to its user)."""
    bad = []
    for path, _ in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("lmforge")):
                continue
            for a in node.names:
                if any(n and n.startswith("_") and not n.startswith("__") for n in (a.name, a.asname)):
                    bad.append(f"{path.relative_to(SRC).as_posix()}:{node.lineno} imports {a.name}"
                               + (f" as {a.asname}" if a.asname else ""))
    assert not bad, "private names imported from another module (make them public names of their owner):\n" + \
        "\n".join(bad)


def _module_graph() -> dict[str, set[str]]:
    """module -> the lmforge modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``), whether
    at the top, inside a function or under ``TYPE_CHECKING``."""
    modules = {module: path for path, module in _modules()}
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                out |= {f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names
                        if not (target == "lmforge" and a.name == "__version__")}  # the version string is everyone's
        graph[module] = {m for m in out if m in modules and m != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d", "f"}, "f": {"e"}}
    assert sorted(_circles(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_modules_import_each_other_in_a_circle():
    """Two modules that need each other are one module, or one of them names what it needs (a Protocol) instead
    of importing it; a circle under ``TYPE_CHECKING`` or inside a function counts as well."""
    circles = _circles(_module_graph())
    assert not circles, "modules importing each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_layer_table_puts_the_corpus_below_the_tokenizer_below_the_shards():
    """data/, tokenization and tokenizer_pipelines once shared a layer, so a loop among them passed: the tokenizer
    trains on a corpus of data/, and data/shards.py reads a tokenizer, so shards sit above both."""
    layer = {m: LAYERS[_part(f"lmforge.{m}")] for m in
             ("data.sources", "tokenizer_pipelines", "tokenization", "data.shards", "storage.files", "storage.cards")}
    assert layer["storage.files"] < layer["data.sources"] < layer["tokenizer_pipelines"] == layer["tokenization"]
    assert layer["tokenization"] < layer["data.shards"] and layer["tokenization"] < layer["storage.cards"]
    assert _part("lmforge.data.shards") == "data.shards" and _part("lmforge.data.samplers") == "data"
