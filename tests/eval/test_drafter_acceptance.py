import pytest

from eval.drafter_acceptance import main
from tests.tiny_model import save_math_policy
from tlt.drafters.eagle import EagleDrafter
from tlt.models.io import load_hf_folder


def test_drafters_compared_on_the_same_rows_and_rendered_again_from_json(tmp_path, capsys):
    policy = save_math_policy(tmp_path / "policy")
    model, _ = load_hf_folder(policy)
    for name in ("a", "b"):
        EagleDrafter.from_target(model, seed=0).save(tmp_path / name)
    out = tmp_path / "out"
    argv = ["--policy", str(policy), "--drafter", f"a={tmp_path / 'a'}", "--drafter", f"b={tmp_path / 'b'}"]
    argv += [
        "--prompts",
        "3",
        "--samples",
        "2",
        "--strategies",
        "2_1_3",
        "--temperatures",
        "0,1",
        "--max-new-tokens",
        "12",
    ]
    assert main([*argv, "--config", "", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| 2_1_3")]
    assert len(rows) == 2  # T = 0 and T = 1
    for row in rows:  # the same head on the same rows and seed accepts alike: the ratio is exactly 1
        a, b, ratio = row.strip("| ").split(" | ")[2:]
        assert a == b and float(a) >= 1.0 and ratio == "1.000"
    assert main(["--from-json", str(out / "acceptance.json")]) == 0
    assert capsys.readouterr().out == text[text.index("# Drafter acceptance") :]


def test_a_drafter_must_be_named(capsys):
    with pytest.raises(SystemExit):
        main(["--policy", "p", "--drafter", "no-name-here"])
    assert "NAME=PATH" in capsys.readouterr().err
