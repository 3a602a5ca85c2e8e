"""The adaptive-rollout benchmark's pieces: reference bucket table, decision table, and a smoke run."""

import json
from types import SimpleNamespace

import pytest

from tlt.eval.bench.adaptive import ReferenceTuner, decision_table, main, summarise, tuners
from tlt.models.io import save_hf_folder
from tlt.models.presets import build_model
from tlt.models.tokenizer import train_tokenizer
from tlt.speculative.strategy import SpecStrategy


@pytest.fixture(scope="module")
def bench_target(tmp_path_factory):
    """A random test-preset target with a tokenizer trained on a few prompts, saved as an HF folder."""
    tokenizer = train_tokenizer(["Question: Calculate 1 + 2 - 3.\nSolution:\n1 + 2 = 3"] * 20, vocab_size=300)
    model = build_model("test", len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return save_hf_folder(model, tokenizer, tmp_path_factory.mktemp("bench") / "model")


def test_reference_tuner_maps_buckets_and_turns_sd_off_above_32():
    tuner = ReferenceTuner(["4_1_5", "3_1_4", "2_1_3", "2_1_3"])
    picks = {b: tuner.select(b) for b in (1, 2, 4, 5, 20, 21, 32, 33, 512)}
    assert picks[1] == SpecStrategy.parse("4_1_5")
    assert picks[2] == picks[4] == SpecStrategy.parse("3_1_4")
    assert picks[5] == picks[20] == SpecStrategy.parse("2_1_3")
    assert picks[21] == picks[32] == SpecStrategy.parse("2_1_3")
    assert picks[33] is None and picks[512] is None


def test_every_configuration_is_built_fresh():
    names = list(tuners(["2_1_3", "4_1_5"], seed=0))
    assert names == [
        "sd-never",
        "always-2_1_3",
        "always-4_1_5",
        "reference",
        "adaptive-cost",
        "adaptive-beg",
        "adaptive-ucb1",
    ]


def test_decision_table_shares_per_power_of_two_range():
    table = decision_table([(1, "2_1_3"), (1, None), (3, "4_1_5"), (2, "4_1_5"), (64, None)])
    assert table == {"1-1": {"2_1_3": 0.5, "plain": 0.5}, "2-3": {"4_1_5": 1.0}, "64-127": {"plain": 1.0}}


def test_smoke_run_writes_report_and_plot(tmp_path, bench_target):
    out = tmp_path / "out"
    argv = [
        "--target",
        str(bench_target),
        "--prompts",
        "2",
        "--samples",
        "2",
        "--max-new-tokens",
        "12",
        "--repeats",
        "1",
        "--strategies",
        "2_1_3",
        "--configs",
        "always-2_1_3,adaptive-cost",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads((out / "adaptive.json").read_text())
    assert set(report["results"]) == {"sd-never", "always-2_1_3", "adaptive-cost"}
    assert report["results"]["sd-never"]["tuner_us_per_step"] == 0  # no drafter: plain decoding, tuner never asked
    assert (out / "adaptive_decisions.png").stat().st_size > 1000
    assert "speedup vs sd-never" in (out / "adaptive.md").read_text()


def test_summary_tables_the_decisions_of_every_timed_round_and_plots_the_last():
    engine = SimpleNamespace(tuner=SimpleNamespace(seconds=0.003, calls=30), step_stats=[])
    rounds = [
        {"wall": w, "tokens": 100, "accepted": 2.0, "sd_share": 1.0, "decisions": d}
        for w, d in ((2.0, [(4, "3_1_4"), (1, "5_1_6")]), (1.0, [(4, None)]), (3.0, [(1, "3_1_4")]))
    ]
    summary = summarise(rounds, engine)
    assert summary["wall_s"] == 2.0 and summary["tuner_us_per_step"] == 100.0
    assert summary["decisions_last"] == [(1, "3_1_4")]
    assert decision_table(summary["decisions"]) == {
        "1-1": {"5_1_6": 0.5, "3_1_4": 0.5},
        "4-7": {"3_1_4": 0.5, "plain": 0.5},
    }
