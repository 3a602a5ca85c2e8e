"""`tlt train` end to end on a random test-preset policy: progress, metrics.csv, summary plot and JSON,
checkpoint contents; a resumed run equals an uninterrupted one bit for bit; checkpoints are all or nothing;
clear errors."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.tiny_model import save_math_policy
from tlt.cli import main, parse_args
from tlt.config import load_config
from tlt.data.splits import task_mix, training_problems
from tlt.models.io import load_hf_folder
from tlt.training import checkpoint
from tlt.training.checkpoint import find_checkpoint, save_checkpoint
from tlt.training.rl_loop import RLTrainer
from tlt.training.run_log import COLUMNS, MetricsLog

# TLT on with a timing-independent tuner (SD on every decode step) and drafter budget (`between_steps`: a fixed
# number of micro-steps; one-process `spot` trains within a wall-time budget), so runs are reproducible; entropy and KL
# terms move the policy although math rewards of a random policy are all 0 (and exercise the KL reference).
CONFIG = """\
seed: 0
model: {{preset: test, path: {model}}}
data: {{max_difficulty: 3, train_size: 16}}
rollout: {{samples_per_prompt: 4, prompts_per_step: 2, max_new_tokens: 8, max_seq_len: 128}}
speculative: {{tuner: fixed, strategies: ["3_1_4"], threshold: 64}}
drafter: {{batch_tokens: 128}}
scheduler: {{policy: between_steps, between_steps_budget: 2}}
grpo: {{minibatch_size: 4, lr: 0.001, entropy_coef: 0.01, kl_coef: 0.01}}
train: {{checkpoint_every: 2, tensorboard: false, device: cpu}}
"""
TIMINGS = {c for c in COLUMNS if c.endswith("_seconds")}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """A YAML config whose model.path is a random test-preset policy saved with its tokenizer."""
    root = tmp_path_factory.mktemp("train")
    save_math_policy(root / "model")
    path = root / "tlt.yaml"
    path.write_text(CONFIG.format(model=root / "model"))
    return path


def _train(config, out, *overrides) -> int:
    return main(["train", str(config), *overrides, "--output-dir", str(out)])


def _untimed(metrics: dict) -> list[list]:
    """The step's decode timeline without its seconds (batch, strategy, steps, tokens per run)."""
    return [run[:3] + run[4:] for run in metrics["timeline"]]


def _csv_rows(out) -> list[list[str]]:
    return [line.split(",") for line in (out / "metrics.csv").read_text().splitlines()]


def test_two_steps_write_metrics_plot_summary_and_checkpoint(config, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(config, out, "grpo.steps=2", "speculative.tuner=cost", "train.tensorboard=true") == 0

    stdout = capsys.readouterr().out
    assert "[tlt] step 1/2  reward" in stdout and "[tlt] step 2/2" in stdout and "accept" in stdout
    rows = _csv_rows(out)
    assert rows[0] == COLUMNS and [r[0] for r in rows[1:]] == ["0", "1"]
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["tuner"] == "cost" and summary["seconds"]["total"] > 0
    assert json.loads(stdout[stdout.index("{") :]) == summary

    ckpt = out / "checkpoint"
    assert find_checkpoint(out) == ckpt
    assert {p.name for p in ckpt.iterdir()} == {
        "policy",
        "drafter",
        "trainer.pt",
        "metrics.json",
        "config.yaml",
        "meta.json",
    }
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (ckpt / "policy").iterdir()}
    assert (ckpt / "drafter" / "tlt_drafter.json").is_file()
    assert json.loads((ckpt / "meta.json").read_text()) == {"step": 2, "version": 2}
    state = torch.load(ckpt / "trainer.pt", weights_only=True)
    assert set(state["rng"]) == {"python", "torch", "cuda"} and state["trainer"]["step"] == 2
    assert all(state["trainer"][k] is not None for k in ("reference", "tuner", "buffer", "drafter_optimizer"))
    assert [m["step"] for m in json.loads((ckpt / "metrics.json").read_text())] == [0, 1]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no temp folders left


