"""docs/config.md is what eval.config_reference generates from tlt/config.py, and documents every key."""

import dataclasses

from eval.config_reference import OUTPUT, main, render
from tlt.config import RunConfig


def test_the_reference_is_current():
    assert main(["--check"]) == 0, "docs/config.md is out of date: run `python -m eval.config_reference`"


def test_every_key_is_listed_with_a_meaning():
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    keys = {row.split("`")[1] for row in rows}
    for f in dataclasses.fields(RunConfig):
        value = getattr(RunConfig(), f.name)
        expected = (
            [f"{f.name}.{g.name}" for g in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else [f.name]
        )
        assert set(expected) <= keys
    undocumented = [row.split("`")[1] for row in rows if row.rstrip().endswith("|  |")]
    assert not undocumented, f"config keys without a comment in tlt/config.py: {undocumented}"


def test_check_catches_a_stale_file(tmp_path, monkeypatch):
    stale = tmp_path / "config.md"
    stale.write_text(OUTPUT.read_text().replace("AdamW", "Adam"))
    monkeypatch.setattr("eval.config_reference.OUTPUT", stale)
    assert main(["--check"]) == 1
