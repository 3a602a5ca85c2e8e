"""The native engine's static-shape path (`cuda_graphs=True`; uncaptured on CPU): the same tokens and log-probs as
the eager path, plain and speculative, with rows finishing at different steps; on CUDA, the captured graphs give
the CPU reference's tokens (gpu mark). The whole identity and exactness suites also run on the static path with
`pytest --static-shapes` (a stage of `make test`)."""

import pytest
import torch

from tests.tiny_model import random_target
from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.ngram import NgramDrafter
from tlt.models.graphs import batch_bucket, kv_bucket
from tlt.schedulers.tuners import FixedTuner

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [20]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)


def test_buckets():
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 33)] == [1, 2, 4, 8, 8, 16, 64]
    assert [kv_bucket(n, 576) for n in (1, 128, 129, 500, 570)] == [128, 128, 256, 512, 576]


def _engine(target, static: bool, drafter=None, strategy=None, eos=None):
    tuner = None if drafter is None else FixedTuner(strategy, threshold=64)
    return NativeEngine(target, eos, 96, tuner=tuner, drafter=drafter, cuda_graphs=static)


def _same(a, b):
    assert [r.token_ids.tolist() for r in a] == [r.token_ids.tolist() for r in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("drafter", "strategy"),
    [(None, None), ("eagle", "3_1_4"), ("eagle", "3_2_6"), ("ngram", "4_1_5")],
)
def test_static_path_equals_eager(drafter, strategy):
    target = random_target(0.15)
    make = {"eagle": lambda: EagleDrafter.from_target(target, seed=1), "ngram": NgramDrafter, None: lambda: None}
    eos = 7  # rows stop at different steps, so the running batch shrinks through the buckets
    eager = _engine(target, False, make[drafter](), strategy, eos)
    static = _engine(target, True, make[drafter](), strategy, eos)
    _same(eager.generate(PROMPTS, GREEDY, n=3), static.generate(PROMPTS, GREEDY, n=3))
    assert static.runner._buffer.batch == 16  # 12 rows padded to the bucket
    if drafter == "ngram":  # the random target loops, so prompt lookup is accepted: verify steps ran
        assert sum(s.accepted_tokens for s in static.step_stats) > 0
    if drafter == "eagle":  # the drafter ran on static shapes too, and drafted what the eager path drafted
        assert static.drafter.buffer is not None and static.drafter.buffer[0].shape[0] == 16
        assert [s.accepted_tokens for s in static.step_stats] == [s.accepted_tokens for s in eager.step_stats]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_drafting_consumes_long_prompts_and_plain_steps_in_chunks(temperature):
    """A prompt longer than a chunk, and plain steps buffered until the tail switches SD on (the long prompt's
    rows stop at the context limit after 81 tokens, then 4 rows run: threshold 4), so the flushes consume more
    than STATIC_CHUNK pairs per row in padded chunks; drafts and outputs as eager, sampled chains included
    (their draws run on the running rows only)."""
    target = random_target(0.15)
    prompts = [[(i * 7) % 60 + 1 for i in range(99)], list(range(3, 40)), [5, 6, 7]]
    sampling = SamplingParams(temperature=temperature, max_new_tokens=120, seed=3)

    def run(static):
        tuner = FixedTuner("4_1_5", threshold=4)
        drafter = EagleDrafter.from_target(target, seed=1)
        engine = NativeEngine(target, None, 180, tuner=tuner, drafter=drafter, cuda_graphs=static)
        return engine, engine.generate(prompts, sampling, n=2)

    (eager, a), (static, b) = run(False), run(True)
    _same(a, b)
    assert [s.accepted_tokens for s in static.step_stats] == [s.accepted_tokens for s in eager.step_stats]
    assert any(s.sd_on for s in static.step_stats) and not static.step_stats[0].sd_on


def test_static_path_samples_as_eager_with_the_same_seed():
    target = random_target(0.15)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
    eager = _engine(target, False, NgramDrafter(), "3_1_4").generate(PROMPTS, sampling, n=2)
    static = _engine(target, True, NgramDrafter(), "3_1_4").generate(PROMPTS, sampling, n=2)
    _same(eager, static)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", [None, "3_1_4", "3_2_6"])
def test_cuda_graphs_replay_the_cpu_reference(strategy):
    """Target steps and EAGLE drafting captured and replayed on CUDA: the CPU's output, the CPU's drafts."""
    cpu = _engine(
        random_target(0.15), False, strategy and EagleDrafter.from_target(random_target(0.15), seed=1), strategy
    )
    reference = cpu.generate(PROMPTS, GREEDY, n=3)
    target = random_target(0.15)
    drafter = strategy and EagleDrafter.from_target(target, seed=1)
    tuner = strategy and FixedTuner(strategy, threshold=64)
    engine = NativeEngine(target, None, 96, tuner=tuner, drafter=drafter, cuda_graphs=True, device="cuda")
    out = engine.generate(PROMPTS, GREEDY, n=3)
    assert engine.runner.static.graphs.captured  # shapes were captured and replayed
    assert [r.token_ids.tolist() for r in out] == [r.token_ids.tolist() for r in reference]
    if strategy:
        assert engine.drafter.graphs.captured
        assert [s.accepted_tokens for s in engine.step_stats] == [s.accepted_tokens for s in cpu.step_stats]


def test_the_static_shapes_option_builds_engines_on_the_static_path(request):
    """`pytest --static-shapes` (a stage of `make test`) really runs the suites on the static path."""
    engine = NativeEngine(random_target(0.15), None, 32)
    assert (engine.runner.static is not None) == request.config.getoption("--static-shapes")