def test_resume_equals_an_uninterrupted_run(config, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _train(config, straight, "grpo.steps=3") == 0
    assert _train(config, resumed, "grpo.steps=2") == 0
    with (resumed / "metrics.csv").open("a") as f:  # a step logged after the checkpoint, then a crash
        f.write("2,garbage\n")
    assert _train(config, resumed, "grpo.steps=3") == 0

    a, b = straight / "checkpoint", resumed / "checkpoint"
    for weights in ("policy/model.safetensors", "drafter/model.safetensors"):
        wa, wb = load_file(a / weights), load_file(b / weights)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), weights
    sa, sb = (torch.load(p / "trainer.pt", weights_only=True)["trainer"] for p in (a, b))
    for key in ("optimizer", "drafter_optimizer"):
        for (pa, ta), (pb, tb) in zip(sa[key]["state"].items(), sb[key]["state"].items(), strict=True):
            assert pa == pb and all(torch.equal(ta[k], tb[k]) for k in ta), key
    assert sa["tuner"] == sb["tuner"] and sa["sampler"] == sb["sampler"]
    assert torch.equal(sa["generator"], sb["generator"])
    assert torch.equal(sa["buffer"]["generator"], sb["buffer"]["generator"])
    assert len(sa["buffer"]["samples"]) == len(sb["buffer"]["samples"]) == 24

    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert len(ma) == len(mb) == 3
    for x, y in zip(ma, mb, strict=True):
        assert {k: v for k, v in x.items() if k not in TIMINGS} | {"timeline": _untimed(x)} == {
            k: v for k, v in y.items() if k not in TIMINGS
        } | {"timeline": _untimed(y)}
    assert mb[2]["kl"] > 0 and mb[2]["drafter_steps"] == 2 and mb[2]["sd_token_share"] > 0
    rows = _csv_rows(resumed)
    assert [r[0] for r in rows[1:]] == ["0", "1", "2"] and len({len(r) for r in rows}) == 1


def test_checkpoint_is_all_or_nothing(config, tmp_path, monkeypatch):
    cfg = load_config(config, ["grpo.steps=1"])
    problems = training_problems(task_mix(cfg.data), 4, seed=0)
    from tlt.models.io import load_hf_folder

    policy, tokenizer = load_hf_folder(cfg.model.path)
    trainer = RLTrainer(cfg, policy, tokenizer, problems)
    save_checkpoint(tmp_path, trainer, [])
    trainer.step()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "to_yaml", crash)  # fails after policy, drafter and trainer.pt are written
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, trainer, [{"step": 0}])
    assert json.loads((tmp_path / "checkpoint" / "meta.json").read_text())["step"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]

    # a crash between the two renames of the swap leaves only the previous checkpoint, under .old
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoint.old"
    shutil.rmtree(tmp_path / "checkpoint.old")
    assert find_checkpoint(tmp_path) is None


def test_missing_tensorboard_is_reported_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard", None)
    log = MetricsLog(tmp_path, [], tensorboard=True)
    assert log.writer is None and "tensorboard is not installed" in capsys.readouterr().out
    assert _csv_rows(tmp_path) == [COLUMNS]


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["grpo.nope=1"], ["unknown config key 'grpo.nope'"]),
        (["train.checkpoint_every=0"], ["train.checkpoint_every: got 0"]),
        (
            ["model.path=/nonexistent/model"],
            ["model.path: /nonexistent/model not found", "tlt bootstrap --preset test --output-dir /nonexistent`"],
        ),
        (["model.path=/nonexistent/policy"], ["model.path: /nonexistent/policy not found", "--output-dir runs/base"]),
        (["model.path=null"], ["model.path: not set", "tlt bootstrap"]),
        (["drafter.path=/nonexistent/drafter"], ["drafter.path: /nonexistent/drafter not found", "tlt train-drafter"]),
        (["data.jsonl=[/nonexistent/gsm8k.jsonl]"], ["data.jsonl: /nonexistent/gsm8k.jsonl not found", "MATH-format"]),
    ],
)
def test_clear_errors(config, tmp_path, capsys, overrides, fragments):
    assert _train(config, tmp_path / "run", *overrides) == 2
    err = capsys.readouterr().err
    assert err.startswith("tlt train: error:") and all(f in err for f in fragments), err


