"""`tlt sweep`: grid expansion, up-front validation, resume, failure recording and result files (fake runner)."""

import csv
import json
import re
from pathlib import Path

import pytest

from tlt.cli import parse_args
from tlt.config import ConfigError, RunConfig, load_config
from tlt.eval.sweep import flatten_summary, run_sweep, to_markdown, validate
from tlt.eval.sweep_grid import Cell, GridSection, expand, load_grid, slug
from tlt.machine import describe_machine, machine_name

CONFIGS = Path(__file__).parents[2] / "configs"

GRID = """\
base: {base}
output_dir: {out}
overrides: [grpo.steps=2]
grid:
  product:
    speculative.tuner: [fixed, cost]
    drafter.kind: [eagle, ngram]
  cells:
    - name: baseline
      overrides: [speculative.enabled=false, scheduler.policy=never]
"""


def _grid(tmp_path: Path, text: str = GRID, out: str = "sweep") -> Path:
    (tmp_path / "base.yaml").write_text("speculative:\n  strategies: ['3_1_4']\nscheduler:\n  policy: never\n")
    path = tmp_path / "grid.yaml"
    path.write_text(text.format(base="base.yaml", out=tmp_path / out))
    return path


class FakeRunner:
    """Writes a summary.json like run_train's; `fail` names cells that raise."""

    def __init__(self, fail: tuple[str, ...] = ()):
        self.fail, self.ran, self.turns = fail, [], []

    def __call__(self, cfg: RunConfig) -> dict:
        out = Path(cfg.output_dir)
        self.ran.append(out.name)
        self.turns.append((out.name, cfg.train.stop_after))
        if out.name in self.fail:
            raise RuntimeError(f"boom in {out.name}")
        summary = {
            "steps": min(cfg.train.stop_after or cfg.grpo.steps, cfg.grpo.steps),
            "reward_last": 0.5,
            "accuracy_last": 0.25,
            "accept_length_mean": 2.0 if cfg.speculative.enabled else 0.0,
            "sd_token_share_mean": 0.5,
            "step_seconds_mean": 1.5,
            "seconds": {"rollout": 1.0, "train": 1.0, "drafter": 0.5, "push": 0.0, "total": 2.5},
        }
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary))
        return summary


def test_expansion_product_and_explicit_with_stable_names(tmp_path):
    grid = load_grid(_grid(tmp_path))
    assert [c.name for c in grid.cells] == [
        "baseline",
        "speculative.tuner-fixed_drafter.kind-eagle",
        "speculative.tuner-fixed_drafter.kind-ngram",
        "speculative.tuner-cost_drafter.kind-eagle",
        "speculative.tuner-cost_drafter.kind-ngram",
    ]
    assert grid.cells[3].overrides == ("speculative.tuner=cost", "drafter.kind=eagle")
    assert load_grid(_grid(tmp_path)).cells == grid.cells  # stable
    configs = validate(grid)
    cfg = configs["speculative.tuner-cost_drafter.kind-ngram"]
    assert (cfg.speculative.tuner, cfg.drafter.kind, cfg.grpo.steps) == ("cost", "ngram", 2)
    assert cfg.output_dir == str(tmp_path / "sweep" / "speculative.tuner-cost_drafter.kind-ngram")
    assert configs["baseline"].speculative.enabled is False


def test_slug_is_filesystem_safe():
    assert slug("speculative.tuner=cost,drafter.kind=eagle") == "speculative.tuner-cost_drafter.kind-eagle"
    assert slug("speculative.strategies=['3_1_4', '2_1_3']") == "speculative.strategies-3_1_4-2_1_3"
    assert "/" not in slug("output_dir=/etc/x") and " " not in slug("a b")


def test_product_only_and_list_values(tmp_path):
    cells = expand(GridSection.parse({"product": {"speculative.strategies": [["3_1_4"], ["2_1_3"]]}}))
    assert [c.overrides for c in cells] == [
        ('speculative.strategies=["3_1_4"]',),
        ('speculative.strategies=["2_1_3"]',),
    ]
    assert [c.name for c in cells] == ["speculative.strategies-3_1_4", "speculative.strategies-2_1_3"]
    with pytest.raises(ConfigError, match=r"grid: cell name\(s\) \['a'\] given more than once"):
        expand(GridSection.parse({"cells": [{"name": "a"}, {"name": "a"}]}))
    with pytest.raises(ConfigError, match="grid: no cells; give grid.cells and/or grid.product"):
        GridSection.parse({})


