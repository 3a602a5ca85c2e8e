"""eval.suffix_trust: the per-class sums, a short run through the engine, and the committed report renders from
its raw data."""

import json
from pathlib import Path

import pytest

from eval.suffix_trust import main, table, tally
from tests.tiny_model import save_math_policy
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.suffix import RowDraft
from tlt.models.io import load_hf_folder

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


def chain(tokens, score, match) -> RowDraft:
    return RowDraft([0, *tokens, 0], list(range(-1, len(tokens) + 1)), len(tokens) + 1, score, match)


def test_chains_are_summed_per_match_class_against_what_their_row_emitted_later():
    responses = [[1, 2, 3, 4, 5]]
    records = [
        (0, 1, 2, 3, [chain([2, 3, 9], 2.5, 1)]),  # ahead 2 3 4 5: followed for 2; EAGLE accepted 2
        (0, 2, 2, 1, [chain([3, 4, 5, 6], 3.0, 3)]),  # ahead 3 4 5: followed to the response's end
        (0, 4, 1, 1, [chain([], 0.0, 0)]),  # nothing drafted: not counted
        (0, 3, 1, 2, [chain([7], 1.0, 20)]),
    ]
    out = {}
    tally(records, responses, out)
    assert out == {
        "1-1": {"verifies": 1, "score": 2.5, "followed": 2, "eagle_accepted": 2},
        "2-3": {"verifies": 1, "score": 3.0, "followed": 3, "eagle_accepted": 0},
        "16-31": {"verifies": 1, "score": 1.0, "followed": 0, "eagle_accepted": 1},
    }


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trust")
    model, _ = load_hf_folder(save_math_policy(folder / "policy"))
    EagleDrafter.from_target(model).save(folder / "drafter")
    return folder


def test_a_short_run_writes_its_table_with_both_passes(policy, tmp_path):
    out = tmp_path / "out"
    argv = ["--target", str(policy / "policy"), "--drafter", str(policy / "drafter"), "--prompts", "2"]
    argv += ["--samples", "4", "--max-new-tokens", "24", "--rounds", "2", "--strategy", "3_1_4", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "suffix_trust.json").read_text())
    assert len(report["rounds"]) == 2 and all(len(r) == 2 for r in report["rounds"])
    assert sum(s["verifies"] for r in report["rounds"] for s in r[1].values()) > 0  # a pass later drafted
    assert (out / "suffix_trust.md").read_text() == table(report)


@pytest.mark.parametrize("folder", ["suffix_trust_deep_v2"])
def test_the_committed_report_renders_from_its_json(folder):
    report = json.loads((RESULTS / folder / "suffix_trust.json").read_text())
    assert table(report) == (RESULTS / folder / "suffix_trust.md").read_text()