def test_resume_under_a_changed_config_names_the_keys(config, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(config, out, "grpo.steps=1") == 0
    assert _train(config, out, "grpo.steps=2", "grpo.lr=0.01") == 2
    assert "grpo.lr changed" in capsys.readouterr().err


def test_a_damaged_drafter_path_is_a_one_line_error_naming_the_file(config, tmp_path, capsys):
    folder = tmp_path / "drafter"
    folder.mkdir()
    (folder / "tlt_drafter.json").write_text('{"kind": "eagle",')
    assert _train(config, tmp_path / "run", f"drafter.path={folder}") == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the policy's loading bar
    assert err.startswith("tlt train: error: drafter.path: ") and "tlt_drafter.json: not valid JSON at line 1" in err


def test_a_damaged_base_policy_is_a_one_line_error_naming_the_file(config, tmp_path, capsys):
    policy = tmp_path / "policy"
    shutil.copytree(load_config(config).model.path, policy)
    (policy / "model.safetensors").write_bytes((policy / "model.safetensors").read_bytes()[:-8])
    assert _train(config, tmp_path / "run", f"model.path={policy}") == 2
    err = capsys.readouterr().err
    assert err.startswith("tlt train: error: model.path: ") and err.count("\n") == 1, err
    assert "policy/model.safetensors: not a readable safetensors file" in err and not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def one_step(config, tmp_path_factory):
    out = tmp_path_factory.mktemp("one_step") / "run"
    assert _train(config, out, "grpo.steps=1") == 0
    return out


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        ("metrics.json", '[{"step": 0,', "metrics.json: not valid JSON at line 1, column 13"),
        ("meta.json", "[1]", "meta.json: expected a JSON object"),
        ("drafter/tlt_drafter.json", "{", "tlt_drafter.json: not valid JSON at line 1, column 2"),
        ("trainer.pt", "not a torch file", "trainer.pt: torch.load cannot read it"),
        ("policy/model.safetensors", "cut", "policy/model.safetensors: not a readable safetensors file"),
        ("policy/tokenizer.json", '{"model": ', "policy/tokenizer.json: not valid JSON at line 1, column 11"),
        ("drafter/model.safetensors", "cut", "drafter/model.safetensors: not a readable safetensors file"),
    ],
)
def test_a_damaged_checkpoint_is_a_one_line_error_naming_the_file(
    one_step, config, tmp_path, capsys, name, text, fragment
):
    out = tmp_path / "run"
    shutil.copytree(one_step, out)
    (out / "checkpoint" / name).write_text(text)
    assert _train(config, out, "grpo.steps=2") == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the checkpoint policy's loading bar, if any
    assert err.startswith("tlt train: error: cannot resume from") and fragment in err and "move the folder away" in err
    assert (out / "checkpoint" / name).read_text() == text and not (out / "checkpoint.old").exists()


def test_overrides_may_come_before_or_after_options():
    for argv in (
        ["train", "c.yaml", "grpo.steps=3", "--output-dir", "x", "seed=1"],
        ["train", "--output-dir", "x", "c.yaml", "grpo.steps=3", "seed=1"],
    ):
        args = parse_args(argv)
        assert (args.command, args.config, args.output_dir) == ("train", "c.yaml", "x")
        assert args.overrides == ["grpo.steps=3", "seed=1"] and args.func.__name__ == "cmd_train"
    args = parse_args(["evaluate", "m", "eval.batch_size=4", "--n", "8", "data.seed=2"])
    assert args.overrides == ["eval.batch_size=4", "data.seed=2"] and args.n == 8