BAD_GRIDS = {
    "unknown top-level key": (GRID + "bogus: 1\n", "bogus: unknown key; allowed: base, grid, output_dir, overrides"),
    "unknown cell key": (
        GRID.replace("- name: baseline\n", "- name: baseline\n      nme: x\n"),
        "grid.cells[0].nme: unknown key; allowed: name, base, overrides",
    ),
    "missing key": (GRID.replace("base: {base}\n", ""), "base: missing; this key is required"),
    "overrides not a list": (
        GRID.replace("overrides: [grpo.steps=2]", "overrides: grpo.steps=2"),
        "overrides: got 'grpo.steps=2'; allowed: a list of key=value strings",
    ),
    "cells not a list": (
        "base: {base}\ngrid:\n  cells: baseline\n",
        "grid.cells: got 'baseline'; allowed: a list of cells (name, base, overrides)",
    ),
    "base not a path": (GRID.replace("base: {base}", "base: [a, b]"), "base: got ['a', 'b']; allowed: a file path"),
    "empty axis": (
        GRID.replace("drafter.kind: [eagle, ngram]", "drafter.kind: []"),
        "grid.product.drafter.kind: got []; allowed: a non-empty list of values",
    ),
    "no cells": ("base: {base}\ngrid:\n  product:\n", "grid: no cells; give grid.cells and/or grid.product"),
    "override not key=value": (
        GRID.replace("[speculative.enabled=false,", "[speculative.enabled,"),
        "grid.cells[0].overrides: got 'speculative.enabled'; allowed: key=value strings",
    ),
    "duplicate cell names": (
        GRID + "    - name: speculative.tuner=cost,drafter.kind=eagle\n",
        "grid: cell name(s) ['speculative.tuner-cost_drafter.kind-eagle'] given more than once",
    ),
    "not YAML": (GRID + "  - [\n", "while parsing"),
}


@pytest.mark.parametrize(("text", "fragment"), BAD_GRIDS.values(), ids=BAD_GRIDS.keys())
def test_bad_grid_file_names_the_file_and_the_key(tmp_path, text, fragment):
    path = _grid(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_grid(path)
    assert str(err.value).startswith(f"{path}: ") and fragment in str(err.value)


def test_a_key_left_empty_counts_as_absent(tmp_path):
    text = (
        "base: {base}\noutput_dir:\noverrides:\ngrid:\n  product:\n  cells:\n    - {{name: b, base: , overrides: }}\n"
    )
    grid = load_grid(_grid(tmp_path, text))
    assert grid.output_dir == Path("runs/sweep-grid") and grid.overrides == ()
    assert grid.cells == (Cell("b", ()),)


def test_unknown_key_fails_up_front_naming_the_cell(tmp_path):
    text = GRID + "    - name: broken\n      overrides: [rollout.nope=1]\n"
    runner = FakeRunner()
    path = _grid(tmp_path, text)
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(path))}: sweep cell 'broken': unknown config key 'rollout.nope'"
    ):
        run_sweep(load_grid(path), runner, check_paths=False)
    assert runner.ran == []  # nothing ran
    text = GRID.replace("drafter.kind: [", "drafter.knd: [")
    with pytest.raises(
        ConfigError, match=r"sweep cell 'speculative.tuner-fixed_drafter.knd-eagle': unknown config key"
    ):
        validate(load_grid(_grid(tmp_path, text)))
    text = GRID + "    - name: ngram_online\n      overrides: [drafter.kind=ngram, scheduler.policy=spot]\n"
    with pytest.raises(ConfigError, match=r"sweep cell 'ngram_online': scheduler.policy: online drafter"):
        validate(load_grid(_grid(tmp_path, text)))
    assert not (tmp_path / "sweep").exists()


def test_resume_skips_finished_and_failure_is_recorded(tmp_path):
    grid = load_grid(_grid(tmp_path))
    first = FakeRunner(fail=("speculative.tuner-fixed_drafter.kind-ngram",))
    rows = run_sweep(grid, first, check_paths=False, log=lambda _: None)
    assert first.ran == [c.name for c in grid.cells]  # the failure did not stop the sweep
    status = {r["cell"]: r["status"] for r in rows}
    assert status["speculative.tuner-fixed_drafter.kind-ngram"] == "failed"
    assert list(status.values()).count("done") == 4
    failed = next(r for r in rows if r["status"] == "failed")
    assert "RuntimeError: boom in" in failed["error"]

    second = FakeRunner()
    rows = run_sweep(grid, second, check_paths=False, log=lambda _: None)
    assert second.ran == ["speculative.tuner-fixed_drafter.kind-ngram"]  # only the unfinished cell reruns
    assert [r["status"] for r in rows].count("skipped") == 4

    out = tmp_path / "sweep"
    table = list(csv.DictReader((out / "sweep.csv").open()))
    assert [r["cell"] for r in table] == [c.name for c in grid.cells]
    assert table[0]["overrides"] == "speculative.enabled=false scheduler.policy=never"
    assert float(table[1]["step_seconds_mean"]) == 1.5 and float(table[1]["seconds.total"]) == 2.5
    md = (out / "sweep.md").read_text()
    assert "| cell | status |" in md and "| baseline | skipped |" in md
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    machine = json.loads((out / "machine.json").read_text())  # where it ran, named in the table
    assert machine == describe_machine() | {"load_average": machine["load_average"]}
    assert f"Machine: {machine_name(machine)}, torch threads" in md


