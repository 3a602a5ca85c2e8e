"""The suffix drafter: what it indexes (prompt, own response, siblings as they grow, earlier calls), that every
draft is a continuation that occurred, its bounds and eviction, greedy identity through the engine with drafts
accepted, and that its history survives save / load and clone."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.drafters.engine_checks import GREEDY, AlwaysTuner, assert_same, plain
from tests.tiny_model import random_target
from tlt.backends.native import NativeEngine
from tlt.drafters import load_drafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.speculative.strategy import SpecStrategy

CHAIN = SpecStrategy.parse("4_1_5")


def _start(drafter: SuffixDrafter, prompts: list[list[int]]) -> None:
    width = max(map(len, prompts))
    tokens = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    drafter.start(tokens, None, torch.tensor([len(p) for p in prompts]))


def _append(drafter: SuffixDrafter, rows: list[list[int]]) -> None:
    """Commit rows[b] to row b (all rows the same number of tokens)."""
    tokens = torch.tensor(rows)
    drafter.append(tokens, None, torch.full((len(rows),), tokens.shape[1]))


def _chain(drafter: SuffixDrafter, strategy=CHAIN) -> list[list[int]]:
    return [row[1:] for row in drafter.propose(strategy).tokens.tolist()]


def test_drafts_from_the_prompt_and_the_rows_own_response():
    d = SuffixDrafter()
    _start(d, [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]])
    assert _chain(d)[0][:3] == [5, 6, 7]  # (a) the prompt's continuation of "1 2 3 4" (as long as the match)
    _append(d, [[20, 21, 22, 23, 24, 9, 20, 21, 22, 23]])
    assert _chain(d)[0][:2] == [24, 9]  # (b) its own response, after "20 21 22 23"


def test_drafts_from_a_sibling_as_it_grows_and_after_it_finished():
    d = SuffixDrafter()
    _start(d, [[7, 8], [7, 8]])  # one prompt, two samples
    _append(d, [[20, 21, 22, 23], [30, 31, 32, 33]])
    _append(d, [[24, 25, 26, 27], [20, 21, 22, 23]])  # row 1 now ends as row 0's response began
    assert _chain(d)[1][:3] == [24, 25, 26]  # (c) continues as row 0 did
    d.keep(torch.tensor([1]))  # row 0 finished
    _append(d, [[24]])
    assert _chain(d)[0][:3] == [25, 26, 27]  # a finished sibling's response stays visible


def test_drafts_from_earlier_calls_on_the_same_prompt_only():
    d = SuffixDrafter()
    _start(d, [[1, 2, 3, 7, 8], [1, 2, 3, 5, 6]])
    _append(d, [[40, 41, 42, 43], [50, 51, 52, 53]])
    _start(d, [[1, 2, 3, 7, 8], [1, 2, 3, 5, 6]])  # the next step: the same prompts again
    assert _chain(d)[0][:4] == [40, 41, 42, 43]  # (d) the earlier response to this prompt
    assert _chain(d)[1][:4] == [50, 51, 52, 53]
    _start(d, [[9, 9]])  # an unseen prompt: nothing earlier to draft from
    assert d.rows[0].history.responses == {0: []}


def _occurs(stream: list[int], context: list[int], draft: list[int]) -> bool:
    """Whether some suffix of `context` (>= 1 token) followed by `draft` occurs contiguously in `stream`."""
    for m in range(1, len(context) + 1):
        pattern = context[-m:] + draft
        if any(stream[i : i + len(pattern)] == pattern for i in range(len(stream) - len(pattern) + 1)):
            return True
    return False


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=3),  # prompts
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=12),  # appended chunks
)
def test_every_draft_occurred_after_the_matched_context(prompts, chunks):
    """Against a brute-force reference: the drafted path (before the filler) occurs in the row's own stream or
    in a response to the same prompt, right after a suffix of the row's context."""
    d = SuffixDrafter()
    _start(d, prompts)
    streams = [list(p) for p in prompts]
    for chunk in chunks:
        _append(d, [chunk] * len(prompts))
        for stream in streams:
            stream.extend(chunk)
        for b, row in enumerate(d.propose(CHAIN).tokens.tolist()):
            draft = row[1:]
            root = row[0]
            sources = [s for j, s in enumerate(streams) if prompts[j] == prompts[b]]  # prompt + response
            real = next(draft[:k] for k in range(len(draft) + 1) if all(t == root for t in draft[k:]))
            # (the filler, the root's token, pads the tail: the prefix before it is checked)
            assert not real or any(_occurs(s, streams[b], real) for s in sources)


