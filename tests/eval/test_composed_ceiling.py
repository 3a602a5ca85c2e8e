"""eval.composed_ceiling: the replay's arithmetic, its bookkeeping of rows through the engine, a short run, and the
committed reports render from their raw data."""

import json
from pathlib import Path

import pytest

from eval.composed_ceiling import Observed, _suffixes, main, table, tally
from tests.tiny_model import save_math_policy
from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters.eagle import EagleDrafter
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners.base import FixedTuner

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


def test_the_suffix_branch_is_credited_its_match_plus_the_bonus_and_the_merged_tree_the_longer_branch():
    responses = [[1, 2, 3, 4, 5]]
    records = [
        (0, 1, 2, 2, [[2, 3, 9], [2, 3, 4, 5, 6]]),  # ahead 2 3 4 5: matches 2 and 4 (the response ends there)
        (0, 4, 1, 1, [[], [7]]),  # ahead 5: nothing drafted, a miss
    ]
    out = {"short": {}, "long": {}}
    tally(records, responses, out)
    assert out["short"]["2"] == {
        "verifies": 1, "eagle": 2, "suffix": 3, "merged": 3, "suffix_longer": 1, "suffix_nodes": 3,
    }  # fmt: skip
    assert out["long"]["2"]["suffix"] == 4 and out["long"]["2"]["merged"] == 4  # capped by the response's end
    assert out["short"]["1"]["suffix"] == 1 and out["long"]["1"]["merged"] == 1
    assert out["long"]["1"]["suffix_longer"] == 0 and out["long"]["1"]["suffix_nodes"] == 1


def test_verifies_are_summed_per_range_of_the_long_tail_tables_across_calls():
    out = {"chain": {}}
    for rows in (1, 2, 3, 4, 5, 16, 17, 64):
        tally([(0, 0, rows, 1, [[7]])], [[7, 8]], out)  # a second call adds to the first's sums
    counts = {key: sums["verifies"] for key, sums in out["chain"].items()}
    assert counts == {"1": 1, "2": 1, "3-4": 2, "5-8": 1, "9-16": 1, "17-32": 1, ">= 33": 1}
    assert out["chain"]["3-4"]["suffix"] == 4  # each: the match of 1 plus the bonus


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ceiling")
    policy = save_math_policy(folder / "policy")
    model, tokenizer = load_hf_folder(policy)
    EagleDrafter.from_target(model).save(folder / "drafter")
    return folder


def test_every_verify_is_recorded_at_its_rows_position_in_the_response(policy):
    """Rows finish at different steps (the engine drops them); each sequence's records must still tile its
    response: the first at position 1 (the prefill's token), each the last one plus what that verify emitted."""
    model, tokenizer = load_hf_folder(policy / "policy")
    prompts = [tokenizer.encode("1+2="), tokenizer.encode("13+29=")]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=20, seed=3)

    def generate(eos):
        observed = Observed(EagleDrafter.from_target(model), _suffixes("3_1_4:1", []))
        tuner = FixedTuner("3_1_4", threshold=1 << 30)
        engine = NativeEngine(model, eos, 64, tuner=tuner, drafter=observed)
        return observed, engine.generate(prompts, sampling, n=3)

    _, first = generate(None)
    observed, rollouts = generate(int(first[0].token_ids[3]))  # a token row 0 emits early ends its response
    lengths = [r.token_ids.numel() for r in rollouts]
    assert len(set(lengths)) > 1  # some rows finished early
    for seq, length in enumerate(lengths):
        mine = sorted((r for r in observed.records if r[0] == seq), key=lambda r: r[1])
        positions = [r[1] for r in mine]
        assert positions[0] == 1
        assert positions[1:] == [p + r[3] for p, r in zip(positions, mine, strict=False)][: len(positions) - 1]
        assert positions[-1] + mine[-1][3] == length


def test_a_short_run_writes_its_table(policy, tmp_path):
    out = tmp_path / "out"
    argv = ["--target", str(policy / "policy"), "--drafter", str(policy / "drafter"), "--prompts", "2"]
    argv += [
        "--samples",
        "2",
        "--max-new-tokens",
        "12",
        "--rounds",
        "2",
        "--suffix",
        "3_1_4:1,7_1_8:2",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads((out / "composed_ceiling.json").read_text())
    assert len(report["rounds"]) == 2 and set(report["rounds"][0]) == {"3_1_4:1", "7_1_8:2"}
    assert (out / "composed_ceiling.md").read_text() == table(report)


@pytest.mark.parametrize("folder", ["composed_ceiling_deep_v2", "composed_ceiling_deep_v2_7_1_8"])
def test_the_committed_report_renders_from_its_json(folder):
    report = json.loads((RESULTS / folder / "composed_ceiling.json").read_text())
    assert table(report) == (RESULTS / folder / "composed_ceiling.md").read_text()
