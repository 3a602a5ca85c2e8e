"""The RolloutEngine contract, one suite for every backend (native, vllm, sglang).

Each backend runs on the same saved random Qwen2 folder and is compared with the native engine, the reference:
output shapes and finish reasons, greedy outputs (float32) and log-probs, weight updates, drafter updates that
leave greedy output unchanged (and do take effect), speculative sampling that keeps the target's distribution,
and clear errors for what a backend does not support. The vllm rows need the `vllm` package (run them in the
vllm environment: `make test-vllm`); the native-cuda rows (the native engine on a GPU, against the CPU reference)
need a CUDA GPU and the sglang rows SGLang too; they are skipped otherwise (`eval/gpu_checks.sh` runs them).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from scipy.stats import chi2_contingency

from tests.tiny_model import save_random_target
from tlt.backends.base import FinishReason, SamplingParams, UnsupportedFeatureError
from tlt.backends.native import NativeEngine
from tlt.drafters.base import DrafterMismatchError
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.ngram import NgramDrafter
from tlt.drafters.small_lm import SmallLMDrafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners.base import FixedTuner
from tlt.training.weight_push import PushError, push

MAX_SEQ = 128
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19], [40]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24)
STRATEGY = "3_1_4"


def _has_gpu_sglang() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None


BACKENDS = [
    pytest.param("native", id="native"),
    pytest.param(
        "native-cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
        id="native-cuda",
    ),
    pytest.param("vllm", marks=pytest.mark.vllm, id="vllm"),
    pytest.param(
        "sglang",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not _has_gpu_sglang(), reason="the sglang backend needs SGLang and a CUDA GPU"),
        ],
        id="sglang",
    ),
]


# ---- drafters with known behaviour ------------------------------------------------------------------------


def copy_drafter(target) -> EagleDrafter:
    """An EAGLE head whose predicted feature is the embedding of its input token: with the target's tied
    embedding it drafts "repeat the last token", which a looping target accepts often."""
    drafter = EagleDrafter.from_target(target, seed=0)
    D = target.config.hidden_size
    with torch.no_grad():
        for p in drafter.head.parameters():
            p.zero_()
        drafter.head.fc.weight[:, :D] = torch.eye(D)
        drafter.head.layers[0].post_attention_layernorm.weight.fill_(1.0)
    return drafter


def dead_drafter(target) -> EagleDrafter:
    """An EAGLE head that always predicts the zero feature: it drafts token 0, which the target never emits."""
    drafter = EagleDrafter.from_target(target, seed=0)
    with torch.no_grad():
        for p in drafter.head.parameters():
            p.zero_()
    return drafter


# ---- engines ----------------------------------------------------------------------------------------------


class Engines:
    """One target folder, engines built on demand per (backend, setup) and closed at the end."""

    def __init__(self, backend: str, folder, eos: int):
        self.backend, self.folder, self.eos = backend, folder, eos
        self.target, _ = load_hf_folder(folder)
        self.cache = {}

    def get(self, setup: str):
        """'plain', 'eagle' (the copy drafter, whose drafts are accepted; SD at any batch size), 'ngram' or
        'suffix' (vLLM: its own suffix decoding; SGLang has none)."""
        if setup == "suffix" and self.backend == "sglang":
            pytest.skip("SGLang has no suffix decoding")
        if setup not in self.cache:
            make = {
                "plain": lambda: None,
                "eagle": lambda: copy_drafter(self.target),
                "ngram": lambda: NgramDrafter(3, 1),
            }
            drafter = (make | {"suffix": SuffixDrafter})[setup]()
            self.cache[setup] = self.build(drafter, None if drafter is None else STRATEGY)
        return self.cache[setup]

    def build(self, drafter=None, strategy=None, sd_max_batch=None):
        if self.backend.startswith("native"):
            model, _ = load_hf_folder(self.folder)
            tuner = None if drafter is None else FixedTuner(strategy, sd_max_batch or 10**6)
            device = "cuda" if self.backend == "native-cuda" else "cpu"
            return NativeEngine(model, self.eos, MAX_SEQ, tuner=tuner, drafter=drafter, device=device)
        if self.backend == "vllm":
            from tlt.backends.vllm import VLLMEngine

            return VLLMEngine(self.folder, self.eos, MAX_SEQ, drafter, strategy, sd_max_batch, max_num_seqs=256)
        from tlt.backends.sglang import SGLangEngine

        return SGLangEngine(self.folder, self.eos, MAX_SEQ, drafter, strategy, device="cuda")

    def close(self):
        for engine in self.cache.values():
            getattr(engine, "close", lambda: None)()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Weights ~ N(0, 0.5): peaked next-token distributions (no near-ties between backends' float32 kernels)
    and tokens the target likes to repeat."""
    return save_random_target(tmp_path_factory.mktemp("contract") / "target", std=0.5)


