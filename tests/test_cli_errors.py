"""Every command answers bad input with one `tlt <command>: error:` line (naming the file, line or key), not a
traceback; `--debug` shows the traceback."""

import pytest

from tlt.cli import main
from tlt.config import ConfigError


@pytest.fixture
def bad_inputs(tmp_path):
    yaml = tmp_path / "bad.yaml"
    yaml.write_text("seed: 0\nrollout: {samples_per_prompt: 4\n")
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"question": "What is 1 + 1?", "answer": "#### 2"}\n{not json\n')
    return yaml, jsonl


def _one_line(capsys, command: str, fragment: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"tlt {command}: error: ") and fragment in err and "--debug" in err


def test_bad_yaml_bad_jsonl_and_unknown_families_are_one_line_errors(bad_inputs, tmp_path, capsys):
    yaml, jsonl = bad_inputs
    assert main(["train", str(yaml)]) == 2
    _one_line(capsys, "train", "bad.yaml is not valid YAML at line 3")
    good = tmp_path / "good.yaml"
    good.write_text("seed: 0\n")
    out = str(tmp_path / "run")
    assert main(["train", str(good), f"data.jsonl=[{jsonl}]", "model.path=absent", "--output-dir", out]) == 2
    _one_line(capsys, "train", "bad.jsonl:2: malformed gsm8k record")
    assert main(["evaluate", "absent", "data.families=[nope]", "data.weights=[1]"]) == 2
    _one_line(capsys, "evaluate", "data.families: got ['nope']; allowed: reasoning-gym datasets: ")
    assert main(["bootstrap", "--config", str(yaml)]) == 2
    _one_line(capsys, "bootstrap", "bad.yaml is not valid YAML")
    assert main(["train-drafter", "absent", "--config", str(yaml)]) == 2
    _one_line(capsys, "train-drafter", "bad.yaml is not valid YAML")


def test_a_damaged_model_folder_is_a_one_line_error_naming_the_file(tmp_path, capsys):
    from tests.tiny_model import save_math_policy

    model = tmp_path / "model"
    save_math_policy(model)
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:-8])
    capsys.readouterr()  # the save's progress bar
    for command in (["evaluate", str(model)], ["train-drafter", str(model), "--output", str(tmp_path / "d")]):
        assert main(command) == 2
        _one_line(capsys, command[0], "model/model.safetensors: not a readable safetensors file")
    assert not (tmp_path / "d").exists()


def test_debug_shows_the_traceback(bad_inputs):
    yaml, _ = bad_inputs
    with pytest.raises(ConfigError, match="not valid YAML"):
        main(["train", str(yaml), "--debug"])
