"""Task- and family-specific behaviour lives on ``TaskSpec`` (transfer/specs.py) and the family registry
(models/registry.py): outside them no branch compares a task name or a family name.

The test parses every module with ``ast`` and fails on a comparison (``==``, ``!=``, ``in``, ``not in``) with a
string literal that is a task or family name.  Allowed: specs.py and registry.py, the per-family interop modules
(they read HF's ``model_type`` of their own family), and a few comparisons where the word means something else (a
budget of ``tokens``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import lmforge
from lmforge.data.tasks import KINDS, TASKS
from lmforge.families import FAMILIES
from lmforge.interop.runs import family_export
from lmforge.storage.cards import FAMILY_CARDS
from lmforge.transfer.specs import SPECS

SRC = Path(lmforge.__file__).resolve().parent
NAMES = set(SPECS) | set(FAMILIES)
OWNERS = {"transfer/specs.py", "families/registry.py", "families/bert/hf.py", "families/electra/hf.py",
          "families/gpt/hf.py"}
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
             if rel not in OWNERS and (rel, source) not in OTHER_MEANING]
    assert not stray, ("ask TaskSpec (transfer/specs.py) or the family registry (models/registry.py) instead:\n"
                       + "\n".join(stray))


def test_the_cards_family_table_follows_the_registry():
    """cards.py sits below the registry and keeps its own table of what a card says per family."""
    assert {name: card.label for name, card in FAMILY_CARDS.items()} == {f.name: f.label for f in FAMILIES.values()}


def test_every_task_has_its_data_side_and_its_spec():
    assert list(KINDS) == list(SPECS) == list(TASKS)


def test_every_run_export_maps_heads_that_tasks_have():
    heads = {spec.hf_head for spec in SPECS.values()} - {None}
    exporting = [f for f in FAMILIES.values() if f.run_export]
    assert [f.name for f in exporting] == ["bert", "gpt", "electra"]
    for family in exporting:
        assert set(family_export(family).HEADS) <= heads, family.name
