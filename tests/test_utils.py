import pytest
import torch

from lmforge.errors import CheckpointError
from lmforge.storage.files import atomic_path, atomic_write_text, load_safetensors, save_safetensors


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


def test_equal_weights_give_byte_equal_files_across_processes(tmp_path):
    # safetensors writes its metadata from a hash map (another key order in every process); lmforge sorts it
    import hashlib
    import subprocess
    import sys

    code = (
        "import sys, torch; from lmforge.storage.files import save_safetensors; "
        "save_safetensors({'a': torch.arange(6.0), 'b': torch.ones(2, 3)}, sys.argv[1], "
        "metadata={'format': 'pt', 'model_type': 'bert', 'source': 'x', 'examples': '3'})"
    )
    digests = set()
    for i in range(4):
        out = tmp_path / f"w{i}.safetensors"
        subprocess.run([sys.executable, "-c", code, str(out)], check=True)
        digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
        from safetensors import safe_open

        with safe_open(str(out), "pt") as f:
            assert f.metadata() == {"format": "pt", "model_type": "bert", "source": "x", "examples": "3"}
            assert f.get_tensor("a").tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(digests) == 1
