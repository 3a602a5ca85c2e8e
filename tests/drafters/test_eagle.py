"""EAGLE drafter: lossless in the engine, cache == full recompute (chain, EAGLE-2 tree), state, save/load."""

import json

import pytest
import torch

from tests.tiny_model import random_target
from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters import load_drafter
from tlt.drafters.base import DrafterMismatchError
from tlt.drafters.eagle import EagleDrafter
from tlt.models.presets import build_model
from tlt.speculative.strategy import SpecStrategy

GREEDY = SamplingParams(temperature=0, max_new_tokens=16)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [40]]
STRATEGIES = [SpecStrategy.parse(s) for s in ("1_1_2", "3_1_4", "2_2_5", "3_3_9")]


@pytest.fixture(scope="module")
def target():
    """A tiny random Qwen2 (vocab 64) with scaled-up weights: varied continuations, rare ties."""
    return random_target(0.15)


class Cycling:
    """A tuner that cycles through arms (None = plain step), so SD switches on and off."""

    def __init__(self, arms):
        self.arms, self.step = arms, 0

    def select(self, batch_size):
        self.step += 1
        return self.arms[(self.step - 1) % len(self.arms)]

    def update(self, strategy, batch_size, generated_tokens, seconds):
        pass


@pytest.fixture(scope="module")
def plain(target):
    return NativeEngine(target, eos_token_id=None, max_seq_len=64).generate(PROMPTS, GREEDY, n=2)


