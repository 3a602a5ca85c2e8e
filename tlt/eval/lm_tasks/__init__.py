"""The lm-eval tasks `tlt_gsm8k_local` and `tlt_math_local` over local JSONL files (no download).

The shipped `<fmt>_local.yaml` files hold everything but the data file; `write_task_dir` writes, per task, a
YAML that includes one of them by absolute path and names an absolute data file, into a folder to hand to
`lm_eval.tasks.TaskManager(include_path=folder, include_defaults=False)`. Importing this needs no lm-eval.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from tlt.data.jsonl import Format
from tlt.files import atomic_write_text

TASK_FORMATS: dict[str, Format] = {"tlt_gsm8k_local": "gsm8k", "tlt_math_local": "math"}
_HERE = Path(__file__).resolve().parent


def task_yaml(task: str, data_file: str | Path) -> str:
    """The YAML of `task` over `data_file` (JSON strings are YAML scalars, so any path is quoted safely)."""
    if task not in TASK_FORMATS:
        raise ValueError(f"unknown tlt lm-eval task {task!r}; available: {', '.join(TASK_FORMATS)}")
    data_file = Path(data_file).resolve()
    if not data_file.is_file():
        raise FileNotFoundError(f"task {task}: no data file at {data_file}")
    base = _HERE / f"{TASK_FORMATS[task]}_local.yaml"
    return (
        f"include: {json.dumps(str(base))}\n"
        f"task: {task}\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data_file))}\n"
    )


def write_task_dir(folder: str | Path, data_files: Mapping[str, str | Path]) -> Path:
    """Write `<task>.yaml` for every task -> data file of `data_files` into `folder`; returns the folder."""
    folder = Path(folder)
    for task, data_file in data_files.items():
        atomic_write_text(folder / f"{task}.yaml", task_yaml(task, data_file))
    return folder
