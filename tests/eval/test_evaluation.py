"""Held-out evaluation: greedy, and sampled accuracy averaged over k responses per problem (avg@k)."""

import json

import pytest

import tlt.eval.heldout as evaluation
from tests.tiny_model import save_math_policy
from tlt.cli import main
from tlt.config import load_config
from tlt.data.prompts import format_prompt
from tlt.data.splits import heldout_problems, task_mix
from tlt.eval.heldout import evaluate, generate_responses
from tlt.models.io import load_hf_folder

MAX_NEW = 12


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return save_math_policy(tmp_path_factory.mktemp("eval") / "model")


@pytest.fixture(scope="module")
def policy(model_folder):
    return load_hf_folder(model_folder)


@pytest.fixture(scope="module")
def problems():
    return heldout_problems(task_mix(load_config(None, ["data.max_difficulty=3"]).data), 6, seed=0)


def _without_time(report) -> dict:
    return {k: v for k, v in report.to_dict().items() if k != "seconds"}


def test_greedy_and_seeded_sampling_are_reproducible(policy, problems):
    model, tokenizer = policy
    greedy = evaluate(model, tokenizer, problems, MAX_NEW, batch_size=4)
    assert _without_time(greedy) == _without_time(evaluate(model, tokenizer, problems, MAX_NEW, batch_size=4))
    assert (greedy.temperature, greedy.samples) == (0.0, 1) and "greedy" in greedy.summary()
    sampled = [evaluate(model, tokenizer, problems, MAX_NEW, 4, temperature=1.0, samples=2) for _ in range(2)]
    assert _without_time(sampled[0]) == _without_time(sampled[1])
    assert "mean of 2 samples at T=1" in sampled[0].summary()


def test_sampled_responses_depend_on_the_seed(policy, problems):
    model, tokenizer = policy
    prompts = [format_prompt(p.question) for p in problems]
    first = generate_responses(model, tokenizer, prompts, MAX_NEW, 4, temperature=1.0, seed=0)
    assert first == generate_responses(model, tokenizer, prompts, MAX_NEW, 4, temperature=1.0, seed=0)
    assert first != generate_responses(model, tokenizer, prompts, MAX_NEW, 4, temperature=1.0, seed=1)


def test_accuracy_is_the_mean_over_every_sampled_response(policy, problems, monkeypatch):
    """With a reward that varies between responses, the accuracy is the mean over all n x k of them."""
    model, tokenizer = policy
    reward = lambda text, gold: float(len(text) % 2 == 0)  # noqa: E731
    monkeypatch.setattr(evaluation, "math_reward", reward)
    report = evaluate(model, tokenizer, problems, MAX_NEW, 4, temperature=1.0, samples=3, seed=5)
    prompts = [format_prompt(p.question) for p in problems]
    texts = [
        tokenizer.decode(r, skip_special_tokens=True)
        for k in range(3)
        for r in generate_responses(model, tokenizer, prompts, MAX_NEW, 4, 1.0, seed=5 + k * len(problems))
    ]
    scores = [reward(t, "") for t in texts]
    assert len(scores) == 18 and 0 < sum(scores) < 18  # the check below can tell a mean from one round
    assert report.accuracy == pytest.approx(sum(scores) / len(scores))


def test_bad_sample_settings_are_refused(policy, problems, model_folder, capsys):
    model, tokenizer = policy
    with pytest.raises(ValueError, match="samples > 1 needs a temperature > 0"):
        evaluate(model, tokenizer, problems, MAX_NEW, 4, samples=2)
    with pytest.raises(ValueError, match="samples must be >= 1"):
        evaluate(model, tokenizer, problems, MAX_NEW, 4, temperature=1.0, samples=0)
    assert main(["evaluate", str(model_folder), "--samples", "3", "--n", "4"]) == 2
    assert "needs a temperature > 0" in capsys.readouterr().err


def test_cli_writes_the_sampled_report(model_folder, tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = ["evaluate", str(model_folder), "--n", "4", "--temperature", "0.7", "--samples", "2", "--report", str(out)]
    assert main([*argv, "data.max_difficulty=3", f"eval.max_new_tokens={MAX_NEW}"]) == 0
    report = json.loads(out.read_text())
    assert (report["temperature"], report["samples"], report["num_problems"]) == (0.7, 2, 4)
    assert "mean of 2 samples at T=0.7" in capsys.readouterr().out
