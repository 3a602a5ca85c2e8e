"""`tlt parity`: two models, or one model with SD off vs on, on the same lm-eval tasks, problem by problem.

Each side is the lm-eval model `tlt` (tlt.eval.lm) run through `lm_eval.simple_evaluate` on the local
tasks of `tlt.eval.lm_tasks`; per task and metric the report gives both accuracies with Wilson 95% intervals, the
paired difference (B - A) and an exact McNemar p-value (tlt.eval.parity_stats). It also compares the response
token ids of every problem: with --sd-only the tasks decode greedily, so lossless SD must reproduce the plain
output exactly, and any mismatch fails the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tlt.data.jsonl import detect_format, read_jsonl, write_jsonl
from tlt.eval.lm import DecodeTotals, register_tlt_model, require_lm_eval
from tlt.eval.lm_tasks import TASK_FORMATS, write_task_dir
from tlt.eval.lm_tasks.metrics import METRICS
from tlt.eval.parity_stats import PairedComparison, compare_paired

_TASK_OF_FORMAT = {fmt: task for task, fmt in TASK_FORMATS.items()}


@dataclass(frozen=True)
class ParitySettings:
    """What `tlt parity` compares, on which problems, and how each side decodes."""

    model_a: str  # HF model folder
    model_b: str | None = None  # None with sd_only
    sd_only: bool = False  # compare model_a with SD off (A) and on (B)
    tasks: tuple[str, ...] = ()  # () = the task of the data file's format (tlt_gsm8k_local without --data)
    data: str | None = None  # GSM8K- or MATH-format JSONL; None = the config's held-out set
    n: int | None = None  # problems per task (None: all of --data, data.heldout_size held-out problems)
    sd: str = "off"  # SD for both sides when comparing two models
    drafter: str = "ngram"  # drafter folder or "ngram", used where SD is on
    strategy: str = "4_1_5"
    max_new_tokens: int = 768
    batch_size: int = 64
    alpha: float = 0.05
    out: str = "runs/parity"

    def __post_init__(self) -> None:
        if self.sd_only == (self.model_b is not None):
            raise ValueError("give two models (A B), or one model with --sd-only")
        unknown = [t for t in self.tasks if t not in TASK_FORMATS]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; available: {', '.join(TASK_FORMATS)}")
        if self.n is not None and self.n < 1:
            raise ValueError(f"--n must be >= 1, got {self.n}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.sd not in ("on", "off"):
            raise ValueError(f"--sd must be on or off, got {self.sd!r}")

    def sides(self) -> list[tuple[str, dict]]:
        """(label, tlt model args) of side A and side B."""
        common = {
            "strategy": self.strategy,
            "max_new_tokens": self.max_new_tokens,
            "batch_size": self.batch_size,
        }
        if self.sd_only:
            return [
                (
                    f"{self.model_a} sd=off",
                    {"pretrained": self.model_a, "sd": "off", "drafter": "none", **common},
                ),
                (
                    f"{self.model_a} sd=on",
                    {"pretrained": self.model_a, "sd": "on", "drafter": self.drafter, **common},
                ),
            ]
        drafter = self.drafter if self.sd == "on" else "none"
        return [
            (f"{m} sd={self.sd}", {"pretrained": m, "sd": self.sd, "drafter": drafter, **common})
            for m in (self.model_a, self.model_b)
        ]


@dataclass
class SideRun:
    """One side's lm-eval run: 0/1 scores per task and metric in doc order, and its generations."""

    label: str
    model_args: dict
    scores: dict[str, dict[str, list[float]]]  # task -> metric -> [problems]
    outputs: dict[tuple[str, int], list[int]]  # (task, doc_id) -> response token ids
    texts: dict[tuple[str, int], str]  # (task, doc_id) -> response text
    totals: DecodeTotals
    seconds: float


@dataclass
class OutputMismatch:
    task: str
    doc_id: int
    first_diff: int  # index of the first differing response token
    text_a: str
    text_b: str


@dataclass
class ParityReport:
    settings: ParitySettings
    labels: tuple[str, str]
    data_files: dict[str, str]  # task -> JSONL file
    comparisons: dict[str, dict[str, PairedComparison]]  # task -> metric -> A vs B
    compared_outputs: int
    mismatches: list[OutputMismatch]
    sides_args: tuple[dict, dict]  # the tlt model args of A and B
    totals: tuple[DecodeTotals, DecodeTotals]
    seconds: tuple[float, float]
    lm_eval_version: str

    @property
    def differs(self) -> bool:
        return any(
            c.differs(self.settings.alpha) for by_metric in self.comparisons.values() for c in by_metric.values()
        )

    @property
    def outputs_must_match(self) -> bool:
        """SD off vs on with greedy tasks: lossless SD must give the very same tokens."""
        return self.settings.sd_only

    @property
    def failed(self) -> bool:
        return self.outputs_must_match and bool(self.mismatches)