def test_async_drafter_checkpoint_is_written_and_resumes_drafter_training(config, tmp_path, capsys):
    from tlt.training.drafter.checkpoint import load_drafter_checkpoint

    out = tmp_path / "run"
    assert _train(config, out, "grpo.steps=2") == 0
    drafter, state = load_drafter_checkpoint(out / "drafter_latest")
    assert (state["step"], state["version"]) == (2, 2)
    final = load_file(out / "checkpoint" / "drafter" / "model.safetensors")
    assert all(torch.equal(drafter.head.state_dict()[k], v) for k, v in final.items())
    rows = (out / "metrics.csv").read_text().splitlines()
    assert "drafter_checkpoint_seconds" in rows[0]
    state_file = out / "drafter_latest" / "drafter_state.pt"
    whole = state_file.read_bytes()
    state_file.write_bytes(whole[:200])
    capsys.readouterr()  # the first run's output
    assert _train(config, tmp_path / "damaged", f"drafter.path={out / 'drafter_latest'}") == 2
    err = capsys.readouterr().err
    assert err.startswith("tlt train: error: drafter.path: ") and err.count("\n") == 1, err
    assert "drafter_latest/drafter_state.pt: torch.load cannot read it" in err
    state_file.write_bytes(whole)
    # a new run starting from it continues drafter training with its optimizer state
    cfg = load_config(config, [f"drafter.path={out / 'drafter_latest'}", f"output_dir={tmp_path / 'next'}"])
    policy, tokenizer = load_hf_folder(cfg.model.path)
    problems = training_problems(task_mix(cfg.data), cfg.data.train_size, cfg.data.seed)
    trainer = RLTrainer(cfg, policy, tokenizer, problems)
    restored = trainer.stepper.optimizer.state_dict()["state"]
    assert restored and all(
        torch.equal(restored[i]["exp_avg"], state["optimizer"]["state"][i]["exp_avg"]) for i in restored
    )
    trainer.close()


def test_data_jsonl_files_are_the_rl_prompts(config, tmp_path):
    """`data.jsonl`: GSM8K- and MATH-format files replace the generated mix as tlt train's prompts."""
    from tlt.data.jsonl import write_jsonl
    from tlt.data.splits import rl_problems
    from tlt.data.tasks import MathProblem
    from tlt.training.train import run_train

    ours = [MathProblem(f"What is {i} + {i}?", f"{2 * i}", "mine", 1, None) for i in (101, 202, 303)]
    write_jsonl(ours[:2], tmp_path / "a.jsonl", "gsm8k")
    write_jsonl(ours[2:], tmp_path / "b.jsonl", "math")
    files = f"data.jsonl=[{tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}]"
    cfg = load_config(config, [files, "grpo.steps=2", f"output_dir={tmp_path / 'run'}"])
    assert [(p.question, p.answer) for p in rl_problems(cfg.data)] == [(p.question, p.answer) for p in ours]
    golds = []

    def reward(texts, answers):
        golds.extend(answers)
        return [0.0] * len(texts)

    assert run_train(cfg, reward_fn=reward)["steps"] == 2
    assert len(golds) == 2 * 2 * 4 and set(golds) <= {"202", "404", "606"}  # steps x prompts x samples


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_steps_on_cuda_then_a_resume(config, tmp_path):
    """The same run on a GPU (`eval/gpu_checks.sh`): the engine's log-probs match the recompute, it resumes."""
    out = tmp_path / "run"
    assert _train(config, out, "grpo.steps=2", "train.device=cuda") == 0
    assert _train(config, out, "grpo.steps=3", "train.device=cuda") == 0
    metrics = json.loads((out / "checkpoint" / "metrics.json").read_text())
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(m["logprob_gap"] < 1e-3 and m["sd_token_share"] > 0 for m in metrics)