def test_table_prints_plain_decimals_and_says_which_cells_had_idle_workers():
    rows = [
        {
            "cell": "one",
            "status": "done",
            "overrides": "",
            **flatten_summary({"devices": 1, "seconds": {"drafter": 2.222e-05}}),
        },
        {
            "cell": "two",
            "status": "done",
            "overrides": "",
            **flatten_summary({"devices": 2, "step_seconds_mean": 12.3456}),
        },
    ]
    md = to_markdown(rows)
    assert "e-05" not in md and "| one | done | no (1 process) |" in md and "| 0.000 |" in md
    assert "| two | done | yes (2 ranks) | 2 |" in md and "| 12.346 |" in md


def test_dry_run_runs_and_writes_nothing(tmp_path):
    runner = FakeRunner()
    rows = run_sweep(load_grid(_grid(tmp_path)), runner, dry_run=True, log=lambda _: None)
    assert {r["status"] for r in rows} == {"planned"} and runner.ran == []
    assert not (tmp_path / "sweep").exists()


def test_missing_model_path_fails_up_front(tmp_path):
    grid = load_grid(_grid(tmp_path), extra=[f"model.path={tmp_path / 'absent'}"])
    with pytest.raises(ConfigError, match="sweep cell 'baseline': model.path"):
        run_sweep(grid, FakeRunner())


def test_missing_drafter_path_fails_up_front_with_the_command_to_make_it(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # the base policy passes the up-front check
    extra = [f"model.path={tmp_path / 'model'}", f"drafter.path={tmp_path / 'drafter'}"]
    runner = FakeRunner()
    with pytest.raises(ConfigError, match="drafter.path: .* not found; distil one first: `tlt train-drafter"):
        run_sweep(load_grid(_grid(tmp_path), extra=extra), runner)
    assert runner.ran == []


def test_cli_parses_sweep():
    args = parse_args(["sweep", "g.yaml", "grpo.steps=1", "--dry-run", "--output-dir", "x"])
    assert (args.command, args.grid, args.dry_run, args.output_dir, args.overrides) == (
        "sweep",
        "g.yaml",
        True,
        "x",
        ["grpo.steps=1"],
    )


def test_ablation_cells():
    """The paper's ablation in the main job's regime: each cell adds one TLT component to the one before."""
    configs = validate(load_grid(CONFIGS / "ablation.yaml"))
    cells = ["baseline", "sd_frozen", "sd_adaptive_drafter", "tlt_full", "drafter_ngram", "drafter_suffix"]
    assert list(configs) == cells
    main = load_config(CONFIGS / "quickstart.yaml")
    for cfg in configs.values():  # the main job's policy, processes, RL and steps
        assert (cfg.model, cfg.rollout, cfg.train.devices) == (main.model, main.rollout, main.train.devices)
        assert cfg.grpo == main.grpo
    assert configs["baseline"].speculative.enabled is False
    frozen, adaptive, full = configs["sd_frozen"], configs["sd_adaptive_drafter"], configs["tlt_full"]
    assert frozen.drafter.path == main.drafter.path  # the offline drafter of the asset
    assert (frozen.scheduler.policy, frozen.speculative.tuner, frozen.speculative.strategies) == (
        "never",
        "fixed",
        ["3_1_4"],
    )
    assert (adaptive.scheduler.policy, adaptive.speculative.tuner) == ("spot", "fixed")
    assert (full.scheduler, full.speculative, full.drafter) == (main.scheduler, main.speculative, main.drafter)
    for kind in ("ngram", "suffix"):
        drafter = configs[f"drafter_{kind}"].drafter
        assert (drafter.kind, drafter.path) == (kind, None)


def test_end_to_end_tiny_sweep(tmp_path):
    """`tlt sweep` on a random test-preset policy: two real 1-step cells, then a resume that skips both."""
    import torch

    from tests.training.test_train_cli import CONFIG
    from tlt.cli import main
    from tlt.config import load_config
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import task_mix, training_problems
    from tlt.models.io import save_hf_folder
    from tlt.models.presets import build_model
    from tlt.models.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    data = load_config(None, ["data.max_difficulty=3"]).data
    texts = [format_prompt(p.question) + p.solution for p in training_problems(task_mix(data), 32, seed=0)]
    tok = train_tokenizer(texts, vocab_size=300)
    model = build_model("test", len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, seed=0)
    save_hf_folder(model, tok, tmp_path / "model")
    (tmp_path / "base.yaml").write_text(CONFIG.format(model=tmp_path / "model"))
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "base: base.yaml\noutput_dir: sweep\noverrides: [grpo.steps=1, scheduler.policy=never]\n"
        "grid:\n  cells:\n    - name: plain\n      overrides: [speculative.enabled=false, scheduler.policy=never]\n"
        "  product:\n    drafter.kind: [ngram]\n"
    )
    out = tmp_path / "sweep"
    assert main(["sweep", str(grid), "--output-dir", str(out)]) == 0
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert [(r["cell"], r["status"]) for r in rows] == [("plain", "done"), ("drafter.kind-ngram", "done")]
    assert float(rows[0]["accept_length_mean"]) == 0 and float(rows[1]["step_seconds_mean"]) > 0
    assert main(["sweep", str(grid), "--output-dir", str(out)]) == 0
    assert {r["status"] for r in csv.DictReader((out / "sweep.csv").open())} == {"skipped"}