def prepare_data(settings: ParitySettings, data_cfg, folder: Path) -> dict[str, Path]:
    """task -> JSONL file: --data (checked line by line), else held-out problems in each task's format."""
    if settings.data is not None:
        fmt = detect_format(settings.data)
        read_jsonl(settings.data, fmt)  # a malformed line raises with its line number
        tasks = settings.tasks or (_TASK_OF_FORMAT[fmt],)
        wrong = [t for t in tasks if TASK_FORMATS[t] != fmt]
        if wrong:
            raise ValueError(
                f"{settings.data} is {fmt} format; task(s) {wrong} need "
                f"{', '.join(TASK_FORMATS[t] for t in wrong)} format"
            )
        return {t: Path(settings.data).resolve() for t in tasks}
    from tlt.data.splits import heldout_problems, task_mix

    problems = heldout_problems(task_mix(data_cfg), settings.n or data_cfg.heldout_size, data_cfg.seed)
    files = {}
    for task in settings.tasks or ("tlt_gsm8k_local",):
        fmt = TASK_FORMATS[task]
        files[task] = (folder / f"heldout.{fmt}.jsonl").resolve()
        write_jsonl(problems, files[task], fmt)
    return files


def run_side(label: str, model_args: dict, tasks: list[str], task_manager, limit: int | None) -> SideRun:
    """Evaluate one side with lm-eval: per-doc scores from its sample log, token ids from the records."""
    from lm_eval import simple_evaluate

    start = time.perf_counter()
    lm = register_tlt_model().create_from_arg_obj(model_args)
    results = simple_evaluate(
        model=lm, tasks=tasks, task_manager=task_manager, limit=limit, log_samples=True, bootstrap_iters=0
    )
    scores: dict[str, dict[str, list[float]]] = {}
    for task in tasks:
        samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
        scores[task] = {m: [float(s[m]) for s in samples] for m in METRICS}
    outputs = {(r.task, r.doc_id): r.token_ids for r in lm.records}
    texts = {(r.task, r.doc_id): r.text for r in lm.records}
    return SideRun(label, model_args, scores, outputs, texts, lm.generator.totals, time.perf_counter() - start)


def compare_outputs(a: SideRun, b: SideRun) -> tuple[int, list[OutputMismatch]]:
    """(number of problems compared, the ones whose response token ids differ)."""
    if set(a.outputs) != set(b.outputs):
        raise RuntimeError("the two sides answered different requests; cannot pair their outputs")
    mismatches = []
    for key in sorted(a.outputs):
        ta, tb = a.outputs[key], b.outputs[key]
        if ta != tb:
            first = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
            mismatches.append(OutputMismatch(key[0], key[1], first, a.texts[key], b.texts[key]))
    return len(a.outputs), mismatches


def run_parity(settings: ParitySettings, data_cfg) -> ParityReport:
    """Run both sides on the same problems and compare them; writes data and task files under settings.out."""
    require_lm_eval()
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = Path(settings.out)
    data_files = prepare_data(settings, data_cfg, out / "data")
    tasks = list(data_files)
    task_manager = TaskManager(include_path=str(write_task_dir(out / "lm_tasks", data_files)), include_defaults=False)
    limit = settings.n if settings.data is not None else None
    (label_a, args_a), (label_b, args_b) = settings.sides()
    a = run_side(label_a, args_a, tasks, task_manager, limit)
    b = run_side(label_b, args_b, tasks, task_manager, limit)
    comparisons = {t: {m: compare_paired(a.scores[t][m], b.scores[t][m]) for m in METRICS} for t in tasks}
    compared, mismatches = compare_outputs(a, b)
    return ParityReport(
        settings=settings,
        labels=(label_a, label_b),
        data_files={t: str(p) for t, p in data_files.items()},
        comparisons=comparisons,
        compared_outputs=compared,
        mismatches=mismatches,
        sides_args=(args_a, args_b),
        totals=(a.totals, b.totals),
        seconds=(a.seconds, b.seconds),
        lm_eval_version=lm_eval.__version__,
    )
