"""Offline EAGLE distillation: data alignment, batching, and a short run that raises the acceptance length."""

import logging
import random

import pytest
import torch

from tests.tiny_model import random_target
from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.cli import build_parser
from tlt.config import ConfigError, DrafterConfig
from tlt.drafters import load_drafter
from tlt.schedulers.tuners import FixedTuner
from tlt.training.drafter.distill import collect_sequences, distill_drafter, distill_small_lm


@pytest.fixture(scope="module")
def target():
    """A tiny random Qwen2 (vocab 64) whose greedy continuations are varied but patterned."""
    return random_target(0.15)


def _prompts(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(3, 64) for _ in range(rng.randint(2, 6))] for _ in range(n)]


def test_collected_features_match_a_full_forward(target):
    prompts = _prompts(3, seed=1)
    data = collect_sequences(target, prompts, SamplingParams(temperature=0, max_new_tokens=8), eos_token_id=None)
    for s, p in zip(data, prompts, strict=True):
        # prompt + response without the last response token, whose feature is never computed
        assert s.tokens[: len(p)].tolist() == p and s.num_tokens == len(p) + 7
        assert s.loss_mask.tolist() == [False] * len(p) + [True] * 7 and s.hidden.shape == (s.num_tokens, 128)
        with torch.no_grad():
            full = target.model(s.tokens[None]).last_hidden_state[0]
        torch.testing.assert_close(s.hidden, full, atol=1e-4, rtol=0)


def test_drafter_config_validation():
    with pytest.raises(ConfigError, match="drafter.eval_strategy"):
        DrafterConfig(eval_strategy="4_1")
    with pytest.raises(ConfigError, match="drafter.train_steps"):
        DrafterConfig(train_steps=0)


def test_cli_has_train_drafter():
    args = build_parser().parse_args(["train-drafter", "runs/x/model", "drafter.train_steps=5", "--output", "d"])
    assert args.func.__name__ == "cmd_train_drafter" and args.overrides == ["drafter.train_steps=5"]


def test_short_distillation_raises_acceptance_and_stays_lossless(target, tmp_path):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    cfg = DrafterConfig(train_steps=80, lr=3e-3, batch_tokens=1024, distill_max_new_tokens=32, eval_strategy="3_1_4")
    heldout = _prompts(8, seed=2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    drafter, report = distill_drafter(
        target, _prompts(64, seed=0), heldout, cfg, None, tmp_path / "eagle", seed=0, progress=False
    )
    assert report.accept_before < 1.2  # an untrained head is (almost) never right
    assert report.accept_after > report.accept_before + 1.0
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())  # frozen, shared, untouched
    assert drafter.head.embed.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    loaded = load_drafter(tmp_path / "eagle")
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    plain = NativeEngine(target, eos_token_id=None, max_seq_len=64).generate(heldout, greedy)
    engine = NativeEngine(target, eos_token_id=None, max_seq_len=64, tuner=FixedTuner("3_2_6", 64), drafter=loaded)
    for a, b in zip(engine.generate(heldout, greedy), plain, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert sum(s.accepted_tokens for s in engine.step_stats) > 8 * 8


def test_small_lm_distillation_raises_acceptance_and_saves(target, tmp_path):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    cfg = DrafterConfig(kind="small_lm", train_steps=80, lr=3e-3, distill_max_new_tokens=32, eval_strategy="3_1_4")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    drafter, report = distill_small_lm(
        target, _prompts(64, seed=0), _prompts(8, seed=2), cfg, None, tmp_path / "lm", seed=0, progress=False
    )
    assert report.accept_after > report.accept_before + 0.5
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())  # the target is untouched
    loaded = load_drafter(tmp_path / "lm")
    assert loaded.kind == "small_lm"
    saved, trained = loaded.model.state_dict(), drafter.model.state_dict()
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)


def test_train_drafter_refuses_ngram(tmp_path):
    from tlt.config import load_config
    from tlt.training.drafter.distill import run_train_drafter

    with pytest.raises(ConfigError, match="eagle or small_lm"):
        run_train_drafter(load_config(None, ["drafter.kind=ngram"]), tmp_path / "model", tmp_path / "d")


def test_distillation_prompts_come_from_data_jsonl_when_given(tmp_path):
    from tlt.config import load_config
    from tlt.data.jsonl import write_jsonl
    from tlt.data.tasks import MathProblem
    from tlt.training.drafter.distill import distillation_prompts

    ours = [MathProblem(f"What is {i} + 1?", str(i + 1), "mine", 1, None) for i in range(10)]
    write_jsonl(ours, tmp_path / "mine.jsonl", "gsm8k")
    files = f"data.jsonl=[{tmp_path / 'mine.jsonl'}]"
    cfg = load_config(None, [files, "drafter.eval_prompts=3", "drafter.distill_prompts=100"])
    train, heldout = distillation_prompts(cfg)
    assert len(heldout) == 3 and len(train) == 7  # every problem once; held-out ones disjoint from training
    assert {p.question for p in train + heldout} == {p.question for p in ours}
    generated, _ = distillation_prompts(load_config(None, ["drafter.distill_prompts=5"]))
    assert len(generated) == 5 and all(p.family != "mine" for p in generated)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_drafter_on_cuda(tmp_path):
    """`tlt train-drafter` on a GPU (`eval/gpu_checks.sh`): distils there and saves a loadable drafter."""
    from tests.tiny_model import save_math_policy
    from tlt.config import load_config
    from tlt.training.drafter.distill import run_train_drafter

    model = save_math_policy(tmp_path / "model")
    overrides = ["train.device=cuda", "drafter.train_steps=20", "drafter.distill_prompts=16", "drafter.eval_prompts=4"]
    report = run_train_drafter(load_config(None, overrides), model, tmp_path / "drafter", progress=False)
    assert report.steps == 20 and report.accept_after > 0
    assert load_drafter(tmp_path / "drafter").kind == "eagle"
