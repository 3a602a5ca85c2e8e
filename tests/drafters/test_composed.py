"""The composed drafter (EAGLE + suffix, chosen per row): lossless through the engine, both parts drafting,
per-drafter attribution, copies and saved folders."""

import pytest
import torch

from tests.drafters.engine_checks import GREEDY, AlwaysTuner, assert_same, plain
from tests.tiny_model import random_target
from tlt.backends.native import NativeEngine
from tlt.drafters import load_drafter
from tlt.drafters.composed import MATCH_CLASSES, MEMORY, ComposedDrafter, match_class
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.ngram import NgramDrafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 8], [10, 11], [40]]


@pytest.fixture(scope="module")
def target():
    return random_target(0.15)


def composed(target, seed=0) -> ComposedDrafter:
    return ComposedDrafter(EagleDrafter.from_target(target, seed=seed), SuffixDrafter())


@pytest.mark.parametrize("strategy", ["3_1_4", "3_2_6"])
def test_greedy_sd_is_plain_decoding_with_both_drafters_accepted(target, strategy):
    """Greedy identity through the engine over two calls on the same prompts (the second drafts from the
    first's responses); both the learned and the suffix drafter drafted rows and had drafts accepted."""
    reference = plain(target, prompts=PROMPTS)
    drafter = composed(target)
    engine = NativeEngine(target, None, 64, tuner=AlwaysTuner(SpecStrategy.parse(strategy)), drafter=drafter)
    for _ in range(2):
        assert_same(engine.generate(PROMPTS, GREEDY), reference)
    counts = drafter.attribution()
    assert counts["learned"]["verifies"] > 0 and counts["suffix"]["verifies"] > 0
    assert counts["suffix"]["accepted"] > 0
    accepted = sum(s.accepted_tokens for s in engine.step_stats)
    assert counts["learned"]["accepted"] + counts["suffix"]["accepted"] >= accepted  # two calls counted


REPEATS, NEW = [5, 6, 7, 8, 5, 6, 7], [1, 2, 3, 4, 9, 10, 11]  # the suffix drafter continues the first only


def trusting(drafter: ComposedDrafter) -> ComposedDrafter:
    """Its record as if every match class's suffix drafts had been followed for as many tokens as expected
    (plus one: trust 1)."""
    drafter.record.suffix_sums = [[1.0, 0.0] for _ in range(MATCH_CLASSES)]
    return drafter


def _start(drafter, target, prompts) -> None:
    tokens = torch.tensor(prompts)
    hidden = torch.zeros(len(prompts), tokens.shape[1], target.config.hidden_size)
    drafter.bind(target)
    drafter.start(tokens, hidden, torch.full((len(prompts),), tokens.shape[1]))


