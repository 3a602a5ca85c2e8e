"""LeanModel equals the HF forward: prefill, decode steps, tree queries, cache compaction, path commit."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from tlt.models.lean import FusedLinear, KVCache, LeanModel, Linear, attention_mask, commit_path, compact, packable
from tlt.models.presets import build_model
from tlt.speculative.tree import DraftTree

torch.set_num_threads(1)
ATOL = 1e-4


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Give biases and norm weights random values (HF initialises them to 0 / 1, which hides bugs)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def qwen():
    return _perturbed(build_model("test", vocab_size=64))


@pytest.fixture(scope="module")
def llama():
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return _perturbed(LlamaForCausalLM(config).float().eval())


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [T, V]


def _random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_ragged_prefill_matches_hf(name, request):
    model = request.getfixturevalue(name)
    lean = LeanModel.from_hf(model)
    prompts = [_random_ids(n, seed) for seed, n in enumerate([7, 3, 5])]
    T = max(len(p) for p in prompts)
    tokens = torch.tensor([p + [0] * (T - len(p)) for p in prompts])
    cache = lean.allocate_cache(3, 16)
    positions = torch.arange(T).expand(3, T)
    hidden, logits = lean.forward(tokens, positions, cache, torch.zeros(3, dtype=torch.long))
    assert hidden.shape == (3, T, 128 if name == "qwen" else 64) and logits.shape == (3, T, 64)
    for b, p in enumerate(prompts):
        torch.testing.assert_close(logits[b, : len(p)], _hf_logits(model, p), atol=ATOL, rtol=0)
        with torch.no_grad():
            ref_hidden = model.model(torch.tensor([p])).last_hidden_state[0]
        torch.testing.assert_close(hidden[b, : len(p)], ref_hidden, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_step_by_step_decode_matches_hf(name, request):
    model = request.getfixturevalue(name)
    lean = LeanModel.from_hf(model)
    seqs = [_random_ids(12, 10), _random_ids(9, 11)]
    prompt_lens = torch.tensor([4, 2])
    cache = lean.allocate_cache(2, 16)
    tokens = torch.tensor([seqs[0][:4], seqs[1][:2] + [0, 0]])
    lean.forward(tokens, torch.arange(4).expand(2, 4), cache, torch.zeros(2, dtype=torch.long))
    lens = prompt_lens.clone()
    refs = [_hf_logits(model, s) for s in seqs]
    for _ in range(7):
        step = torch.tensor([[seqs[b][lens[b]]] for b in range(2)])
        _, logits = lean.forward(step, lens[:, None], cache, lens)
        for b in range(2):
            torch.testing.assert_close(logits[b, 0], refs[b][lens[b]], atol=ATOL, rtol=0)
        lens = lens + 1


def _tree() -> DraftTree:
    """Two rows of one 7-node tree shape with different tokens: root -> {1, 2}; 1 -> {3, 4}; 2 -> 5; 3 ->
    6."""
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]] * 2)
    tokens = torch.tensor([_random_ids(7, 20), _random_ids(7, 21)])
    return DraftTree(tokens=tokens, parents=parents)


def _node_path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_tree_query_matches_each_path(name, request):
    model = request.getfixturevalue(name)
    lean = LeanModel.from_hf(model)
    prefixes = [_random_ids(5, 30), _random_ids(3, 31)]
    cache = lean.allocate_cache(2, 16)
    lens = torch.tensor([5, 3])
    tokens = torch.tensor([prefixes[0], prefixes[1] + [0, 0]])
    lean.forward(tokens, torch.arange(5).expand(2, 5), cache, torch.zeros(2, dtype=torch.long))
    tree = _tree()
    positions = lens[:, None] + tree.depths()
    _, logits = lean.forward(tree.tokens, positions, cache, lens, tree_mask=tree.ancestor_mask())
    for b in range(2):
        for node in range(tree.num_nodes):
            path = _node_path(tree.parents[b].tolist(), node)
            ids = prefixes[b] + tree.tokens[b, path].tolist()
            torch.testing.assert_close(logits[b, node], _hf_logits(model, ids)[-1], atol=ATOL, rtol=0)


def test_commit_path_then_decode_matches_hf(qwen):
    lean = LeanModel.from_hf(qwen)
    prefixes = [_random_ids(5, 40), _random_ids(3, 41)]
    cache = lean.allocate_cache(2, 16)
    lens = torch.tensor([5, 3])
    tokens = torch.tensor([prefixes[0], prefixes[1] + [0, 0]])
    lean.forward(tokens, torch.arange(5).expand(2, 5), cache, torch.zeros(2, dtype=torch.long))
    tree = _tree()
    lean.forward(tree.tokens, lens[:, None] + tree.depths(), cache, lens, tree_mask=tree.ancestor_mask())
    path = torch.tensor([[0, 2, 5, -1], [0, 1, 3, 6]])  # 2 and 3 accepted drafts
    commit_path(cache, lens, path)
    accepted = torch.tensor([3, 4])
    lens = lens + accepted
    nxt = torch.tensor([[7], [9]])
    _, logits = lean.forward(nxt, lens[:, None], cache, lens)
    for b in range(2):
        ids = prefixes[b] + tree.tokens[b, path[b, : accepted[b]]].tolist() + [nxt[b, 0].item()]
        torch.testing.assert_close(logits[b, 0], _hf_logits(qwen, ids)[-1], atol=ATOL, rtol=0)


def test_compact_keeps_and_forks_rows(qwen):
    lean = LeanModel.from_hf(qwen)
    prompts = [_random_ids(4, 50), _random_ids(4, 51), _random_ids(4, 52)]
    cache = lean.allocate_cache(4, 8)
    prefill = type(cache)(k=cache.k[:, :3], v=cache.v[:, :3])
    lean.forward(torch.tensor(prompts), torch.arange(4).expand(3, 4), prefill, torch.zeros(3, dtype=torch.long))
    rows = torch.tensor([2, 0, 2, 1])  # reorder, drop nothing, fork row 2
    kept = compact(cache, rows, kv_len=4)
    assert kept.batch == 4
    lens = torch.full((4,), 4)
    nxt = torch.tensor([[5], [6], [7], [8]])
    _, logits = lean.forward(nxt, lens[:, None], kept, lens)
    for b, r in enumerate(rows.tolist()):
        ref = _hf_logits(qwen, prompts[r] + [nxt[b, 0].item()])[-1]
        torch.testing.assert_close(logits[b, 0], ref, atol=ATOL, rtol=0)
    smaller = compact(kept, torch.tensor([3]))
    assert smaller.batch == 1
    torch.testing.assert_close(smaller.k[:, 0, :, :5], kept.k[:, 0, :, :5])


def test_attention_mask_hides_stale_slots():
    mask = attention_mask(torch.tensor([2, 0]), 2, 5, None)[:, 0]
    expected = torch.tensor(
        [
            [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]],
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    tree = torch.tensor([[[1, 0], [0, 1]]], dtype=torch.bool)  # two siblings
    assert attention_mask(torch.tensor([1]), 2, 4, tree)[0, 0].int().tolist() == [[1, 1, 0, 0], [1, 0, 1, 0]]


def test_rejects_unsupported_models(qwen):
    qwen.config.use_sliding_window = True
    try:
        with pytest.raises(ValueError, match="sliding-window"):
            LeanModel.from_hf(qwen)
    finally:
        qwen.config.use_sliding_window = False
    cache = LeanModel.from_hf(qwen).allocate_cache(1, 4)
    with pytest.raises(ValueError, match="cache slots"):
        LeanModel.from_hf(qwen).forward(
            torch.zeros(1, 5, dtype=torch.long),
            torch.arange(5)[None],
            cache,
            torch.zeros(1, dtype=torch.long),
        )


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_commit_path_moves_path_nodes_to_contiguous_slots(data):
    B, N, S = 2, 6, 12
    lens = torch.tensor(data.draw(st.lists(st.integers(0, S - N), min_size=B, max_size=B)))
    paths = []
    for _ in range(B):
        nodes = sorted(data.draw(st.sets(st.integers(1, N - 1), max_size=3)))
        paths.append([0] + nodes + [-1] * (3 - len(nodes)))
    path = torch.tensor(paths)
    slots = torch.arange(S, dtype=torch.float32)
    k = slots.view(1, 1, 1, S, 1).expand(2, B, 1, S, 3).contiguous()  # [L, B, Hkv, S, Dh] = slot index
    cache = KVCache(k=k, v=-k.clone())
    commit_path(cache, lens, path)
    for b in range(B):
        accepted = [p for p in paths[b] if p >= 0]
        got = cache.k[0, b, 0, lens[b] : lens[b] + len(accepted), 0].tolist()
        assert got == [float(lens[b] + p) for p in accepted]
        assert cache.k[1, b, 0, : lens[b], 2].tolist() == slots[: lens[b]].tolist()  # the prefix is untouched
        assert torch.equal(cache.v, -cache.k)


def test_packed_forward_computes_only_the_selected_tokens(qwen):
    """`select` (ragged drafts): the selected tokens' hidden states, logits and K/V equal the full forward's; the
    K/V slots of the others are not written."""
    lean = LeanModel.from_hf(qwen)
    tree = _tree()
    prefix = torch.tensor([_random_ids(5, 50), _random_ids(5, 51)])
    lens = torch.tensor([5, 5])
    caches = [lean.allocate_cache(2, 16) for _ in range(2)]
    for cache in caches:
        lean.forward(prefix, torch.arange(5).expand(2, 5), cache, torch.zeros(2, dtype=torch.long))
    positions = lens[:, None] + tree.depths()
    mask = tree.ancestor_mask()
    full = lean.forward(tree.tokens, positions, caches[0], lens, tree_mask=mask)
    real = [4, 2]  # row 0: nodes 0-3 (4's parent 1 is among them), row 1: nodes 0-1
    select = torch.tensor([0, 1, 2, 3, 7, 8])
    packed = lean.forward(tree.tokens, positions, caches[1], lens, tree_mask=mask, select=select)
    for b, n in enumerate(real):
        for out_full, out_packed in zip(full, packed, strict=True):
            torch.testing.assert_close(out_packed[b, :n], out_full[b, :n], atol=1e-5, rtol=0)
            assert not out_packed[b, n:].any()
        torch.testing.assert_close(caches[1].k[:, b, :, : 5 + n], caches[0].k[:, b, :, : 5 + n], atol=1e-5, rtol=0)
        assert not caches[1].k[:, b, :, 5 + n :].any()


def _verify_forward(lean: LeanModel, seed: int) -> torch.Tensor:
    """Logits [2, 4, V] of a 4-token chain after a 6-token prefix, on a fresh cache."""
    cache = lean.allocate_cache(2, 16)
    prefix = torch.tensor([_random_ids(6, seed), _random_ids(6, seed + 1)])
    lean.forward(prefix, torch.arange(6).expand(2, 6), cache, torch.zeros(2, dtype=torch.long))
    chain = torch.tensor([_random_ids(4, seed + 2), _random_ids(4, seed + 3)])
    return lean.forward(chain, 6 + torch.arange(4).expand(2, 4), cache, torch.full((2,), 6))[1]


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_packed_weights_give_the_shared_weights_logits(name, request):
    """On CPU the projections multiply by oneDNN-packed copies (one-token inputs by the shared weight itself);
    a verify-shaped forward matches F.linear over the shared weights to float rounding."""
    model = request.getfixturevalue(name)
    packed, plain = LeanModel.from_hf(model), LeanModel.from_hf(model, packed=False)
    got, want = _verify_forward(packed, 60), _verify_forward(plain, 60)
    assert packed.layers[0].qkv.packed and packed.layers[0].qkv._copy is not None  # the packed path ran
    assert not plain.layers[0].qkv.packed and plain.layers[0].qkv._copy is None
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_packed_copies_follow_in_place_weight_updates():
    """A packed copy is remade once its weight changes in place (an optimizer step, copy_, load_state_dict), so
    the engine never multiplies by stale weights after update_weights."""
    model = _perturbed(build_model("test", vocab_size=64))
    lean = LeanModel.from_hf(model)
    before = _verify_forward(lean, 70)
    other = _perturbed(build_model("test", vocab_size=64, seed=5))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(0.5)
            else:
                p.copy_(other.get_parameter(name))
    after = _verify_forward(lean, 70)
    want = _verify_forward(LeanModel.from_hf(model, packed=False), 70)
    assert not torch.allclose(after, before, atol=1e-2)
    torch.testing.assert_close(after, want, atol=ATOL, rtol=0)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(
        _verify_forward(lean, 70), _verify_forward(LeanModel.from_hf(other), 70), atol=ATOL, rtol=0
    )


def test_a_fused_product_gives_its_parts_outputs_and_follows_their_updates():
    """q, k, v (with biases) as one packed product: each output is the part's own product, and an in-place change
    of one part's weight or bias is seen."""
    q, k, v = (Linear(torch.randn(n, 32), torch.randn(n)) for n in (32, 16, 16))
    fused = FusedLinear([q, k, v])
    x = torch.randn(2, 3, 32)
    for _ in range(2):
        outputs = fused(x)
        assert fused.packed and [o.shape[-1] for o in outputs] == [32, 16, 16]
        for part, out in zip((q, k, v), outputs, strict=True):
            torch.testing.assert_close(out, part(x), atol=1e-5, rtol=0)
        with torch.no_grad():
            k.bias.add_(1.0)
            v.weight.mul_(2.0)
    one = fused(x[:1, :1])  # one token: each part's F.linear
    torch.testing.assert_close(one[2], torch.nn.functional.linear(x[:1, :1], v.weight, v.bias), atol=0, rtol=0)
    assert not FusedLinear([q, Linear(torch.randn(8, 32))]).packed  # bias on some parts only: kept apart


def test_only_cpu_float_weights_are_packed():
    assert packable(torch.zeros(4, 4)) and packable(torch.zeros(4, 4, dtype=torch.bfloat16))
    assert not packable(torch.zeros(4, 4, dtype=torch.float16))
    assert not packable(torch.zeros(4, 4, device="meta"))
    half = Linear(torch.randn(3, 4, dtype=torch.float16))
    x = torch.randn(2, 4, dtype=torch.float16)
    assert not half.packed and torch.equal(half(x), torch.nn.functional.linear(x, half.weight))
