"""eval.suffix_epochs: per-epoch sums, the later-epochs summary over several sweeps, and the committed reports
render from their raw data."""

import json
from pathlib import Path

import pytest

from eval.suffix_epochs import epochs, table

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


@pytest.mark.parametrize(
    "folder",
    [
        "suffix_epochs_deep_v1",
        "composed_epochs_deep_v1",
        "suffix_epochs_tiny",
        "composed_epochs_deep_v2_packed",
        "composed_fresh_deep_v2_packed",
        "composed_epochs_deep_v2_trust",
        "composed_fresh_deep_v2_trust",
    ],
)
def test_the_committed_report_renders_from_its_json(folder):
    data = json.loads((RESULTS / folder / "epochs.json").read_text())
    assert table(data) == (RESULTS / folder / "epochs.md").read_text()


def _cell(*rollout_seconds, accept=0.0, length=9):
    metrics = [
        {"step": i, "rollout_seconds": s, "accept_length": accept, "sd_token_share": 0.5, "response_len_mean": length}
        for i, s in enumerate(rollout_seconds)
    ]
    return {"steps_per_epoch": 2, "metrics": metrics}


def test_epochs_sum_rollout_seconds_and_average_acceptance_over_their_steps():
    rows = epochs(_cell(1.0, 2.0, 3.0, 4.0, accept=1.5))
    assert [(e["epoch"], e["rollout_seconds"], e["accept_length"]) for e in rows] == [(1, 3.0, 1.5), (2, 7.0, 1.5)]


def test_later_epochs_are_summed_per_sweep_with_the_median_speedup():
    def sweep(name, never, suffix):
        return {"sweep": f"runs/{name}", "cells": {"sd_never": _cell(*never), "suffix": _cell(*suffix, accept=2.0)}}

    data = {
        "machine": {"cpu_model": "cpu"},
        "sweeps": [
            sweep("a", [1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 2, 2]),  # epochs 2-3: 8 s vs 6 s
            sweep("b", [1, 1, 1, 1, 1, 1], [1, 1, 2, 2, 2, 2]),  # 4 s vs 8 s
            sweep("c", [1, 1, 3, 3, 3, 3], [5, 5, 3, 3, 3, 3]),  # 12 s vs 12 s
        ],
    }
    text = table(data)
    assert "| suffix | 6.0, 8.0, 12.0 | 1.33x, 0.50x, 1.00x | 1.00x (0.50-1.33) | 1.33x, 0.50x, 1.00x |" in text
    assert text.count("| sd_never | 1 |") == 3  # one per-epoch table per sweep


def test_the_base_cell_is_the_sweeps_first_not_the_json_keys_first(tmp_path):
    """Reports sort their JSON keys; the base must stay the sweep's first cell (here `sd_never` after `eagle`)."""
    data = {
        "machine": {"cpu_model": "cpu"},
        "sweeps": [
            {"sweep": "runs/a", "cells": {"eagle": _cell(1, 1, 2, 2), "sd_never": _cell(1, 1, 4, 4, length=6)}}
            | {"order": ["sd_never", "eagle"]}
        ]
        * 2,
    }
    text = table(json.loads(json.dumps(data, sort_keys=True)))
    assert "speedup over `sd_never`" in text
    # eagle: 4 s against 8 s in epoch 2, and 1.5x the response tokens: 2.0x the time, 3.0x the tokens/s
    assert "| eagle | 4.0, 4.0 | 2.00x, 2.00x | 2.00x (2.00-2.00) | 3.00x, 3.00x | 3.00x (3.00-3.00) |" in text


def test_sweeps_of_one_epoch_get_their_tables_and_no_later_epochs_summary():
    one_epoch = {"steps_per_epoch": 100, "metrics": _cell(1, 2, 3)["metrics"]}
    sweep = {"sweep": "runs/a", "cells": {"eagle": one_epoch, "eagle_suffix": one_epoch}}
    text = table({"machine": {"cpu_model": "cpu"}, "sweeps": [sweep, sweep]})
    assert text.count("| eagle_suffix | 1 | 6.0 |") == 2
    assert "Epochs 2 on" not in text
