"""NgramDrafter: exact prompt-lookup proposals, lossless SD in NativeEngine, save/load and the registry."""

import json

import pytest
import torch

from tlt.drafters import load_drafter
from tlt.drafters.ngram import NgramDrafter
from tlt.speculative.strategy import SpecStrategy

from .engine_checks import STRATEGIES, assert_same, plain, ragged_eos, speculative


def _propose(history, strategy, **config):
    drafter = NgramDrafter(**config)
    tokens = torch.tensor([history])
    drafter.start(tokens, None, torch.tensor([len(history)]))
    tree = drafter.propose(SpecStrategy.parse(strategy))
    return tree.tokens[0].tolist(), tree.parents[0].tolist()


def test_chain_continues_the_latest_longest_match():
    # suffix (1, 2): latest earlier occurrence ends at index 5, followed by 3 5 1
    assert _propose([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], "3_1_4") == ([2, 3, 5, 1], [-1, 0, 1, 2])


def test_longer_ngram_wins_over_a_more_recent_shorter_one():
    # (1, 2, 3) occurred once (then 9); (2, 3) occurred more recently (then 8)
    history = [1, 2, 3, 9, 4, 2, 3, 8, 1, 2, 3]
    assert _propose(history, "1_1_2") == ([3, 9], [-1, 0])
    assert _propose(history, "1_2_3") == ([3, 9, 8], [-1, 0, 0])


def test_continuation_repeats_past_the_end_of_the_history():
    assert _propose([7, 8, 9, 7, 8], "4_1_5") == ([8, 9, 7, 8, 9], [-1, 0, 1, 2, 3])


def test_tree_merges_matches_and_pads_with_filler():
    # (1, 2) ends at 5 (then 3 5) and at 1 (then 3 4): a shared first token, two second ones; one filler
    tokens, parents = _propose([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], "2_2_5")
    assert (tokens, parents) == ([2, 3, 5, 4, 2], [-1, 0, 1, 1, 0])


def test_no_match_gives_filler_and_min_ngram_is_respected():
    assert _propose([1, 2, 3], "3_1_4") == ([3, 3, 3, 3], [-1, 0, 1, 2])
    history = [5, 1, 2, 9, 2]
    assert _propose(history, "1_1_2", min_ngram=1) == ([2, 9], [-1, 0])
    assert _propose(history, "1_1_2", min_ngram=2) == ([2, 2], [-1, 0])


@pytest.mark.parametrize("strategy", ["1_1_2", "3_1_4", "2_2_5", "3_3_9", "8_4_48", "4_2_3"])
def test_trees_are_well_formed(strategy):
    strategy = SpecStrategy.parse(strategy)
    drafter = NgramDrafter()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 6, (3, 40), generator=g)  # small alphabet: many matches
    drafter.start(tokens, None, torch.tensor([40, 7, 1]))
    drafter.append(torch.randint(0, 6, (3, 2), generator=g), None, torch.tensor([2, 1, 2]))
    tree = drafter.propose(strategy)
    assert tree.tokens.shape == tree.parents.shape == (3, strategy.verify_tokens)
    assert (tree.parents[:, 0] == -1).all()
    index = torch.arange(strategy.verify_tokens)
    assert ((tree.parents[:, 1:] >= 0) & (tree.parents[:, 1:] < index[1:])).all()
    assert int(tree.depths().max()) <= strategy.steps
    drafted = tree.real_mask()[:, 1:].long()  # the drafted nodes form a top-k tree; filler only keeps the shape
    children = torch.zeros(3, strategy.verify_tokens, dtype=torch.long)
    children.scatter_add_(1, tree.parents[:, 1:], drafted)
    assert int(children.max()) <= strategy.topk
    assert int(drafted.sum()) > 0  # the small alphabet matched


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
@pytest.mark.parametrize("target", ["native_target", "looping_target"])
def test_sd_greedy_equals_plain(request, target, strategy):
    model = request.getfixturevalue(target)
    sd, stats = speculative(model, NgramDrafter(), strategy)
    assert_same(sd, plain(model))
    if target == "looping_target":  # repetitive output: lookups are right most of the time
        assert sum(s.accepted_tokens for s in stats) >= len(stats)


def test_accepts_on_repetitive_prompts(looping_target):
    """The target continues the prompt's period-6 pattern with 38s: every 3-token lookup is accepted."""
    prompts = [[5, 17, 17, 17, 38, 38, 38, 17, 17, 17, 38, 38, 38]]
    sd, stats = speculative(looping_target, NgramDrafter(), STRATEGIES[1], prompts=prompts)
    assert_same(sd, plain(looping_target, prompts=prompts))
    assert [s.accepted_tokens for s in stats] == [3, 3, 3, 3]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_rows_finishing_at_different_steps(native_target, strategy):
    eos = ragged_eos(native_target)
    sd, stats = speculative(native_target, NgramDrafter(), strategy, eos=eos)
    assert_same(sd, plain(native_target, eos=eos))
    assert len({s.running_batch for s in stats}) >= 3  # keep() dropped rows twice during SD


def test_save_load_round_trip(tmp_path):
    drafter = NgramDrafter(max_ngram=5, min_ngram=2, max_matches=8)
    drafter.save(tmp_path / "ngram")
    drafter.save(tmp_path / "ngram")  # overwriting an existing folder
    meta = json.loads((tmp_path / "ngram" / "tlt_drafter.json").read_text())
    assert meta == {"kind": "ngram", "max_ngram": 5, "min_ngram": 2, "max_matches": 8}
    for loaded in (NgramDrafter.load(tmp_path / "ngram"), load_drafter(tmp_path / "ngram")):
        assert isinstance(loaded, NgramDrafter) and loaded.config() == drafter.config()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ngram"]  # no temporary folders left


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="drafter folder not found"):
        load_drafter(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no tlt_drafter.json"):
        load_drafter(tmp_path / "empty")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "tlt_drafter.json").write_text('{"kind": "oracle"}')
    with pytest.raises(
        ValueError, match="unknown drafter kind 'oracle'; available: composed, eagle, ngram, small_lm, suffix"
    ):
        load_drafter(tmp_path / "odd")


def test_invalid_config():
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        NgramDrafter(max_ngram=2, min_ngram=3)