@pytest.fixture(scope="module")
def repeated(folder):
    """A prompt of one token t repeated, t being the token most likely to follow itself (p ~ 0.4)."""
    model, _ = load_hf_folder(folder)
    with torch.no_grad():
        runs = torch.arange(model.config.vocab_size)[:, None].expand(-1, 5)  # [V, 5]
        p_repeat = torch.softmax(model(runs).logits[:, -1], -1).diagonal()
    return [int(p_repeat.argmax())] * 5


@pytest.fixture(scope="module")
def reference(folder):
    """The native engine without EOS: the greedy truth."""
    model, _ = load_hf_folder(folder)
    return NativeEngine(model, None, MAX_SEQ)


@pytest.fixture(scope="module")
def eos(reference):
    """A token greedy decoding of prompt 0 first produces at step >= 3, so prompt 0 stops there (STOP)."""
    tokens = reference.generate(PROMPTS[:1], GREEDY)[0].token_ids.tolist()
    return next(t for i, t in enumerate(tokens) if i >= 3 and t not in tokens[:i])


@pytest.fixture(scope="module", params=BACKENDS)
def engines(request, folder, eos):
    engines = Engines(request.param, folder, eos)
    yield engines
    engines.close()


def _truth(reference: NativeEngine, eos: int, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    """Greedy tokens cut after the first eos."""
    out = []
    for r in reference.generate(prompts, params):
        tokens = r.token_ids.tolist()
        out.append(tokens[: tokens.index(eos) + 1] if eos in tokens else tokens)
    return out


def _tokens(rollouts) -> list[list[int]]:
    return [r.token_ids.tolist() for r in rollouts]


# ---- the contract -----------------------------------------------------------------------------------------


def test_shapes_grouping_and_finish_reasons(engines):
    engine = engines.get("plain")
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=0)
    rollouts = engine.generate(PROMPTS, params, n=3)
    assert [(r.prompt_index, r.sample_index) for r in rollouts] == [(p, s) for p in range(4) for s in range(3)]
    for r in rollouts:
        assert r.prompt_ids.tolist() == PROMPTS[r.prompt_index]
        assert r.token_ids.dtype == torch.long and r.logprobs.dtype == torch.float32
        assert r.token_ids.shape == r.logprobs.shape and 1 <= r.token_ids.numel() <= 10
        assert bool((r.logprobs <= 0).all())
        if r.finish_reason is FinishReason.STOP:
            assert r.token_ids[-1].item() == engines.eos and engines.eos not in r.token_ids[:-1].tolist()
        else:
            assert r.token_ids.numel() == 10 and engines.eos not in r.token_ids.tolist()
    assert engine.generate([], params) == []


def test_seeded_sampling_is_reproducible_and_samples_differ(engines):
    engine = engines.get("plain")
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    first, again = (
        _tokens(engine.generate(PROMPTS[:2], params, n=4)),
        _tokens(engine.generate(PROMPTS[:2], params, n=4)),
    )
    assert first == again
    assert len({tuple(t) for t in first[:4]}) > 1  # the n samples of a prompt are not copies