def test_history_is_bounded_per_prompt_and_in_tokens_lru_first():
    d = SuffixDrafter(history_tokens=16, history_responses=2)  # a stored response: 2 prompt tokens + its own
    for step in range(3):
        _start(d, [[1, 1]])
        _append(d, [[10 + step] * 3])
    _start(d, [[2, 2]])  # the third response of [1, 1] finishes: the oldest of the three goes
    assert [h["responses"] for h in d.history()] == [[[11] * 3, [12] * 3], [[]]]
    _append(d, [[5] * 4])  # stored: 10 + 6
    _start(d, [[3, 3]])  # + 2 > 16: the least recently used prompt goes, not the running one
    assert [h["prompt"] for h in d.history()] == [[2, 2], [3, 3]]


def test_history_survives_save_load_and_clone(tmp_path):
    d = SuffixDrafter(history_responses=4)
    prompt = [1, 2, 3, 7, 8]
    _start(d, [prompt, prompt])
    _append(d, [[40, 41, 42], [43, 44, 45]])
    d.save(tmp_path / "suffix")
    for copy in (load_drafter(tmp_path / "suffix"), d.clone()):
        assert copy.history() == d.history() and copy.config() == d.config()
        _start(copy, [prompt])
        assert _chain(copy)[0][:3] in ([40, 41, 42], [43, 44, 45])


@pytest.mark.parametrize("text", ['[{"prompt": [1]}]', "[{", "7", '{"prompt": [1], "responses": []}'])
def test_a_corrupt_history_file_is_named(tmp_path, text):
    SuffixDrafter().save(tmp_path / "s")
    (tmp_path / "s" / "history.json").write_text(text)
    with pytest.raises(ValueError, match="history.json"):
        load_drafter(tmp_path / "s")


@pytest.mark.parametrize("strategy", ["3_1_4", "3_2_6"])
def test_greedy_sd_is_plain_decoding_with_drafts_accepted(strategy):
    """Greedy identity through the engine, rows sharing a prompt, a second call drafting from the first's."""
    target = random_target(0.15)
    prompts = [[5, 6, 7, 8], [5, 6, 7, 8], [10, 11], [40]]
    reference = plain(target, prompts=prompts)
    tuner = AlwaysTuner(SpecStrategy.parse(strategy))
    engine = NativeEngine(target, eos_token_id=None, max_seq_len=64, tuner=tuner, drafter=SuffixDrafter())
    for _ in range(2):  # the second call has the first call's responses to the same prompts
        rollouts = engine.generate(prompts, GREEDY)
        assert_same(rollouts, reference)
    assert sum(s.accepted_tokens for s in engine.step_stats) > 0


def test_tlt_train_keeps_the_suffix_history_in_its_checkpoint_and_resumes_with_it(tmp_path):
    """RL with drafter.kind=suffix: the engine drafts from the trainer's own drafter object, so the history
    of every step is what the checkpoint saves; a resumed run starts from it."""
    from tests.tiny_model import save_math_policy
    from tests.training.test_train_cli import CONFIG
    from tlt.cli import main

    save_math_policy(tmp_path / "model")
    config = tmp_path / "tlt.yaml"
    config.write_text(CONFIG.format(model=tmp_path / "model"))
    args = ["train", str(config), "drafter.kind=suffix", "scheduler.policy=never", "--output-dir", str(tmp_path / "rl")]
    assert main([*args, "grpo.steps=2"]) == 0
    saved = load_drafter(tmp_path / "rl" / "checkpoint" / "drafter")
    history = saved.history()
    assert sum(len(h["responses"]) for h in history) == 2 * 2 * 4  # 2 steps x 2 prompts x 4 samples
    assert main([*args, "grpo.steps=3"]) == 0
    resumed = load_drafter(tmp_path / "rl" / "checkpoint" / "drafter").history()
    assert sum(len(h["responses"]) for h in resumed) == 3 * 2 * 4


