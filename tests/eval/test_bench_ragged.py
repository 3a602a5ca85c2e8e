"""eval.bench_ragged, eval.bench_suffix and eval.bench_suffix_b1: report arithmetic, and the committed reports
render from their raw data."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eval.bench_ragged import _bucket, summarize, table
from eval.bench_suffix import accepted_length, hindsight, replay, summary
from eval.bench_suffix import table as suffix_table
from eval.bench_suffix_b1 import summarize as b1_summarize
from eval.bench_suffix_b1 import table as b1_table
from tlt.drafters.suffix import SuffixDrafter
from tlt.speculative.strategy import SpecStrategy

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


@pytest.mark.parametrize(
    ("folder", "name", "render"),
    [
        ("ragged_tiny", "ragged", table),
        ("suffix_b1_tiny", "suffix_b1", b1_table),
        ("suffix_b1_deep_v2", "suffix_b1", b1_table),
    ],
)
def test_the_committed_report_renders_from_its_json(folder, name, render):
    report = json.loads((RESULTS / folder / f"{name}.json").read_text())
    assert render(report) == (RESULTS / folder / f"{name}.md").read_text()


def test_the_committed_suffix_reports_render_from_their_json():
    for folder in (
        "suffix_deep_v2",
        "suffix_deep_v2_tree",
        "suffix_deep_v2_tree256",
        "suffix_tiny",
        "suffix_tiny_tree256",
    ):
        report = json.loads((RESULTS / folder / "suffix.json").read_text())
        assert suffix_table(report) == (RESULTS / folder / "suffix.md").read_text()


def test_batch_sizes_fall_in_inclusive_buckets():
    assert [_bucket(n) for n in (1, 2, 4, 5, 8, 9, 16, 17, 128)] == ["1", "2-4", "2-4", "5-8", "5-8", "9-16",
                                                                       "9-16", "17+", "17+"]  # fmt: skip


def test_rates_sum_over_rounds_and_compare_with_plain_per_round_and_per_bucket():
    def run(seconds, tokens, sd_tokens, buckets):
        counts = {"sd_verifies": 10, "accepted": 5, "drafted": 20}
        return {"seconds": seconds, "tokens": tokens, "sd_tokens": sd_tokens, "buckets": buckets} | counts

    plain = run(1.0, 100, 0, {"1": [10, 0.5, 0], "9-16": [90, 0.5, 0]})
    sd = [run(s, 100, 50, {"1": [10, 0.25, 10], "9-16": [90, 0.75, 40]}) for s in (0.5, 2.0)]
    rounds = [{"plain": [plain] * 2, "padded": [x] * 2, "ragged": [x] * 2, "ragged_cost": [x] * 2} for x in sd]
    rows = {(r["pass"], r["arm"]): r for r in summarize({"rounds": rounds})}
    ragged = rows[(2, "ragged")]
    assert ragged["tokens_per_second"] == 200 / 2.5 and ragged["vs_plain"] == 0.8
    assert ragged["vs_plain_median"] == (2.0 + 0.5) / 2 and ragged["vs_plain_range"] == [0.5, 2.0]
    assert ragged["tokens_per_verify"] == 1.5 and ragged["drafted_per_verify"] == 2.0
    assert ragged["buckets"]["1"] == {"tokens_per_second": 40.0, "sd_share": 1.0}
    assert ragged["buckets"]["9-16"] == {"tokens_per_second": 120.0, "sd_share": 80 / 180}
    report = {"rounds": rounds, "settings": {"target": "t", "prompts": 2, "group": 1, "samples": 2,
              "max_new_tokens": 8, "strategy": "5_1_6", "strategies": "3_1_4", "rounds": 2}, "machine": {}}  # fmt: skip
    assert "| 2 | ragged | 40 (2.00x, SD 100%) | 120 (0.67x, SD 44%) |" in table(report)


def test_replayed_acceptance_walks_a_tree_to_the_realized_tokens():
    # root -> 7 -> 8 -> 9 and root -> 5 -> 6: the realized 5, 6, 4 takes the second branch for two tokens
    tokens, parents = [0, 7, 5, 8, 6, 9], [-1, 0, 0, 1, 2, 3]
    assert accepted_length(tokens, parents, [5, 6, 4]) == 2
    assert accepted_length(tokens, parents, [7, 8, 9, 1]) == 3
    assert accepted_length(tokens, parents, [7, 8]) == 2  # no further than the realized tokens
    assert accepted_length(tokens[:3], parents[:3], [7, 8, 9]) == 1  # nodes past a row's real count are not there


def _hindsight_brute_force(prompts, earlier, responses, n, steps, min_match):
    """The bound written out: at every step scan all seen text for the context's last min_match tokens."""
    committed = [r[:1] for r in responses]
    per_row = [[] for _ in responses]
    while any(len(c) < len(r) for c, r in zip(committed, responses, strict=True)):
        commits = {}
        for i, response in enumerate(responses):
            if len(committed[i]) == len(response):
                continue
            group = i // n
            seen = [prompts[group] + r for past in earlier for r in past[group * n : (group + 1) * n]]
            seen += [prompts[group] + committed[j] for j in range(group * n, group * n + n)]
            context, rest = prompts[group] + committed[i], response[len(committed[i]) :][: steps + 1]
            best = 0
            for text in seen:
                for at in range(min_match, len(text)):
                    if text[at - min_match : at] == context[-min_match:]:
                        k = 0
                        while k < len(rest) - 1 and at + k < len(text) and text[at + k] == rest[k]:
                            k += 1
                        best = max(best, k)
            per_row[i].append(best + 1)
            commits[i] = rest[: best + 1]
        for i, tokens in commits.items():
            committed[i] += tokens
    return per_row


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 3),
    steps=st.integers(1, 5),
    min_match=st.integers(1, 2),
)
def test_hindsight_bound_matches_a_brute_force_scan_and_bounds_the_suffix_drafter(data, n, steps, min_match):
    tokens = st.lists(st.integers(0, 3), min_size=1, max_size=12)  # 4 symbols: many repeats
    prompts = data.draw(st.lists(tokens, min_size=1, max_size=2))
    passes = [data.draw(st.lists(tokens, min_size=n * len(prompts), max_size=n * len(prompts))) for _ in range(2)]
    for p in range(2):
        bound = hindsight(prompts, passes[:p], passes[p], n, steps, min_match)
        assert bound == _hindsight_brute_force(prompts, passes[:p], passes[p], n, steps, min_match)
        assert [sum(row) for row in bound] == [len(r) - 1 for r in passes[p]]  # every token committed once


