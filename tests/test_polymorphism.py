"""Task- and family-specific behaviour lives on ``TaskSpec`` (transfer/specs.py) and the family objects
(families/<name>/): outside them no branch compares a task name or a family name, and no table is keyed by one.

The test parses every module with ``ast`` and fails on a comparison (``==``, ``!=``, ``in``, ``not in``) with a
string literal that is a task or family name, and on a dict literal keyed by a family name.  Allowed: specs.py, the
family package (each family's folder reads HF's ``model_type`` of its own family), the demo's plan (which families
the demo runs, and how), and a few comparisons where the word means something else (a budget of ``tokens``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import lmforge
from lmforge.data.tasks import KINDS, TASKS
from lmforge.families import FAMILIES
from lmforge.interop.runs import family_export
from lmforge.transfer.specs import SPECS

SRC = Path(lmforge.__file__).resolve().parent
NAMES = set(SPECS) | set(FAMILIES)
OWNERS = {"transfer/specs.py"}
OWNER_PACKAGES = ("families/",)  # the registry and each family's own folder
# the demo's plan and steps say which families the demo pretrains and with which settings: its own choices, as data
TABLE_OWNERS = OWNER_PACKAGES + ("demo/",)
# the same word with another meaning: a token budget, a pooling mode, an autotune cache entry
OTHER_MEANING = {("train/budget.py", 'b.kind == "tokens"'), ("transfer/config.py", 'pool == "tokens"'),
                 ("transfer/encoding.py", 'self.pool == "tokens"'), ("nn/autotune.py", '"choice" in entry')}
def _literals(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def name_comparisons() -> list[tuple[str, int, str]]:
    """``(module, line, source)`` of every comparison with a task or family name in a string literal."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            if not any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                continue
            if any(_literals(e) & NAMES for e in [node.left, *node.comparators]):
                found.append((rel, node.lineno, ast.get_source_segment(text, node) or ""))
    return found


def test_the_scan_finds_a_name_comparison():
    tree = ast.parse('if family == "gpt" or task in ("qa", "x"):\n    pass\n')
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert all(any(_literals(e) & NAMES for e in [c.left, *c.comparators]) for c in compares) and len(compares) == 2


def test_no_branch_compares_a_task_or_family_name_outside_its_owners():
    stray = [f"{rel}:{line}: {source}" for rel, line, source in name_comparisons()
             if rel not in OWNERS and not rel.startswith(OWNER_PACKAGES) and (rel, source) not in OTHER_MEANING]
    assert not stray, ("ask TaskSpec (transfer/specs.py) or the family's object (families/<name>/) instead:\n"
                       + "\n".join(stray))


def _tables(text: str) -> list[int]:
    """Lines of the dict literals in ``text`` with a family name among their keys."""
    return [node.lineno for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Dict) and any(k is not None and _literals(k) & set(FAMILIES) for k in node.keys)]


def family_tables() -> list[str]:
    """``module:line`` of every dict literal in lmforge with a family name among its keys."""
    return [f"{path.relative_to(SRC).as_posix()}:{line}" for path in sorted(SRC.rglob("*.py"))
            for line in _tables(path.read_text(encoding="utf-8"))]


def test_no_table_is_keyed_by_family_name_outside_the_families():
    assert _tables('x = 1\nPOOL = {"bert": "cls", "other": 2}\nY = {"cls": "bert"}\n') == [2]  # the scan sees one
    stray = [where for where in family_tables() if not where.startswith(TABLE_OWNERS)]
    assert not stray, "put the fact on the family's object (families/<name>/__init__.py) instead:\n" + "\n".join(stray)


def test_every_family_has_its_card_facts():
    """A model card names each family by its label and says what it is for."""
    for family in FAMILIES.values():
        assert family.card is not None and family.card.label == family.label, family.name
        assert family.card.pipeline in ("fill-mask", "text-generation", "feature-extraction"), family.name


def test_every_task_has_its_data_side_and_its_spec():
    assert list(KINDS) == list(SPECS) == list(TASKS)


def test_every_run_export_maps_heads_that_tasks_have():
    heads = {spec.hf_head for spec in SPECS.values()} - {None}
    exporting = [f for f in FAMILIES.values() if f.exports_runs]
    assert [f.name for f in exporting] == ["bert", "gpt", "electra"]
    for family in exporting:
        assert set(family_export(family).HEADS) <= heads, family.name