def test_the_config_sets_the_draft_length_keys_and_names_a_bad_one():
    from tlt.config import ConfigError, load_config

    cfg = load_config(None, ["drafter.kind=suffix", "drafter.suffix_spec_factor=4", "drafter.suffix_min_token_prob=0"])
    d = SuffixDrafter.from_config(cfg.drafter, None)
    assert (d.spec_factor, d.min_token_prob) == (4.0, 0.0)
    with pytest.raises(ConfigError, match="drafter.suffix_spec_factor"):
        load_config(None, ["drafter.suffix_spec_factor=0"])
    with pytest.raises(ConfigError, match="drafter.suffix_min_token_prob"):
        load_config(None, ["drafter.suffix_min_token_prob=1.5"])
    with pytest.raises(ValueError, match="spec_factor > 0"):
        SuffixDrafter(spec_factor=-1)


def test_a_larger_spec_factor_drafts_further_after_the_same_match():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # ends "1 2": a 2-token match with its start
    lengths = []
    for factor in (1.0, 4.0):
        d = SuffixDrafter(spec_factor=factor)
        d.start(torch.tensor([prompt]), None, torch.tensor([len(prompt)]))
        tree = d.propose(SpecStrategy.parse("8_1_9"))
        lengths.append(tree.real[0] - 1)
        assert tree.tokens[0, 1 : tree.real[0]].tolist() == prompt[2 : 2 + lengths[-1]]  # what followed "1 2"
    assert lengths == [2, 8]  # at most 1x / 4x the 2 matched tokens, and the strategy's 8


def test_a_tree_drafts_up_to_the_strategys_nodes_within_its_depth_and_width():
    """Four responses branch after "7 8": a 2-deep top-4 tree of 9 nodes holds all four two-token paths (more
    nodes than its depth); drafted nodes keep the depth and width; the filler after them is never drafted."""
    d = SuffixDrafter(spec_factor=8.0, min_token_prob=0.0)
    prompt = [7, 8]
    _start(d, [prompt] * 4)
    _append(d, [[10, 11], [20, 21], [30, 31], [40, 41]])
    _start(d, [prompt])  # the next step: the earlier four are history
    tree = d.propose(SpecStrategy.parse("2_4_12"))
    real = tree.real[0]
    tokens, parents = tree.tokens[0, :real].tolist(), tree.parents[0, :real].tolist()
    paths = {(tokens[i], tokens[j]) for j in range(real) for i in range(real) if parents[j] == i and parents[i] == 0}
    assert paths == {(10, 11), (20, 21), (30, 31), (40, 41)}
    assert real == 9 and int(tree.depths()[0, :real].max()) == 2
    assert (tree.parents[0, real:] == 0).all()  # filler under the root, past `real`


@settings(max_examples=60, deadline=None)
@given(
    paths=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), min_size=1, max_size=6),
    emitted=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    topk=st.integers(1, 3),
)
def test_followed_is_the_deepest_draft_path_the_emitted_tokens_start_with(paths, emitted, topk):
    """RowDraft.followed against a brute force over every node's root path (trees built as the drafter builds
    them, filler included)."""
    from tlt.drafters.ngram import _Trie
    from tlt.drafters.suffix import RowDraft

    trie = _Trie(0, SpecStrategy(steps=4, topk=topk, verify_tokens=5 if topk == 1 else 8))
    for path in paths:
        trie.insert(path)
    trie.pad(0)
    draft = RowDraft(trie.tokens, trie.parents, trie.real, score=0.0, match=1)

    def root_path(node):
        return [] if node == 0 else [*root_path(trie.parents[node]), trie.tokens[node]]

    expected = max(len(p) for p in map(root_path, range(trie.real)) if p == emitted[: len(p)])
    assert draft.followed(emitted) == expected


def test_a_prompt_longer_than_the_trees_depth_still_drafts_from_its_beginning():
    """Responses are indexed after the prompt's last max_depth tokens; a longer prompt keeps a tree of its own."""
    d = SuffixDrafter(max_depth=4)
    _start(d, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    _append(d, [[1, 2, 3]])
    assert _chain(d)[0][:1] == [4]  # "1 2 3" continued as "4" only before the lead (9 10 11 12)