def _assert_same(sd, reference):
    for a, b in zip(sd, reference, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_untrained_eagle_sd_greedy_equals_plain(target, plain, strategy):
    drafter = EagleDrafter.from_target(target, seed=0)
    engine = NativeEngine(target, eos_token_id=None, max_seq_len=64, tuner=Cycling([strategy]), drafter=drafter)
    _assert_same(engine.generate(PROMPTS, GREEDY, n=2), plain)
    assert all(s.sd_on for s in engine.step_stats)


def test_sd_switching_on_and_off_with_eos(target):
    eos = 17
    reference = NativeEngine(target, eos_token_id=eos, max_seq_len=64).generate(PROMPTS, GREEDY)
    drafter = EagleDrafter(EagleDrafter.from_target(target, seed=1).head, flush_every=2)
    tuner = Cycling([None, None, None, STRATEGIES[3], STRATEGIES[1], None])
    engine = NativeEngine(target, eos_token_id=eos, max_seq_len=64, tuner=tuner, drafter=drafter)
    _assert_same(engine.generate(PROMPTS, GREEDY), reference)


# ---- the cached drafter equals a full recompute with the training forward ---------------------------------


def _sharp(target, seed, flush_every=32):
    """A drafter whose random head weights are large enough that attention and RoPE matter."""
    drafter = EagleDrafter(EagleDrafter.from_target(target, seed).head, flush_every)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.head.parameters():
            p.normal_(0, 0.15, generator=g)
    return drafter


def _sequences(target, B=3, L=14, seed=0):
    """Random token rows [B, L] and the target's final-norm features [B, L, D] (HF forward)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 64, (B, L), generator=g)
    with torch.no_grad():
        return tokens, target.model(tokens).last_hidden_state


def _drive(drafter, tokens, hidden, prompt_lens, chunks):
    """start() with the prompts, then append() ragged chunks (counts per row); returns committed lengths."""
    B = tokens.shape[0]
    lengths = torch.tensor(prompt_lens)
    T = max(prompt_lens)
    drafter.start(tokens[:, :T] * (torch.arange(T) < lengths[:, None]), hidden[:, :T], lengths)
    done = lengths.clone()
    for counts in chunks:
        counts = torch.tensor(counts)
        width = int(counts.max())
        idx = (done[:, None] + torch.arange(width)).clamp(max=tokens.shape[1] - 1)  # [B, W] next tokens
        rows = torch.arange(B)[:, None]
        drafter.append(tokens[rows, idx], hidden[rows, idx - 1], counts)
        done += counts
    return done.tolist()


@torch.no_grad()
def _reference_tree(head, tokens, hidden, strategy):
    """EAGLE-2 by brute force: every node's distribution from a full training forward over its path."""
    K, n = strategy.topk, strategy.num_draft_tokens
    depth = min(strategy.steps, n)

    def dist(path):
        t = torch.cat([tokens[1:], torch.tensor([c["token"] for c in path], dtype=torch.long)])
        h = torch.cat([hidden[:-1]] + [c["feat"][None] for c in path])
        out = head.train_forward(t[None], h[None])[0, -1]
        return out, torch.log_softmax(head.logits(out), -1)

    def path_of(i):
        return ([] if cands[i]["parent"] < 0 else path_of(cands[i]["parent"])) + [cands[i]]

    cands, frontier = [], []
    out, lp = dist([])
    for s, t in zip(*lp.topk(K), strict=True):
        cands.append({"score": s.item(), "token": t.item(), "parent": -1, "feat": out})
        frontier.append(len(cands) - 1)
    for _ in range(1, depth):
        new = []
        for f in frontier:
            out, lp = dist(path_of(f))
            for s, t in zip(*lp.topk(K), strict=True):
                cands.append({"score": cands[f]["score"] + s.item(), "token": t.item(), "parent": f, "feat": out})
                new.append(len(cands) - 1)
        frontier = sorted(new, key=lambda i: -cands[i]["score"])[:K]
    chosen = sorted(sorted(range(len(cands)), key=lambda i: -cands[i]["score"])[:n])
    node = {c: j + 1 for j, c in enumerate(chosen)}
    return [cands[c]["token"] for c in chosen], [node.get(cands[c]["parent"], 0) for c in chosen]


@pytest.mark.parametrize("flush_every", [1, 32])
@pytest.mark.parametrize("strategy", ["4_1_5", "6_1_5", "2_2_5", "3_3_9", "3_2_6"])
def test_proposals_equal_full_recompute(target, strategy, flush_every):
    strategy = SpecStrategy.parse(strategy)
    tokens, hidden = _sequences(target)
    drafter = _sharp(target, 3, flush_every)
    for chunks in ([[1, 1, 1]], [[1, 1, 1], [3, 1, 2], [1, 2, 1]]):  # second round: after drafting
        lengths = _drive(drafter, tokens, hidden, [4, 1, 6], chunks)
        tree = drafter.propose(strategy)
        for b, L in enumerate(lengths):
            ref_tokens, ref_parents = _reference_tree(drafter.head, tokens[b, :L], hidden[b, :L], strategy)
            assert tree.tokens[b, 0].item() == tokens[b, L - 1].item()
            assert tree.tokens[b, 1:].tolist() == ref_tokens
            assert tree.parents[b].tolist() == [-1] + ref_parents
        drafter.propose(SpecStrategy.parse("3_3_9"))  # speculative entries must not leak into the next round


@pytest.mark.parametrize("strategy", ["1_1_2", "4_1_5"])
def test_chain_fast_path_equals_the_beam(target, strategy):
    strategy = SpecStrategy.parse(strategy)
    tokens, hidden = _sequences(target, B=3)
    drafter = _sharp(target, 8)
    _drive(drafter, tokens, hidden, [4, 1, 6], [[1, 1, 1], [3, 1, 2]])
    chain = drafter.propose(strategy)
    state = (drafter.last_token, drafter.feature, drafter.cache_lens)
    with torch.inference_mode():
        tokens, parents = drafter._tree(*state, strategy, strategy.steps, drafter.max_len, drafter.k, drafter.v)
    assert chain.tokens.tolist() == tokens.tolist()
    assert chain.parents.tolist() == parents.tolist()


def test_tree_is_topological_with_best_children_first(target):
    tokens, hidden = _sequences(target, B=4)
    drafter = _sharp(target, 4)
    _drive(drafter, tokens, hidden, [3, 5, 2, 7], [[1, 1, 1, 1]])
    tree = drafter.propose(SpecStrategy.parse("4_3_12"))
    assert tree.tokens.shape == (4, 12)
    parents = tree.parents
    assert (parents[:, 1:] < torch.arange(1, 12)).all() and (parents[:, 1:] >= 0).all()
    assert (tree.depths() <= 4).all()


def test_keep_selects_rows(target):
    tokens, hidden = _sequences(target, B=3)
    drafter = _sharp(target, 5)
    _drive(drafter, tokens, hidden, [4, 2, 5], [[2, 1, 1]])
    full = drafter.propose(SpecStrategy.parse("3_2_6"))
    drafter.keep(torch.tensor([2, 0]))
    kept = drafter.propose(SpecStrategy.parse("3_2_6"))
    assert kept.tokens.tolist() == full.tokens[[2, 0]].tolist()
    assert kept.parents.tolist() == full.parents[[2, 0]].tolist()


def test_keep_before_the_first_propose_drops_rows_never_consumed(target):
    """Rows dropped while their prompt and pairs still wait in the buffer: the survivors draft exactly as in a
    drafter that consumed everything, across several keeps and appends in between."""
    tokens, hidden = _sequences(target, B=4)
    s = SpecStrategy.parse("3_2_6")
    full = _sharp(target, 5)
    _drive(full, tokens, hidden, [4, 2, 5, 3], [[1, 1, 1, 1], [2, 1, 1, 1]])
    expected = full.propose(s)
    lazy = _sharp(target, 5)
    _drive(lazy, tokens, hidden, [4, 2, 5, 3], [[1, 1, 1, 1]])
    lazy.keep(torch.tensor([0, 2, 3]))
    rows = torch.arange(3)[:, None]
    idx = torch.tensor([[5], [6], [4]])  # each kept row's next token: its prompt length + 1
    lazy.append(
        tokens[[0, 2, 3]][rows, idx.expand(3, 2) + torch.arange(2)],
        hidden[[0, 2, 3]][rows, idx - 1 + torch.arange(2)],
        torch.tensor([2, 1, 1]),
    )
    lazy.keep(torch.tensor([2, 0]))
    kept = lazy.propose(s)
    assert kept.tokens.tolist() == expected.tokens[[3, 0]].tolist()
    assert kept.parents.tolist() == expected.parents[[3, 0]].tolist()


def test_flush_every_bounds_the_buffer_across_keeps(target):
    tokens, hidden = _sequences(target, B=3)
    drafter = _sharp(target, 5, flush_every=3)
    _drive(drafter, tokens, hidden, [4, 2, 5], [[1, 1, 1], [1, 1, 1]])
    drafter.keep(torch.tensor([0, 2]))
    assert drafter.prompts is not None and len(drafter.pending) == 1  # merged into one block to index
    drafter.append(tokens[[0, 2], 6:7], hidden[[0, 2], 5:6], torch.tensor([1, 1]))
    assert drafter.prompts is None and drafter.pending == []  # the third append flushed


def test_start_deduplicates_forked_prompts(target):
    tokens, hidden = _sequences(target, B=2)
    forked = torch.tensor([0, 0, 1, 1, 0])
    a = _sharp(target, 6)
    _drive(a, tokens, hidden, [5, 3], [[1, 1]])
    b = _sharp(target, 6)
    _drive(b, tokens[forked], hidden[forked], [5, 5, 3, 3, 5], [[1] * 5])
    s = SpecStrategy.parse("3_2_6")
    assert b.propose(s).tokens.tolist() == a.propose(s).tokens[forked].tolist()


# ---- head: packing, sharing, binding, persistence ---------------------------------------------------------


def test_packed_documents_equal_separate_forwards(target):
    head = EagleDrafter.from_target(target, seed=7).head
    tokens, hidden = _sequences(target, B=2, L=6)
    with torch.no_grad():
        separate = [head.train_forward(tokens[b : b + 1], hidden[b : b + 1])[0] for b in range(2)]
        packed = head.train_forward(
            tokens.reshape(1, 12),
            hidden.reshape(1, 12, -1),
            position_ids=torch.arange(6).repeat(2)[None],
            document_ids=torch.arange(2).repeat_interleave(6)[None],
        )[0]
    torch.testing.assert_close(packed, torch.cat(separate), atol=1e-5, rtol=0)


def test_embedding_and_lm_head_are_shared_not_owned(target):
    head = EagleDrafter.from_target(target, seed=0).head
    assert head.embed.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    assert head.lm_head.data_ptr() == target.get_output_embeddings().weight.data_ptr()
    assert not head.embed.requires_grad and not head.lm_head.requires_grad
    names = set(head.state_dict())
    assert not any("embed" in k or "lm_head" in k for k in names)
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight"} <= names


@pytest.mark.parametrize("preset, vocab", [("tiny", 64), ("test", 80)])
def test_bind_rejects_a_mismatched_target(target, preset, vocab):
    drafter = EagleDrafter.from_target(target, seed=0)
    other = build_model(preset, vocab_size=vocab)
    with pytest.raises(DrafterMismatchError, match=r"EAGLE drafter was built for hidden_size=128, vocab_size=64"):
        drafter.bind(other)
    with pytest.raises(DrafterMismatchError):
        NativeEngine(other, eos_token_id=None, max_seq_len=32, drafter=drafter)


def test_save_load_round_trip_gives_identical_proposals(target, tmp_path):
    tokens, hidden = _sequences(target)
    drafter = _sharp(target, 8)
    path = tmp_path / "eagle"
    drafter.save(path)
    drafter.save(path)  # overwriting an existing folder is atomic too
    meta = json.loads((path / "tlt_drafter.json").read_text())
    assert meta["kind"] == "eagle" and meta["hidden_size"] == 128 and meta["vocab_size"] == 64
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "tlt_drafter.json"]
    loaded = load_drafter(path)
    assert isinstance(loaded, EagleDrafter)
    with pytest.raises(RuntimeError, match="bind"):
        loaded.head.train_forward(tokens, hidden)  # unbound: no embedding yet
    loaded.bind(target)
    s = SpecStrategy.parse("3_3_9")
    trees = []
    for d in (drafter, loaded):
        _drive(d, tokens, hidden, [4, 2, 6], [[2, 1, 1]])
        trees.append(d.propose(s))
    assert trees[0].tokens.tolist() == trees[1].tokens.tolist()
    assert trees[0].parents.tolist() == trees[1].parents.tolist()
