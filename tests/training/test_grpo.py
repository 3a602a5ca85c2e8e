"""GRPO math against hand-computed values: advantages, clipping on both sides, k3 KL, token-mean; the module's
recompute (log-probs and post-norm hidden states) and its update."""

import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F

from eval.bench_policy_update import saved_bytes
from tlt.config import GRPOConfig
from tlt.models.presets import build_model
from tlt.training.grpo import (
    GRPOModule,
    accumulate_loss,
    clipped_surrogate,
    group_advantages,
    kl_k3,
    make_batch,
    micro_batches,
    token_mean,
    update_policy,
)


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0, 1, 0.5])  # 3 groups of G = 4
    adv = group_advantages(rewards, 4, eps=0.0)
    # group 0: mean 0.25, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    # group 2: mean 0.5, sample std sqrt((0.5^2 + 0.5^2) / 3) = sqrt(1 / 6)
    s = math.sqrt(1 / 6)
    expected = [1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0, 0, -0.5 / s, 0.5 / s, 0]
    torch.testing.assert_close(adv, torch.tensor(expected))
    assert torch.equal(adv[4:8], torch.zeros(4))  # all-equal group: exactly 0


def test_group_advantages_eps_no_scaling_and_degenerate_groups():
    rewards = torch.tensor([1.0, 0.0, 0.3, 0.3])
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # sample std of (1, 0) is sqrt(0.5); the default eps is 1e-4
    torch.testing.assert_close(group_advantages(rewards, 2), torch.tensor([a, -a, 0, 0]))
    torch.testing.assert_close(group_advantages(rewards, 2, scale=False), torch.tensor([0.5, -0.5, 0, 0]))
    assert torch.equal(group_advantages(rewards, 1), torch.zeros(4))  # G = 1: no signal
    with pytest.raises(ValueError, match="multiple of group_size=3"):
        group_advantages(rewards, 3)


def test_clipped_surrogate_clips_on_both_sides():
    eps = 0.2
    ratio = torch.tensor([[1.5, 0.5, 1.0], [0.5, 1.5, 1.1]], requires_grad=True)
    logprobs = ratio.log()
    old = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    loss, clipped = clipped_surrogate(logprobs, old, adv, eps)
    # A = +1: rho 1.5 -> min(1.5, 1.2) = 1.2 (clipped); rho 0.5 -> min(0.5, 0.8) = 0.5 (not clipped)
    # A = -1: rho 0.5 -> min(-0.5, -0.8) = -0.8 (clipped); rho 1.5 -> min(-1.5, -1.2) = -1.5 (not clipped)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.5, -1.0], [0.8, 1.5, 1.1]]))
    assert clipped.tolist() == [[True, False, False], [True, False, False]]
    loss.sum().backward()
    # d loss / d rho: 0 where clipped, -A elsewhere
    torch.testing.assert_close(ratio.grad, torch.tensor([[0.0, -1.0, -1.0], [0.0, 1.0, 1.0]]))


def test_kl_k3_value():
    logprobs = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2)]])
    # d = log(0.25 / 0.5) = -log 2: exp(d) - d - 1 = 0.5 + log 2 - 1
    torch.testing.assert_close(kl_k3(logprobs, ref), torch.tensor([[0.5 + math.log(2) - 1, 0.0]]))
    assert bool((kl_k3(torch.randn(50), torch.randn(50)) >= 0).all())


def test_token_mean_weighs_every_token_equally():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    torch.testing.assert_close(token_mean(values, mask), torch.tensor(7 / 3))  # not (1.5 + 4) / 2
    assert token_mean(values, torch.zeros_like(mask)).item() == 0.0


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    model = build_model("test", vocab_size=300, seed=0)
    with torch.no_grad():  # non-unit norm weights: the final norm must visibly matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 300, (n,), generator=g) for n in (5, 3, 4, 6)]
    responses = [torch.randint(3, 300, (n,), generator=g) for n in (4, 6, 1, 3)]
    sampled = [torch.full((r.numel(),), -1.0) for r in responses]
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return prompts, responses, make_batch(prompts, responses, advantages, 0, sampled)


def test_make_batch_layout():
    prompts, responses, batch = _batch()
    assert batch.input_ids.shape == (4, 9)
    assert batch.input_ids[1, :9].tolist() == prompts[1].tolist() + responses[1].tolist()
    assert batch.response_mask[1].tolist() == [False] * 3 + [True] * 6
    assert batch.attention_mask.sum(1).tolist() == [9, 9, 5, 9]
    # the sampler's log-prob of response token t sits at the position predicting it
    assert (batch.sampler_logprobs[2] == -1).tolist() == [False] * 3 + [True] + [False] * 4
    assert torch.equal(batch.sampler_logprobs != 0, batch.loss_mask)