def test_greedy_samples_of_a_prompt_are_equal(engines, reference):
    rollouts = engines.get("plain").generate(PROMPTS[:2], GREEDY, n=2)
    assert [(r.prompt_index, r.sample_index) for r in rollouts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert _tokens(rollouts) == [t for t in _truth(reference, engines.eos, PROMPTS[:2]) for _ in range(2)]


@pytest.mark.parametrize("setup", ["plain", "eagle", "ngram", "suffix"])
def test_greedy_equals_native(engines, reference, repeated, setup):
    engine = engines.get(setup)
    rollouts = engine.generate(PROMPTS, GREEDY)
    assert _tokens(rollouts) == _truth(reference, engines.eos)
    assert rollouts[0].finish_reason is FinishReason.STOP
    looping = [repeated, repeated[:3], PROMPTS[1]]  # where the drafters' drafts are accepted
    params = SamplingParams(temperature=0, max_new_tokens=40)
    assert _tokens(engine.generate(looping, params)) == _truth(reference, engines.eos, looping, params)
    accepted = sum(s.accepted_tokens for s in engine.step_stats)
    assert accepted > 0 if setup != "plain" else accepted == 0  # SD was tested, not plain decoding twice


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_logprobs_are_the_targets(engines, temperature):
    """log_softmax(logits / T) of each sampled token (T = 1 when greedy), from an HF forward pass."""
    params = SamplingParams(temperature=temperature, max_new_tokens=12, seed=1)
    scale = temperature or 1.0
    if engines.backend == "sglang" and temperature not in (0.0, 1.0):  # its log-probs are unscaled
        with pytest.raises(UnsupportedFeatureError, match="temperature 1"):
            engines.get("eagle").generate(PROMPTS, params)
        return
    for prompt, r in zip(PROMPTS, engines.get("eagle").generate(PROMPTS, params), strict=True):
        with torch.no_grad():
            logits = engines.target(torch.tensor([prompt + r.token_ids.tolist()])).logits[0]
        P = len(prompt)
        expected = torch.log_softmax(logits[P - 1 : -1] / scale, -1).gather(1, r.token_ids[:, None]).squeeze(1)
        torch.testing.assert_close(r.logprobs, expected, atol=2e-4, rtol=0)


def test_weight_update_changes_outputs_as_expected(engines, reference):
    engine = engines.get("plain")
    original = {k: v.clone() for k, v in engines.target.state_dict().items()}
    changed = {
        k: v + 0.05 * torch.randn_like(v, generator=torch.Generator().manual_seed(3)) for k, v in original.items()
    }
    model, _ = load_hf_folder(engines.folder)
    model.load_state_dict(changed)
    expected = _truth(NativeEngine(model, None, MAX_SEQ), engines.eos)
    assert expected != _truth(reference, engines.eos)
    try:
        engine.update_weights(changed, version=5)
        assert _tokens(engine.generate(PROMPTS, GREEDY)) == expected
        assert engine.weights_version == 5
    finally:
        engine.update_weights(original, version=6)
    assert _tokens(engine.generate(PROMPTS, GREEDY)) == _truth(reference, engines.eos)


def test_bad_weights_are_rejected_and_change_nothing(engines, reference):
    engine = engines.get("plain")
    state = engines.target.state_dict()
    with pytest.raises(KeyError, match="unknown parameter"):
        engine.update_weights({"model.nope.weight": torch.zeros(1)})
    name = "model.layers.0.mlp.up_proj.weight"
    with pytest.raises(ValueError, match="shape mismatch"):
        engine.update_weights({name: torch.zeros(3, 3), "model.norm.weight": state["model.norm.weight"] * 2})
    assert _tokens(engine.generate(PROMPTS, GREEDY)) == _truth(reference, engines.eos)


def test_drafter_update_takes_effect_and_keeps_greedy_output(engines, reference, repeated):
    """After a push of the dead drafter (with the same policy) no draft is accepted, after a push of the copy
    drafter drafts are accepted again, and greedy output stays the target's throughout."""
    engine = engines.get("eagle")
    looping = [repeated, repeated[:3]]
    truth = _truth(reference, engines.eos, looping, SamplingParams(temperature=0, max_new_tokens=40))
    if not engine.capabilities.drafter_hot_swap:
        with pytest.raises(PushError, match="new SGLangEngine"):
            push(engine, engines.target.state_dict(), dead_drafter(engines.target), version=1)
        return
    try:
        for drafter, accepts in ((dead_drafter(engines.target), False), (copy_drafter(engines.target), True)):
            push(engine, engines.target.state_dict(), drafter, version=1)
            assert _tokens(engine.generate(looping, SamplingParams(temperature=0, max_new_tokens=40))) == truth
            assert (sum(s.accepted_tokens for s in engine.step_stats) > 0) == accepts
        assert _tokens(engine.generate(PROMPTS, GREEDY)) == _truth(reference, engines.eos)
    finally:
        engine.set_drafter(copy_drafter(engines.target))


@pytest.mark.parametrize("setup", ["eagle", "suffix"])
def test_speculative_sampling_keeps_the_targets_distribution(engines, repeated, setup):
    """Chi-square test of homogeneity (alpha = 0.001 per position) between the tokens at positions 1-3 of
    3000 samples with SD (the copy drafter, or suffix drafts of the repeated prompt token: both get drafts
    accepted) and 3000 without."""
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=11)
    prompt = [repeated]
    plain = _padded(engines.get("plain").generate(prompt, params, n=3000))
    engine = engines.get(setup)
    rollouts = engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=4, seed=12), n=3000)
    assert sum(s.accepted_tokens for s in engine.step_stats) > 500  # the test exercises acceptance
    spec = _padded(rollouts)
    for position in range(1, 4):
        table = _contingency(plain[:, position], spec[:, position])
        assert chi2_contingency(table).pvalue > 1e-3, f"position {position}: SD changed the distribution"


