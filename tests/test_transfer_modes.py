"""Transfer modes are objects (lmforge.transfer.modes): a mode's name is looked up once, the CLI offers exactly the
registered modes, and each mode object carries the rules a run asks of it."""

from __future__ import annotations

import argparse

import pytest

from lmforge.cli import build_parser
from lmforge.errors import LmforgeError
from lmforge.transfer import MODES, TransferConfig, check_supported
from lmforge.transfer.modes import DEFAULT_MODE, Features, Finetune, Frozen, Mode, mode_of


def _finetune_mode_action() -> argparse.Action:
    parser = build_parser("finetune")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices["finetune"]._actions if "--mode" in a.option_strings)


def test_each_name_gives_its_mode_object_once_and_an_unknown_name_is_refused_in_one_line():
    kinds = {"frozen": Frozen, "features": Features, "finetune": Finetune}
    assert set(MODES) == set(kinds) and DEFAULT_MODE in MODES
    for name in MODES:
        mode = mode_of(name)
        assert isinstance(mode, kinds[name]) and mode.name == name
        assert mode_of(name) is mode and mode_of(mode) is mode  # one object per mode
        assert TransferConfig(mode=name).transfer_mode is mode
    with pytest.raises(LmforgeError) as e:
        mode_of("finetuned")
    assert all(name in str(e.value) for name in MODES) and "\n" not in str(e.value)


def test_the_cli_offers_the_registered_modes_and_defaults_to_the_default_mode():
    action = _finetune_mode_action()
    assert list(action.choices) == list(MODES)
    assert TransferConfig().mode == DEFAULT_MODE


@pytest.mark.parametrize("name", MODES)
def test_what_a_mode_trains_stores_and_exports_follows_from_whether_the_body_trains(name):
    mode: Mode = mode_of(name)
    cfg = TransferConfig(mode=name)
    assert mode.reads_model_weights == (not mode.trains_body)  # a run that keeps its own body reads no model weights
    assert cfg.head_classifier == mode.default_classifier
    assert mode.exports_onnx == (not mode.reads_stored)  # a head on stored vectors is no single graph
    assert cfg.resolved("bert").layer_lr_decay == (mode.recipe[3] if mode.trains_body else None)
    if not mode.trains_body:  # the finetune-only options are refused by every other mode, in one line
        for option in ({"freeze_layers": 1}, {"layer_lr_decay": 0.8}, {"from_scratch": True}):
            with pytest.raises(LmforgeError, match="finetune"):
                check_supported("bert", TransferConfig(mode=name, **option))
    else:
        check_supported("bert", TransferConfig(mode=name, freeze_layers=1, layer_lr_decay=0.8))


def test_a_family_without_finetune_takes_it_only_as_a_from_scratch_baseline():
    with pytest.raises(LmforgeError, match="elmo models support --mode frozen / features, not finetune"):
        check_supported("elmo", TransferConfig(mode="finetune"))
    check_supported("elmo", TransferConfig(mode="finetune", from_scratch=True))
