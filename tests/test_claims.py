"""docs/claims.md is exactly what eval/claims.py writes from the committed JSON, and every row names data that
exists."""

import json
import re
from pathlib import Path

import pytest

from eval import claims


def test_claims_page_is_regenerated_from_the_data():
    assert (claims.ROOT / claims.OUTPUT).read_text() == claims.render(), "run: python -m eval.claims"


def test_every_row_names_existing_data():
    text = claims.render()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.endswith("] |")]
    sources = dict(re.findall(r"^(\d+)\. `([^`]+)`", text, flags=re.MULTILINE))
    assert len(rows) >= 10 and sources
    for line in rows:
        path = sources[re.findall(r"\[(\d+)\] \|$", line)[0]]
        assert list(claims.ROOT.glob(path)), path


def _sweep(root, name, machine):
    folder = root / name
    for cell, rollout in (("baseline", 3.0), ("tlt", 2.0)):
        (folder / cell).mkdir(parents=True)
        summary = {"seconds": {"rollout": rollout, "total": rollout + 1}, "response_tokens": 100}
        (folder / cell / "summary.json").write_text(json.dumps(summary))
    (folder / "sweep.csv").write_text("cell,status\nbaseline,done\ntlt,done\n")
    if machine is not None:
        (folder / "machine.json").write_text(json.dumps(machine))
    return Path(name)


def test_sweep_claims_name_the_machine_the_sweeps_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    avx2 = {"cpu_model": "AMD EPYC", "logical_cores": 2, "cpu_native_bf16": False, "cpu_isa": "AVX2"}
    seeds = [_sweep(tmp_path, f"seed{s}", avx2) for s in range(2)]
    rows = claims.sweep_rows("ablation", seeds, "cmd")
    assert {row.machine for row in rows} == {"AMD EPYC with AVX2, 2 cores"}
    assert rows[0].claim == "ablation: rollout, baseline / tlt" and rows[0].values == [1.5, 1.5]
    old = [_sweep(tmp_path, "old", None)]  # sweeps from before machine.json: the AVX-512 VM
    assert claims.sweep_rows("x", old, "cmd")[0].machine == "AMD EPYC with AVX-512 BF16, 2 cores"
    with pytest.raises(ValueError, match="different machines"):
        claims.sweep_rows("mixed", seeds + old, "cmd")
