import pytest
import torch

from lmforge.errors import CheckpointError
from lmforge.utils import atomic_path, atomic_write_text, load_safetensors, save_safetensors


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half-written")
        raise RuntimeError("crash in the middle")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]  # no temp file left behind


def test_safetensors_round_trip_with_tied_tensors(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    save_safetensors({"a": w, "b": w, "c": torch.arange(5)}, tmp_path / "m.safetensors")
    back = load_safetensors(tmp_path / "m.safetensors")
    assert torch.equal(back["a"], w) and torch.equal(back["b"], w) and torch.equal(back["c"], torch.arange(5))


def test_corrupt_or_missing_safetensors_is_one_line_error(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_safetensors(tmp_path / "none.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_safetensors(bad)
