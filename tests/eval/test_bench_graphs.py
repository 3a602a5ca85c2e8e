"""eval.bench_graphs --render: the report from graphs.json, and an exit status that says whether both paths emitted
the same tokens."""

import json

from eval.bench_graphs import main


def _results(static_sd_tokens: list[list[int]]) -> dict:
    cell = {"rates": [10.0, 12.0], "accept": 2.5, "tokens": [[1, 2, 3]]}
    cells = {f"1/{mode}/{arm}": dict(cell) for mode in ("plain", "sd") for arm in ("eager", "static")}
    cells["1/sd/static"] = cell | {"rates": [20.0, 24.0], "tokens": static_sd_tokens}
    settings = {"device": "cpu", "dtype": "float32", "new_tokens": 3, "strategy": "2_1_3", "rounds": 2, "batches": [1]}
    return {"machine": {"cpu_model": "test"}, "settings": settings, "cells": cells}


def test_render_rewrites_the_report_and_flags_different_tokens(tmp_path):
    (tmp_path / "graphs.json").write_text(json.dumps(_results([[1, 2, 3]])))
    assert main(["--render", "--out", str(tmp_path)]) == 0
    row = "| 1 | sd | 11.0 (10.0-12.0) | 22.0 (20.0-24.0) | 2.00x | 1.00x | 2.00x | 2.50 | yes |"
    assert row in (tmp_path / "graphs.md").read_text()
    (tmp_path / "graphs.json").write_text(json.dumps(_results([[1, 2, 4]])))
    assert main(["--render", "--out", str(tmp_path)]) == 1
    assert "| 2.50 | NO |" in (tmp_path / "graphs.md").read_text()
