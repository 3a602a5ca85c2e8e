"""`tlt train ... rollout.backend=vllm` end to end on a random test-preset policy (vLLM environment only):
metrics with vLLM's log-probs equal to the trainer's recompute, the drafter reloaded into vLLM every step,
resume, and two processes with one vLLM engine each."""

import csv
import json

import pytest

from tests.tiny_model import save_math_policy
from tlt.cli import main

pytestmark = pytest.mark.vllm

CONFIG = """\
seed: 0
model: {{preset: test, path: {model}}}
data: {{max_difficulty: 3, train_size: 16}}
rollout: {{backend: vllm, samples_per_prompt: 4, prompts_per_step: 2, max_new_tokens: 16, max_seq_len: 128}}
speculative: {{tuner: fixed, strategies: ["3_1_4"], threshold: 4}}
drafter: {{batch_tokens: 128}}
scheduler: {{policy: between_steps, between_steps_budget: 2}}
grpo: {{minibatch_size: 4, lr: 0.001}}
train: {{checkpoint_every: 1, tensorboard: false, device: cpu}}
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_vllm")
    save_math_policy(root / "model")
    path = root / "vllm.yaml"
    path.write_text(CONFIG.format(model=root / "model"))
    return path


def _rows(out) -> list[dict]:
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_train_with_vllm_runs_resumes_and_matches_the_trainers_logprobs(config, tmp_path):
    out = tmp_path / "run"
    assert main(["train", str(config), "grpo.steps=2", "--output-dir", str(out)]) == 0
    rows = _rows(out)
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(float(r["logprob_gap"]) < 1e-4 for r in rows)  # vLLM's log-probs are the policy's
    assert all(int(r["drafter_steps"]) == 2 for r in rows)
    assert (out / "engine" / "rank0" / "drafter" / "model.safetensors").is_file()  # the pushed drafter
    assert main(["train", str(config), "grpo.steps=3", "--output-dir", str(out)]) == 0  # resumes at step 2
    assert [int(r["step"]) for r in _rows(out)] == [0, 1, 2]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


def test_two_processes_with_one_vllm_engine_each(config, tmp_path):
    out = tmp_path / "run2"
    assert main(["train", str(config), "grpo.steps=1", "train.devices=2", "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["devices"] == 2 and summary["replicas_identical"]
    assert float(_rows(out)[0]["logprob_gap"]) < 1e-4


def test_fsdp_update_with_vllm_engines_taking_engine_args(config, tmp_path):
    """The GPU preset's shape on CPU: 2 ranks, the update sharded by FSDP, vLLM engines in bfloat16 through
    rollout.engine_args (their log-probs then differ from the float32 trainer's: the keyword reached vLLM)."""
    out = tmp_path / "fsdp"
    args = ["grpo.steps=1", "train.devices=2", "train.sharding=fsdp", "rollout.engine_args.dtype=bfloat16"]
    assert main(["train", str(config), *args, "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["devices"] == 2 and summary["replicas_identical"]
    assert float(_rows(out)[0]["logprob_gap"]) > 1e-3