def test_a_suffix_row_takes_the_suffix_chain_with_a_one_hot_q(target):
    """At T > 0 a row the suffix drafter wins carries its chain and q one-hot on it; the others keep the
    learned drafter's sampled chain and q."""
    from tlt.speculative.sampling import SamplingParams

    d = trusting(composed(target))
    _start(d, target, [REPEATS, NEW])
    strategy = SpecStrategy.parse("3_1_4")
    d.record.learned_accepted[strategy] = 0.5  # the learned drafter has been accepting half a token
    learned = d.learned.propose_sampled(strategy, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    d.learned.propose_sampled = lambda *args: learned  # the same draw for the composition to merge
    scored = d.suffix.propose_scored(strategy)
    drafted, scores = scored.tree, [row.score for row in scored.rows]
    tree = d.propose_sampled(strategy, SamplingParams(temperature=1.0), None)
    for b, score in enumerate(scores):
        if score > 0.5:  # REPEATS: "5 6 7" continues as "8 5 6" in the prompt
            assert tree.tokens[b].tolist() == drafted.tokens[b].tolist()
            one_hot = torch.nn.functional.one_hot(drafted.tokens[b, 1:], tree.draft_probs.shape[-1]).float()
            assert torch.equal(tree.draft_probs[b], one_hot)
        else:
            assert torch.equal(tree.tokens[b], learned.tokens[b])
            assert torch.equal(tree.draft_probs[b], learned.draft_probs[b])
    assert scores[0] > 0.5 >= scores[1]


def test_the_learned_drafter_drafts_every_row_until_it_has_a_record(target):
    d = composed(target)
    _start(d, target, [REPEATS, REPEATS])
    strategy = SpecStrategy.parse("3_1_4")
    tree = d.propose(strategy)
    assert torch.equal(tree.tokens, d.learned.propose(strategy).tokens)
    d.append(torch.tensor([[8, 5], [9, 9]]), torch.zeros(2, 2, target.config.hidden_size), torch.tensor([2, 1]))
    assert d.record.learned_accepted[strategy] == pytest.approx(0.5)  # (1 + 0) / 2 rows
    assert d.attribution()["learned"] == {"verifies": 2, "accepted": 1}


def test_a_push_shares_the_suffix_history_and_the_record_a_clone_copies_them(target):
    d = composed(target)
    pushed, twin = d.for_engine(), d.clone()
    assert pushed.suffix is d.suffix and pushed.record is d.record and pushed.learned is not d.learned
    assert twin.suffix is not d.suffix and twin.record is not d.record
    probe = pushed.probe()
    assert probe.suffix is not d.suffix and probe.record is not d.record


def test_save_and_load_keep_both_parts_and_the_history(target, tmp_path):
    d = composed(target)
    engine = NativeEngine(target, None, 64, tuner=AlwaysTuner(SpecStrategy.parse("3_1_4")), drafter=d)
    engine.generate(PROMPTS, GREEDY)
    d.save(tmp_path / "c")
    loaded = load_drafter(tmp_path / "c")
    assert isinstance(loaded, ComposedDrafter) and loaded.parts == ["eagle", "suffix"]
    assert loaded.suffix.history() == d.suffix.history()
    assert loaded.record.learned_accepted == d.record.learned_accepted and d.record.learned_accepted
    assert loaded.record.suffix_sums == d.record.suffix_sums and any(f or e for f, e in d.record.suffix_sums)
    for a, b in zip(loaded.learned.head.state_dict().values(), d.learned.head.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("record", ["{", '{"learned_accepted": {"5_1": 1.0}, "suffix_sums": []}', "[1, 2]"])
def test_a_corrupt_record_is_named_and_the_folder_left_as_it_was(target, tmp_path, record):
    composed(target).save(tmp_path / "c")
    (tmp_path / "c" / "record.json").write_text(record)
    with pytest.raises(ValueError, match="record.json"):
        load_drafter(tmp_path / "c")
    assert (tmp_path / "c" / "record.json").read_text() == record


@pytest.mark.parametrize("parts", [("suffix", "suffix"), ("eagle", "ngram")])
def test_a_wrong_pair_of_drafters_is_refused(target, parts):
    make = {"suffix": SuffixDrafter, "eagle": lambda: EagleDrafter.from_target(target), "ngram": NgramDrafter}
    with pytest.raises(ValueError, match="learned drafter plus a suffix drafter"):
        ComposedDrafter(*(make[p]() for p in parts))


def test_trees_swap_whole_rows(target):
    d = trusting(composed(target))
    _start(d, target, [REPEATS])
    strategy = SpecStrategy.parse("3_2_6")
    d.record.learned_accepted[strategy] = 0.0
    tree = d.propose(strategy)
    drafted = d.suffix.propose_scored(strategy).tree
    assert isinstance(tree, DraftTree) and tree.draft_probs is None
    assert tree.tokens.tolist() == drafted.tokens.tolist() and tree.parents.tolist() == drafted.parents.tolist()


def test_tlt_train_with_eagle_plus_suffix_trains_eagle_attributes_rows_and_resumes_the_history(tmp_path):
    """RL with drafter.kind=eagle+suffix: the EAGLE part trains (between steps), the metrics count the rows each
    part drafted, and the checkpoint's composed drafter carries the suffix history into a resumed run."""
    import json

    from tests.tiny_model import save_math_policy
    from tests.training.test_train_cli import CONFIG
    from tlt.cli import main

    save_math_policy(tmp_path / "model")
    config = tmp_path / "tlt.yaml"
    config.write_text(CONFIG.format(model=tmp_path / "model"))
    args = ["train", str(config), "drafter.kind=eagle+suffix", "--output-dir", str(tmp_path / "rl")]
    assert main([*args, "grpo.steps=2"]) == 0
    metrics = json.loads((tmp_path / "rl" / "checkpoint" / "metrics.json").read_text())
    assert sum(m["drafter_steps"] for m in metrics) > 0  # the EAGLE part trained
    assert sum(m["learned_verifies"] + m["suffix_verifies"] for m in metrics) > 0
    saved = load_drafter(tmp_path / "rl" / "checkpoint" / "drafter")
    assert isinstance(saved, ComposedDrafter)
    assert sum(len(h["responses"]) for h in saved.suffix.history()) == 2 * 2 * 4  # 2 steps x 2 prompts x 4
    assert saved.record.learned_accepted  # the choice's record went into the checkpoint with it
    assert load_drafter(tmp_path / "rl" / "drafter_latest").kind == "eagle"  # the trained part's checkpoint
    assert main([*args, "grpo.steps=3"]) == 0
    resumed = load_drafter(tmp_path / "rl" / "checkpoint" / "drafter").suffix.history()
    assert sum(len(h["responses"]) for h in resumed) == 3 * 2 * 4


def test_a_composed_kind_the_config_does_not_know_is_refused():
    from tlt.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="drafter.kind.*eagle\\+suffix"):
        load_config(None, ["drafter.kind=eagle+ngram"])


SHORT = [20 + i for i in range(33)] + [5, 6, 7, 8, 5, 6, 7]  # "5 6 7" matched: a short match
LONG = [40 + i for i in range(20)] * 2  # the last 20 tokens matched: a long match


def test_every_rows_suffix_draft_is_scored_against_what_the_row_emitted_per_match_class(target):
    """Learned rows too: the tokens a row emitted show how far its suffix draft would have gone, and its class's
    trust (0 before any draft was scored) follows: 0 for drafts not followed, near 1 for drafts followed."""
    d = composed(target)
    _start(d, target, [SHORT, LONG])
    strategy = SpecStrategy.parse("3_1_4")
    d.record.learned_accepted[strategy] = 10.0  # no suffix draft beats it: both rows take the learned draft
    short, long = d.suffix.propose_scored(strategy).rows
    assert match_class(short.match) != match_class(long.match) and short.score > 1 and long.score > 1
    assert torch.equal(d.propose(strategy).tokens, d.learned.propose(strategy).tokens)
    emitted = torch.tensor([[9, 0, 0, 0], [*long.tokens[1:4], 7]])  # row 0 leaves its suffix draft, row 1 follows it
    d.append(emitted, torch.zeros(2, 4, target.config.hidden_size), torch.tensor([1, 4]))
    assert d.record.trust(short.match) == 0.0
    assert d.record.trust(long.match) == pytest.approx(3 / (long.score + 1))
    assert d.attribution() == {"learned": {"verifies": 2, "accepted": 3}, "suffix": {"verifies": 0, "accepted": 0}}


def test_a_distrusted_match_class_keeps_its_rows_on_the_learned_draft_while_others_take_the_suffix(target):
    strategy = SpecStrategy.parse("3_1_4")
    d = trusting(composed(target))
    _start(d, target, [SHORT, LONG])
    short, long = d.suffix.propose_scored(strategy).rows
    d.record.suffix_sums[match_class(short.match)] = [0.0, 10.0]  # its drafts were followed for none of 10 tokens
    d.record.learned_accepted[strategy] = 1.0
    tree, learned = d.propose(strategy), d.learned.propose(strategy)
    assert torch.equal(tree.tokens[0], learned.tokens[0])
    assert tree.tokens[1].tolist() == long.tokens[: tree.num_nodes]


def test_suffix_rows_that_accept_less_than_their_score_make_the_next_ones_of_their_class_rarer(target):
    d = trusting(composed(target))
    _start(d, target, [REPEATS])
    strategy = SpecStrategy.parse("3_1_4")
    d.record.learned_accepted[strategy] = 1.0
    (row,) = d.suffix.propose_scored(strategy).rows
    assert d.propose(strategy).tokens[0].tolist() == row.tokens  # the suffix row (score > 1)
    d.append(torch.tensor([[9]]), torch.zeros(1, 1, target.config.hidden_size), torch.tensor([1]))  # none accepted
    assert d.record.trust(row.match) == pytest.approx((1 - MEMORY) / ((1 - MEMORY) * 0 + row.score + 1))
    assert d.attribution()["suffix"] == {"verifies": 1, "accepted": 0}
    assert row.score * d.record.trust(row.match) < 1.0  # the same draft no longer beats the learned drafter
    assert d.record.trust(row.match * 8) == 1.0  # another class: as it was
