"""scripts/make_results.py: README rows name their machine, and the demo's time comes from a record of its plan."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from lmforge import demo as D

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mr():
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_statement_of_the_demo_s_time_is_generated(mr):
    records = mr.load_records()
    timed = [r for r in records if r.get("demo_time")]
    assert timed and not mr.stale_demo_times(records)
    for page, link in mr.TIME_PAGES.items():
        text = page.read_text(encoding="utf-8")
        block = mr.demo_time_block(records, link)
        assert block in text
        for r in timed:  # each timed run: its seconds, its machine and a link to its record
            assert f"{r['demo_time']['seconds']:g} s on {mr._machine(r['machine'])}" in block
            assert f"{link}#{r['id']}" in block
        # no other sentence of the page gives the demo a duration
        outside = text.replace(block, "")
        assert not re.search(r"about (a|\d+) minutes?|in seconds|sized for \d", outside), page
    assert not re.search(r"\d+ minutes|a minute", _demo_help())


def _demo_help() -> str:
    from lmforge.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["demo"].format_help()


def test_a_changed_plan_makes_its_time_record_stale(mr, monkeypatch):
    records = mr.load_records()
    record = next(r for r in records if r.get("demo_time", {}).get("plan") == "quick")
    assert record["demo_time"]["plan_fingerprint"] == D.QUICK.fingerprint
    longer = D.QUICK.with_budget(2 * D.QUICK.budget)
    assert longer.fingerprint != D.QUICK.fingerprint
    monkeypatch.setattr(mr, "make_plan", lambda quick=False: longer if quick else D.FULL)
    stale = mr.stale_demo_times(records)
    assert len(stale) == 1 and record["id"] in stale[0] and "--add-demo-time" in stale[0]


def test_a_readme_row_needs_a_named_machine_and_one_figure(mr, tmp_path):
    record = json.loads((ROOT / "docs/results/records/speed_cpu_xeon.json").read_text(encoding="utf-8"))
    (tmp_path / "a.json").write_text(json.dumps(record), encoding="utf-8")
    assert len(mr.load_records(tmp_path)) == 1
    for broken in ({**record, "machine": {"cpu": "not recorded (a shared machine)", "threads": 2}},
                   {**record, "headline": {k: v for k, v in record["headline"].items() if k != "readme"}}):
        (tmp_path / "a.json").write_text(json.dumps(broken), encoding="utf-8")
        with pytest.raises(SystemExit, match="README row"):
            mr.load_records(tmp_path)
        (tmp_path / "a.json").write_text(json.dumps({**broken, "readme": False}), encoding="utf-8")
        assert len(mr.load_records(tmp_path)) == 1  # the results page keeps it


def test_a_demo_run_becomes_a_record_of_its_time(mr, tmp_path, monkeypatch):
    torch.manual_seed(0)
    plan = D.QUICK
    small = dataclasses.replace(plan, families=(plan.family("bert"),), wic_pairs=40, transfer_table=False,
                                curve=False)
    out = tmp_path / "demo"
    D.run_demo(out, plan=small)
    record = mr.demo_time_record(out, "demo-time-test")
    state = json.loads((out / D.STATE_FILE).read_text())
    assert record["demo_time"] == {"plan": "quick", "plan_fingerprint": small.fingerprint, "seconds": pytest.approx(
        sum(v["info"]["_seconds"] for v in state.values()), abs=0.1)}
    assert record["machine"]["threads"] == torch.get_num_threads() and record["machine"]["cpu"]
    assert [row[0] for row in record["table"]["rows"]] == list(state)
    # a plan other than the command's own is stale at once: its time is not the demo's
    assert mr.stale_demo_times([record])


def _bench_json(tmp_path, name: str, bench: dict, cpu: str = "Some CPU") -> Path:
    machine = {"cpu": cpu, "cpu_flags": ["avx2", "avx512f", "amx_bf16"], "cores": 2, "threads": 2}
    path = tmp_path / name
    path.write_text(json.dumps({**bench, "provenance": {"command": f"bench {name}", "commit": "abc", "date":
                                                        "2026-12-07", "machine": machine}}))
    return path


def test_bench_json_becomes_a_record_naming_its_machine_and_load(mr, tmp_path):
    tps = {"st torch": 100.0, "lmforge torch": 150.0, "lmforge onnx": 140.0, "lmforge auto": 149.0,
           "lmforge onnx int8": 300.0}
    fid = {k: [1.0, 0.99999] for k in tps} | {"lmforge onnx int8": [0.99, 0.97]}
    peers = {"bench": "encode_peers", "settings": {"model": None}, "load_average": {"start": [1.5], "end": [2.5]},
             "threads": {"1": {"texts_per_s": tps, "fidelity": fid, "exact_ratio": 1.5}}}
    demo = {**peers, "settings": {"model": "/tmp/demo/models/bert"}, "load_average": None,
            "threads": {"2": {"texts_per_s": {**tps, "st torch": 120.0}, "fidelity": fid, "exact_ratio": 1.25}}}
    paths = [_bench_json(tmp_path, "a.json", peers), _bench_json(tmp_path, "b.json", demo)]
    record = mr.bench_record(paths, "encode-peers-test", "Quiet machine.")
    assert record["machine"] == {"cpu": "Some CPU (2 cores, AVX-512, AMX)", "threads": "1 and 2"}
    assert record["headline"]["figure"] == ("fastest exact mode / sentence-transformers: all-MiniLM-L6-v2 "
                                            "1.50-1.50x, /tmp/demo/models/bert 1.25-1.25x (target 1.3x)")
    assert [r[:3] for r in record["table"]["rows"]] == [["all-MiniLM-L6-v2", "1", "100.0"],
                                                       ["/tmp/demo/models/bert", "2", "120.0"]]
    assert record["table"]["rows"][0][-3:] == ["1.50x", "3.00x", "0.9700"]
    assert "load average 1.5 at the start, 2.5 at the end" in record["notes"]
    assert "load average not recorded" in record["notes"] and record["notes"].startswith("Quiet machine.")
    for k in mr.REQUIRED:
        assert k in record
    serve = {"bench": "serve_embeddings", "settings": {"model": "minilm", "threads": 2},
             "load_average": {"start": [1.0], "end": [1.0]},
             "rows": [{"backend": b, "clients": c, "texts_per_s": 10.0, "p50_ms": 10.0, "p99_ms": 10.0 * (c / 4 + 1),
                       "p99_over_p50": c / 4 + 1, "passes_per_request": 1 / c} for b in ("torch", "onnx")
                      for c in (1, 8)]}
    record = mr.bench_record([_bench_json(tmp_path, "s.json", serve)], "serve-test")
    assert record["headline"]["figure"] == "p99 / p50 at 8 clients: torch 3.00, onnx 3.00 (target under 2)"
    assert len(record["table"]["rows"]) == 4 and record["table"]["rows"][1][-2:] == ["3.00", "0.12"]
    with pytest.raises(SystemExit, match="one of"):  # two kinds of bench in one record
        mr.bench_record([paths[0], _bench_json(tmp_path, "s.json", serve)], "mixed")
    with pytest.raises(SystemExit, match="2 machines"):
        mr.bench_record([paths[0], _bench_json(tmp_path, "c.json", peers, cpu="Other CPU")], "two-machines")
