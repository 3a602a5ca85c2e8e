import json

import pytest

from eval.speedup_seeds import main, required_share
from tlt.eval.compare import Comparison, RunTimes


def _metrics(folder, rollout_seconds, tokens):
    """checkpoint/metrics.json of one run: a warm-up step, then one measured step per rollout time (+ 1 s of
    training each)."""
    (folder / "checkpoint").mkdir(parents=True)
    steps = [(99.0, 1)] + [(s, tokens) for s in rollout_seconds]
    times = {"train_seconds": 1.0, "drafter_seconds": 0.0, "push_seconds": 0.0}
    rows = [{"rollout_seconds": s, "response_len_mean": n / 4, "num_samples": 4, **times} for s, n in steps]
    (folder / "checkpoint" / "metrics.json").write_text(json.dumps(rows))


def _run(folder, seed, tlt_rollout, base_rollout, train=1.0):
    """A run folder as `tlt train ... train.compare_baseline=true` leaves it: config.yaml, speedup.json and both
    runs' metrics (11 measured steps, 100 response tokens each)."""
    folder.mkdir()
    (folder / "config.yaml").write_text(f"seed: {seed}\n")
    _metrics(folder, [tlt_rollout] * 11, 100)
    _metrics(folder / "baseline", [base_rollout] * 10 + [2 * base_rollout], 100)
    comparison = Comparison(
        measured_steps=11,
        tlt=RunTimes(tlt_rollout + train, tlt_rollout, train, 0.0, 0.3, 3.5, 0.25),
        baseline=RunTimes(base_rollout + train, base_rollout, train, 0.0, 0.3, 0.0, 0.25),
        base_heldout_accuracy=0.25,
    )
    (folder / "speedup.json").write_text(json.dumps(comparison.to_dict()))
    return folder


@pytest.mark.parametrize("goal, s", [(1.8, 3.0), (1.5, 2.0), (1.2, 10.0)])
def test_required_share_reaches_the_goal(goal, s):
    r = required_share(goal, s)
    assert 1 / ((1 - r) + r / s) == pytest.approx(goal)


def test_required_share_none_when_the_rollout_speedup_is_too_small():
    assert required_share(1.8, 1.8) is None
    assert required_share(1.8, 1.5) is None


def test_table_and_medians_over_seeds(tmp_path, capsys):
    runs = [
        _run(tmp_path / "s0", 0, tlt_rollout=1.0, base_rollout=3.0),  # s = 3, r = 3/4
        _run(tmp_path / "s1", 1, tlt_rollout=1.5, base_rollout=3.0),  # s = 2
        _run(tmp_path / "s2", 2, tlt_rollout=3.0, base_rollout=3.0),  # s = 1
    ]
    out = tmp_path / "seeds.md"
    assert main([str(r) for r in runs] + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.read_text() == text
    assert f"| {runs[0]} | 0 | 2.00x | 3.00x | 75% | 2.00x | 1.00 |" in text
    assert "| 1.00 / 3.00 | 3.27x |" in text  # tokens per second: 1100 / 11 s against 1100 / 36 s
    assert "| 3.27x | 2.14x |" in text  # all measured steps: 11 x (1 + 1) s against 10 x (3 + 1) + (6 + 1) s
    assert f"| {runs[2]} | 2 | 1.00x | 1.00x | 75% | 1.00x | 1.00 |" in text
    assert "step ratio **1.60x**, rollout ratio s = 2.00x, rollout share r = 75%" in text
    assert "rollout throughput ratio 2.18x" in text  # 36 / 16.5
    assert "run ratio (all measured steps' seconds) 1.71x" in text  # 47 / 27.5
    assert "range over seeds: step 1.00-2.00x, rollout 1.00-3.00x" in text
    assert "out of reach at s = 2.00x" not in text and "needs r >= 89%" in text  # (1 - 1/1.8) / (1 - 1/2)


def test_goal_out_of_reach_is_said_and_missing_metrics_are_na(tmp_path, capsys):
    run = _run(tmp_path / "s0", 0, tlt_rollout=2.0, base_rollout=3.0)
    (run / "baseline" / "checkpoint" / "metrics.json").unlink()
    assert main([str(run)]) == 0
    text = capsys.readouterr().out
    assert "is out of reach at s = 1.50x for any r" in text
    assert "| 2.00 / 3.00 | n/a | n/a |" in text and "rollout throughput ratio n/a" in text
    assert "run ratio (all measured steps' seconds) n/a" in text


def test_the_ratios_of_speedup_json_are_used_when_present(tmp_path, capsys):
    run = _run(tmp_path / "s0", 0, tlt_rollout=2.0, base_rollout=3.0)
    comparison = json.loads((run / "speedup.json").read_text())
    comparison["throughput_ratio"] = 1.25  # what tlt train writes now
    comparison["run_ratio"] = 1.5
    (run / "speedup.json").write_text(json.dumps(comparison))
    (run / "checkpoint" / "metrics.json").unlink()
    assert main([str(run)]) == 0
    assert "| 2.00 / 3.00 | 1.25x | 1.50x |" in capsys.readouterr().out


def test_missing_comparison_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no speedup.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--goal", "1"])


def test_whole_run_table_accuracy_spread_and_raw_json_round_trip(tmp_path, capsys):
    runs = [_run(tmp_path / f"s{i}", i, tlt_rollout=1.0 + i / 2, base_rollout=3.0) for i in range(3)]
    for run, (a, b) in zip(runs, [(0.25, 0.26), (0.27, 0.25), (0.26, 0.27)], strict=True):
        comparison = json.loads((run / "speedup.json").read_text())
        comparison["tlt"]["heldout_accuracy"], comparison["baseline"]["heldout_accuracy"] = a, b
        (run / "speedup.json").write_text(json.dumps(comparison))
    out = tmp_path / "seeds.md"
    assert main([str(r) for r in runs] + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    # seed 0: TLT 11 x (1 + 1) s, baseline 10 x (3 + 1) + (6 + 1) s; rollout 11 s against 36 s, r = 36 / 47
    assert f"| {runs[0]} | 0 | 2.14x | 3.27x | 77% | 2.14x | 1.00 |" in text
    assert "whole run, medians over seeds: **" in text
    assert "TLT 25.0%, 27.0%, 26.0% (median 26.0%), TLT off 26.0%, 25.0%, 27.0% (median 26.0%)" in text
    assert "differ by +0.0%, within the seed-to-seed spread of either arm (2.0%)" in text
    raw = json.loads(out.with_suffix(".json").read_text())["comparisons"]
    assert len(raw) == 3 and len(raw[0]["steps"]["baseline"]) == 11  # the measured steps of both arms
    assert main(["--from-json", str(out.with_suffix(".json"))]) == 0
    assert capsys.readouterr().out == text  # the table is written from the committed raw data
