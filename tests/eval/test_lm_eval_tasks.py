"""The lm-eval tasks tlt_gsm8k_local / tlt_math_local: YAMLs load through TaskManager, metrics score right."""

import json

import lm_eval.tasks as lm_eval_tasks
import pytest

from tlt.data import MathProblem, write_jsonl
from tlt.data.prompts import format_prompt
from tlt.eval.lm_tasks import TASK_FORMATS, task_yaml, write_task_dir
from tlt.eval.lm_tasks.metrics import gsm8k_answer, gsm8k_results, math_answer, math_results, score

PROBLEMS = [
    MathProblem("What is 1,000 + 234?", "1234", "gsm8k", 1, "1,000 + 234 = 1234\n\\boxed{1234}"),
    MathProblem("Half of one?", "\\frac{1}{2}", "math", 2, "1 / 2\n\\boxed{\\frac{1}{2}}"),
]


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_tasks")
    files = {"tlt_gsm8k_local": folder / "p.gsm8k.jsonl", "tlt_math_local": folder / "p.math.jsonl"}
    write_jsonl(PROBLEMS[:1], files["tlt_gsm8k_local"], "gsm8k")
    write_jsonl(PROBLEMS, files["tlt_math_local"], "math")
    return lm_eval_tasks.TaskManager(include_path=str(write_task_dir(folder / "tasks", files)), include_defaults=False)


def test_task_yamls_load_with_local_data_and_tlt_prompts(task_manager):
    assert set(TASK_FORMATS) <= set(task_manager.all_tasks)
    tasks = lm_eval_tasks.get_task_dict(list(TASK_FORMATS), task_manager)
    gsm8k, math = tasks["tlt_gsm8k_local"], tasks["tlt_math_local"]
    assert gsm8k.OUTPUT_TYPE == math.OUTPUT_TYPE == "generate_until"
    docs = list(math.test_docs())
    assert len(docs) == 2 and len(list(gsm8k.test_docs())) == 1
    assert math.doc_to_text(docs[1]) == format_prompt("Half of one?")
    assert math.doc_to_target(docs[1]) == "\\frac{1}{2}"
    assert gsm8k.config.generation_kwargs["until"] == []
    assert {m["metric"] for m in math.config.metric_list} == {"strict", "flexible", "math_verify"}


def test_task_yaml_names_absolute_data_and_base_paths(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    text = task_yaml("tlt_gsm8k_local", data)
    assert f'"{data.resolve()}"' in text and "gsm8k_local.yaml" in text and "task: tlt_gsm8k_local" in text


def test_task_yaml_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown tlt lm-eval task 'gsm8k'"):
        task_yaml("gsm8k", tmp_path / "d.jsonl")
    with pytest.raises(FileNotFoundError, match="no data file"):
        task_yaml("tlt_math_local", tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("so the total is \\boxed{1,234}.", "1234", (1, 1, 1)),  # normalised boxed; last number 1234
        ("I think 1234 is it", "1234", (0, 1, 0)),  # no boxed answer: only flexible
        ("\\boxed{1234} (checked with 5 steps)", "1234", (1, 0, 1)),  # last number is 5
        ("\\boxed{0.5}", "\\frac{1}{2}", (0, 0, 1)),  # only math-verify sees 0.5 == 1/2
        ("\\boxed{7}", "1234", (0, 0, 0)),
        ("", "3", (0, 0, 0)),
    ],
)
def test_metrics_score_known_answers(response, gold, expected):
    assert tuple(score(response, gold).values()) == expected
    assert list(score(response, gold)) == ["strict", "flexible", "math_verify"]


def test_process_results_read_the_gold_of_each_format():
    gsm8k_doc = {"question": "q", "answer": "3 * 4 = <<3*4=12>>12\n#### 12"}
    math_doc = {"problem": "p", "solution": "so $\\boxed{\\dfrac{3}{4}}$", "level": "Level 2"}
    assert gsm8k_answer(gsm8k_doc) == "12" and math_answer(math_doc) == "\\dfrac{3}{4}"
    assert gsm8k_results(gsm8k_doc, ["\\boxed{12}"]) == {"strict": 1.0, "flexible": 1.0, "math_verify": 1.0}
    assert math_results(math_doc, ["\\boxed{0.75}"])["math_verify"] == 1.0