def test_table_gives_each_cell_speedup_over_the_first():
    def row(cell, rollout, total, tokens):
        summary = {"response_tokens": tokens, "seconds": {"rollout": rollout, "total": total}}
        return {"cell": cell, "status": "done", "overrides": "", **flatten_summary(summary)}

    rows = [row("base", 6.0, 12.0, 600), row("sd", 4.0, 10.0, 480)]
    rows.append({"cell": "broken", "status": "failed", "overrides": "", **flatten_summary({})})
    lines = {line.split(" | ")[0].lstrip("| "): line for line in to_markdown(rows).splitlines()}
    # sd: 6 / 4 s rollout = 1.5x; 480 tokens in 4 s against 600 in 6 s = 1.2x the throughput; 12 / 10 s = 1.2x
    assert "| 12.000 | 1.000 | 1.000 | 1.000 |" in lines["base"]
    assert "| 10.000 | 1.500 | 1.200 | 1.200 |" in lines["sd"]
    assert "|  |  |  |  |" in lines["broken"]


def test_cells_take_turns_and_a_partial_cell_resumes(tmp_path):
    """turn_steps: every cell runs steps 1-2, then 3-4, then 5 (each turn resuming); a cell stopped after a
    turn is not skipped when the sweep is run again, a finished one is."""
    (tmp_path / "base.yaml").write_text("output_dir: runs/x\nspeculative: {enabled: false}\n")
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(
        f"base: base.yaml\noutput_dir: {tmp_path / 'out'}\noverrides: [grpo.steps=5]\nturn_steps: 2\n"
        "grid:\n  cells:\n    - {name: a}\n    - {name: b, overrides: [grpo.lr=1.0e-6]}\n"
    )
    runner = FakeRunner()
    rows = run_sweep(load_grid(grid_file), runner, check_paths=False, log=lambda _: None)
    assert runner.turns == [("a", 2), ("b", 2), ("a", 4), ("b", 4), ("a", 5), ("b", 5)]
    assert [r["status"] for r in rows] == ["done", "done"]
    assert "took turns of 2 steps" in (tmp_path / "out" / "sweep.md").read_text()
    summary = tmp_path / "out" / "b" / "summary.json"
    summary.write_text(json.dumps({"steps": 2}))  # b stopped after its first turn
    again = FakeRunner()
    rows = run_sweep(load_grid(grid_file), again, check_paths=False, log=lambda _: None)
    assert again.turns == [("b", 2), ("b", 4), ("b", 5)]  # tlt train resumes b's checkpoint in each
    assert [r["status"] for r in rows] == ["skipped", "done"]


def test_turn_steps_must_be_a_count(tmp_path):
    (tmp_path / "base.yaml").write_text("output_dir: runs/x\n")
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text("base: base.yaml\nturn_steps: two\ngrid:\n  cells: [{name: a}]\n")
    with pytest.raises(ConfigError, match="turn_steps: got 'two'"):
        load_grid(grid_file)