def _padded(rollouts, length: int = 4) -> torch.Tensor:
    """[N, length] tokens, -1 after a sample's end (EOS)."""
    out = torch.full((len(rollouts), length), -1)
    for i, r in enumerate(rollouts):
        out[i, : r.token_ids.numel()] = r.token_ids[:length]
    return out


def _contingency(a: torch.Tensor, b: torch.Tensor, min_count: int = 5) -> list[list[int]]:
    """2 x K counts of the tokens in a and b; tokens rarer than min_count in both are pooled."""
    tokens = sorted(set(a.tolist()) | set(b.tolist()))
    rows = [[int((x == t).sum()) for t in tokens] for x in (a, b)]
    keep = [i for i in range(len(tokens)) if rows[0][i] + rows[1][i] >= 2 * min_count]
    pooled = [sum(r) - sum(r[i] for i in keep) for r in rows]
    table = [[r[i] for i in keep] + ([p] if any(pooled) else []) for r, p in zip(rows, pooled, strict=True)]
    return table


def test_prompt_limits_and_argument_errors(engines):
    engine = engines.get("plain")
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="engine limit"):
        engine.generate([list(range(1, MAX_SEQ + 5))], GREEDY)
    with pytest.raises(ValueError, match="n \\(samples per prompt\\)"):
        engine.generate(PROMPTS, GREEDY, n=0)


def test_unsupported_features_fail_clearly(engines):
    caps = engines.get("plain").capabilities
    if not caps.tree_drafts:
        with pytest.raises(UnsupportedFeatureError, match="chains"):
            engines.build(NgramDrafter(3, 1), "3_2_6")
    if "small_lm" not in caps.drafters:
        with pytest.raises(UnsupportedFeatureError, match="small_lm"):
            engines.build(SmallLMDrafter.from_preset("test", engines.target.config.vocab_size, 0), STRATEGY)
    if engines.backend != "native":  # vLLM and SGLang keep the drafter kind they started with
        with pytest.raises(UnsupportedFeatureError, match="cannot switch"):
            engines.get("eagle").set_drafter(NgramDrafter(3, 1))
    if engines.backend == "vllm":
        with pytest.raises(UnsupportedFeatureError, match="top-k"):
            engines.get("plain").generate(PROMPTS, SamplingParams(temperature=1.0, top_k=5))


def test_mismatched_drafter_is_rejected(engines):
    other = EagleDrafter.from_target(_wider_target(engines.target), seed=0)
    with pytest.raises(DrafterMismatchError, match="hidden_size"):
        engines.get("eagle").check_drafter(other)


def _wider_target(target):
    from tlt.models.presets import ModelPreset, build_model

    preset = ModelPreset(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128)
    return build_model(preset, target.config.vocab_size)
