"""`tlt parity` end to end on a random test-preset model, and its errors for bad input."""

import json
import re

import pytest

from tests.tiny_model import save_tiny_model
from tlt.cli import main
from tlt.data import MathProblem, write_jsonl
from tlt.data.jsonl import detect_format
from tlt.eval.parity import ParitySettings


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("parity") / "model")


def test_sd_only_parity_reports_identical_greedy_outputs(tmp_path, tiny_model, capsys):
    out = tmp_path / "out"
    argv = [
        "parity",
        str(tiny_model),
        "--sd-only",
        "--n",
        "8",
        "--max-new-tokens",
        "16",
        "--batch-size",
        "4",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads((out / "parity.json").read_text())
    assert report["outputs"] == {"compared": 8, "identical": 8, "must_match": True, "mismatches": []}
    assert report["sides"]["B"]["decode"]["sd_steps"] > 0 and report["sides"]["A"]["decode"]["sd_steps"] == 0
    strict = report["results"]["tlt_gsm8k_local"]["strict"]
    assert strict["n"] == 8 and strict["only_a"] == strict["only_b"] == 0 and strict["mcnemar_p"] == 1.0
    assert report["verdict"] == "no significant difference at alpha=0.05"
    markdown = (out / "parity.md").read_text()
    assert "Identical response tokens: 8/8 problems." in markdown and "**PASS**" in markdown
    assert "| tlt_gsm8k_local | math_verify | 8 |" in markdown
    assert len((out / "data" / "heldout.gsm8k.jsonl").read_text().splitlines()) == 8
    assert "identical outputs 8/8" in capsys.readouterr().out


@pytest.fixture
def gsm8k_file(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl([MathProblem("1 + 1?", "2", "x", 1, None)] * 2, path, "gsm8k")
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data", "{tmp}/missing.jsonl"], "no JSONL data file at"),
        (["--data", "{tmp}/bad.jsonl"], r"bad.jsonl:3: malformed gsm8k record"),
        (
            ["--data", "{tmp}/p.jsonl", "--tasks", "tlt_math_local"],
            r"is gsm8k format; task\(s\) \['tlt_math_local'\]",
        ),
        (["--tasks", "tlt_gsm8k"], r"unknown task\(s\) \['tlt_gsm8k'\]"),
        (["extra_model"], "give two models"),
    ],
)
def test_bad_input_exits_2_with_the_reason(tmp_path, gsm8k_file, tiny_model, capsys, extra, message):
    (tmp_path / "bad.jsonl").write_text(gsm8k_file.read_text() + '{"question": "q", "answer": "no final line"}\n')
    argv = [
        "parity",
        str(tiny_model),
        *(a.format(tmp=tmp_path) for a in extra),
        "--sd-only",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tlt parity: error:")
    assert re.search(message, err), err


def test_missing_model_folder_is_a_clear_error(tmp_path, gsm8k_file, capsys):
    argv = ["parity", str(tmp_path / "nope"), "--sd-only", "--data", str(gsm8k_file), "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "model folder not found" in capsys.readouterr().err


def test_data_format_is_read_from_the_first_record(tmp_path, gsm8k_file):
    assert detect_format(gsm8k_file) == "gsm8k"
    math = tmp_path / "m.jsonl"
    math.write_text('\n{"problem": "p", "solution": "\\\\boxed{1}"}\n')
    assert detect_format(math) == "math"
    math.write_text('\n\n{"problem": oops}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:3: not valid JSON"):
        detect_format(math)


def test_settings_sides_compare_sd_off_with_sd_on():
    (label_a, a), (label_b, b) = ParitySettings("m", sd_only=True, max_new_tokens=16).sides()
    assert (a["sd"], a["drafter"], b["sd"], b["drafter"]) == ("off", "none", "on", "ngram")
    assert label_a == "m sd=off" and b["max_new_tokens"] == 16