def test_no_suffix_draft_beats_the_hindsight_bound_on_repetitive_rollouts():
    pytest.importorskip("arctic_inference")
    rng = random.Random(0)
    phrases = [[rng.randrange(20) for _ in range(6)] for _ in range(5)]
    prompts = [[rng.randrange(20) for _ in range(5)] for _ in range(3)]
    passes = [[sum((rng.choice(phrases) for _ in range(6)), []) for _ in range(12)] for _ in range(2)]
    drafter, strategy = SuffixDrafter(), SpecStrategy.parse("6_2_12")
    for p in range(2):
        drafted = summary(*replay(drafter, prompts, passes[p], 4, strategy)[:2], passes[p], 4)["tokens_per_verify"]
        bound = summary(hindsight(prompts, passes[:p], passes[p], 4, 6, 1), [], passes[p], 4)["tokens_per_verify"]
        assert 1.5 < drafted <= bound  # the drafter does accept here, and never more than the bound


def test_batch_one_arms_sum_over_rounds_and_compare_with_plain_per_round():
    def run(seconds, tokens, sd_steps=0, sd_tokens=0, drafted=0):
        return {"seconds": seconds, "tokens": tokens, "sd_steps": sd_steps, "sd_tokens": sd_tokens, "drafted": drafted}

    rounds = [
        {"plain": run(1.0, 100), "chain": run(0.5, 100, 40, 80, 120)},
        {"plain": run(2.0, 100), "chain": run(2.0, 100, 60, 120, 180)},
    ]
    rows = {r["arm"]: r for r in b1_summarize({"rounds": rounds, "arms": {"chain": ("5_1_6", 1.0, 0.1)}})}
    chain = rows["chain"]
    assert chain["tokens_per_second"] == 200 / 2.5 and chain["strategy"] == "5_1_6"
    assert chain["ratio_median"] == (2.0 + 1.0) / 2 and chain["ratio_range"] == (1.0, 2.0)
    assert chain["tokens_per_sd_step"] == 2.0 and chain["drafted_per_sd_step"] == 3.0
    assert rows["plain"]["ratio_median"] == 1.0 and rows["plain"]["tokens_per_sd_step"] == 0