def test_recompute_gives_tempered_logprobs_and_post_norm_hidden(policy):
    prompts, responses, batch = _batch()
    module = GRPOModule(policy, GRPOConfig(), temperature=0.7)
    out, hidden = module.recompute(batch)
    for b in range(4):
        ids = torch.cat([prompts[b], responses[b]])[None]
        ref = policy(ids)
        n = ids.shape[1]
        post_norm = policy.model(ids).last_hidden_state  # after the final norm
        torch.testing.assert_close(hidden[b, :n], post_norm[0], atol=1e-5, rtol=1e-5)
        expected = F.log_softmax(ref.logits[0, :-1] / 0.7, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        torch.testing.assert_close(out.old_logprobs[b, : n - 1], expected, atol=1e-5, rtol=1e-5)


def test_loss_on_policy_is_minus_the_token_mean_advantage(policy):
    _, _, batch = _batch()
    cfg = GRPOConfig(entropy_coef=0.1, kl_coef=0.5)
    module = GRPOModule(policy, cfg, temperature=1.0, reference=policy)
    batch, _ = module.recompute(batch)
    out = module.loss(batch)
    # rho = 1 and pi = pi_ref: no clip, KL 0; the loss is -mean_token(A) - 0.1 * H
    tokens = batch.loss_mask.sum(1).float()  # [4, 6, 1, 3] response tokens
    mean_adv = (tokens * batch.advantages).sum() / tokens.sum()
    torch.testing.assert_close(out.policy_loss, -mean_adv, atol=1e-5, rtol=1e-5)
    assert out.kl.abs().item() < 1e-6 and out.clip_fraction.item() == 0.0
    torch.testing.assert_close(out.loss, out.policy_loss - 0.1 * out.entropy, atol=1e-5, rtol=1e-5)
    assert out.entropy.item() > 0


def test_bf16_mixed_runs_the_forwards_in_bf16_and_keeps_rho_exactly_one():
    torch.set_num_threads(1)
    policy = build_model("test", vocab_size=300, seed=2)  # trainable (the shared fixture serves as a reference)
    _, _, batch = _batch()
    full = GRPOModule(policy, GRPOConfig(), temperature=1.0)
    mixed = GRPOModule(policy, GRPOConfig(precision="bf16-mixed"), temperature=1.0)
    exact, _ = full.recompute(batch)
    batch, hidden = mixed.recompute(batch)
    mask = batch.loss_mask
    drift = (batch.old_logprobs - exact.old_logprobs)[mask].abs()
    assert 0 < drift.max() < 0.1  # bf16 arithmetic: visibly not float32, still close
    assert hidden.dtype == torch.float32  # the drafter buffer gets the weights' dtype
    out = mixed.loss(batch)  # the update's forward repeats the recompute's arithmetic: rho == 1 exactly
    tokens = mask.sum(1).float()
    assert out.clip_fraction.item() == 0.0
    torch.testing.assert_close(out.policy_loss, -(tokens * batch.advantages).sum() / tokens.sum())
    out.loss.backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_update_policy_steps_per_minibatch_and_moves_the_weights():
    torch.set_num_threads(1)
    model = build_model("test", vocab_size=300, seed=1)
    cfg = GRPOConfig(lr=1e-2, epochs=2, minibatch_size=3)
    module = GRPOModule(model, cfg, temperature=1.0)
    _, _, batch = _batch()
    batch, _ = module.recompute(batch)
    before = [p.detach().clone() for p in model.parameters()]
    stats = update_policy(module, module.configure_optimizers(), batch, torch.Generator().manual_seed(0))
    assert stats.optimizer_steps == 4  # 2 epochs x ceil(4 / 3)
    assert all(math.isfinite(v) for v in (stats.loss, stats.grad_norm, stats.clip_fraction))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert stats.clip_fraction > 0  # later minibatches are off-policy with lr 1e-2


def test_micro_batches_sort_longest_first_within_the_token_budget():
    lengths = torch.tensor([5, 40, 7, 38, 6, 100])
    groups = [g.tolist() for g in micro_batches(lengths, max_tokens=80, overhead_tokens=64)]
    assert groups == [[5], [1, 3], [2, 4, 0]]  # 100 alone; 2 x 40; 3 x 7 (the longest row of each group)
    assert sorted(i for g in groups for i in g) == list(range(6))
    one_each = [[5], [1], [3], [2], [4], [0]]
    assert [g.tolist() for g in micro_batches(lengths, max_tokens=1, overhead_tokens=64)] == one_each


def test_micro_batches_give_a_long_row_its_own_forward_when_padding_costs_more():
    lengths = torch.tensor([20, 100, 20, 20])
    cheap = [g.tolist() for g in micro_batches(lengths, max_tokens=400, overhead_tokens=10)]
    assert cheap == [[1], [0, 2, 3]]  # 100 + 60 padded tokens + 2 forwards, not 4 x 100 in one
    costly = [g.tolist() for g in micro_batches(lengths, max_tokens=400, overhead_tokens=1000)]
    assert costly == [[1, 0, 2, 3]]  # a forward costs more than the 240 padded tokens it would save


def _cut_cost(lengths: list[int], groups: list[list[int]], overhead: int) -> int:
    return sum(len(g) * max(lengths[i] for i in g) + overhead for g in groups)


@pytest.mark.parametrize("seed", range(6))
def test_micro_batches_minimise_padding_plus_forwards_over_every_cut(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([3, 5, 8, 30, 31, 90]) for _ in range(7)]
    max_tokens, overhead = 100, rng.choice([0, 8, 40])
    groups = [g.tolist() for g in micro_batches(torch.tensor(lengths), max_tokens, overhead)]
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert all(len(g) == 1 or len(g) * max(lengths[i] for i in g) <= max_tokens for g in groups)
    order = sorted(range(7), key=lambda i: -lengths[i])
    best = min(  # every way of cutting the sorted rows into contiguous runs within the budget
        _cut_cost(lengths, cut, overhead)
        for bits in itertools.product([0, 1], repeat=6)
        for cut in [_runs(order, bits)]
        if all(len(g) == 1 or len(g) * max(lengths[i] for i in g) <= max_tokens for g in cut)
    )
    assert _cut_cost(lengths, groups, overhead) == best


def _runs(order: list[int], cuts: tuple[int, ...]) -> list[list[int]]:
    runs, current = [], [order[0]]
    for row, cut in zip(order[1:], cuts, strict=True):
        if cut:
            runs.append(current)
            current = []
        current.append(row)
    return [*runs, current]


@pytest.mark.parametrize("max_tokens", [1, 12, 10_000])
def test_accumulated_gradient_equals_one_forward_over_the_rows(max_tokens):
    policy = build_model("test", vocab_size=300, seed=2)  # its own: the shared fixture is frozen as a reference
    _, _, batch = _batch()
    module = GRPOModule(policy, GRPOConfig(entropy_coef=0.1, micro_batch_tokens=max_tokens), temperature=1.0)
    batch, _ = module.recompute(batch)
    rows = torch.tensor([3, 0, 2])
    policy.zero_grad(set_to_none=True)
    module.loss(batch.rows(rows)).loss.backward()
    expected = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad(set_to_none=True)
    count = batch.loss_mask[rows].sum().item()
    sums = accumulate_loss(module, batch, rows, count)
    for p, e in zip(policy.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e, atol=1e-6, rtol=1e-5)
    full = module.loss(batch.rows(rows))
    torch.testing.assert_close(sums[0].float() / count, full.loss.detach(), atol=1e-6, rtol=1e-5)


def test_kl_needs_a_reference(policy):
    with pytest.raises(ValueError, match="reference"):
        GRPOModule(policy, GRPOConfig(kl_coef=0.1), temperature=1.0)
    with pytest.raises(ValueError, match="temperature"):
        GRPOModule(policy, GRPOConfig(), temperature=0.0)


def test_activation_checkpointing_keeps_the_update_and_saves_fewer_activations():
    torch.set_num_threads(1)
    _, _, batch = _batch()
    results = {}
    for on in (False, True):
        model = build_model("test", vocab_size=300, seed=1)
        module = GRPOModule(model, GRPOConfig(lr=1e-2, epochs=2, minibatch_size=3, activation_checkpointing=on), 1.0)
        full, _ = module.recompute(batch)
        saved = saved_bytes(lambda m=module, b=full: m.loss(b))
        model.zero_grad(set_to_none=True)
        stats = update_policy(module, module.configure_optimizers(), full, torch.Generator().manual_seed(0))
        results[on] = (saved, stats, [p.detach().clone() for p in model.parameters()])
    assert results[True][1] == results[False][1]
    assert all(torch.equal(a, b) for a, b in zip(results[True][2], results[False][2], strict=True))
    assert results[True][0] < 0.6 * results[False][0]  # only each layer's inputs are kept


def test_a_deep_copy_of_a_checkpointed_policy_runs_its_own_weights():
    import copy

    model = build_model("test", vocab_size=300, seed=1)
    GRPOModule(model, GRPOConfig(activation_checkpointing=True), 1.0)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert not torch.allclose(twin(ids).logits, model(ids).logits)
    assert twin.model.layers[0].forward.__self__ is twin.model.layers[0]
