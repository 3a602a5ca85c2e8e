"""The README's Python examples run as written (the training one on a shortened run)."""

import json
import re
from pathlib import Path

import tlt.config

README = Path(__file__).parents[1] / "README.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_engine_example_drafts_and_accepts():
    scope = {"__name__": "readme"}
    exec(compile(examples()[1], "README.md: engine example", "exec"), scope)
    assert len(scope["rollouts"]) == 16  # 2 prompts x 8 samples
    assert sum(s.accepted_tokens for s in scope["engine"].step_stats) > 0


def test_the_training_example_runs_on_a_users_jsonl_and_reward(tmp_path, monkeypatch):
    """As written (its config path made absolute, as the test runs in a folder of its own), with its own config
    overrides plus three that shorten the run (one step of 32 tokens on one process), appended by a wrapper
    around load_config."""
    monkeypatch.chdir(tmp_path)
    with open("my_train.jsonl", "w") as f:
        for a in range(40):
            f.write(json.dumps({"question": f"What is {a} + 3?", "answer": f"{a} + 3 = {a + 3}\n#### {a + 3}"}) + "\n")
    load = tlt.config.load_config
    short = ["grpo.steps=1", "rollout.max_new_tokens=32", "train.devices=1"]
    monkeypatch.setattr(tlt.config, "load_config", lambda path, overrides=(): load(path, [*overrides, *short]))
    source = examples()[0].replace('"configs/tlt.yaml"', repr(str(README.parent / "configs/tlt.yaml")))
    scope = {"__name__": "__main__"}
    exec(compile(source, "README.md: training example", "exec"), scope)
    summary = json.loads((tmp_path / "runs/mine/summary.json").read_text())
    assert summary["steps"] == 1 and scope["reward"](["x\n7"], ["7"]) == [1.0]
