"""Running one benchmark cell: the shared workload, the native and HF runners, and the per-cell summary.

A cell decodes ceil(min_prompts / b) batches of b distinct held-out prompts back to back (one response each) on one
engine: `warmup` untimed times, then `repeats` timed times; the median timed run is reported. `measure_cells` times
the cells round by round (every cell once per round, the order rotated each round), so the machine's speed drifting
over the benchmark slows every cell alike instead of whichever ran late; `measure_cell` times one cell alone (the
--isolate child, which measures one configuration's memory footprint in a fresh process).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from tlt.backends.base import DecodeStepStats, SamplingParams
from tlt.backends.native import NativeEngine
from tlt.config import RunConfig, load_config
from tlt.drafters import load_drafter
from tlt.drafters.base import Drafter
from tlt.drafters.ngram import NgramDrafter
from tlt.eval.bench.passes import rotated
from tlt.eval.bench.sd.settings import HF, HF_ASSISTANT, HF_LOOKUP, NATIVE, BenchSettings, Cell
from tlt.eval.memory import PeakMemory
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners import FixedTuner
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree


@dataclass
class Workload:
    """What every cell shares: the target, the drafters and the encoded held-out prompts."""

    model: torch.nn.Module  # HF causal LM, float32, eval mode
    tokenizer: PreTrainedTokenizerBase
    drafters: dict[str, Drafter]  # by kind
    prompts: list[list[int]]  # enough distinct prompts for the largest batch plan
    data: dict  # the DataConfig the prompts were drawn with
    max_seq_len: int  # native engine cache length: longest prompt + max_new_tokens + largest tree
    eos_token_id: int | None  # None when rows run to max_new_tokens (stop_at_eos=False)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return 0 if pad is None else pad


def num_prompts(settings: BenchSettings) -> int:
    sizes = {1, *settings.batch_sizes, *settings.hf_batch_sizes}
    return max(b * math.ceil(settings.min_prompts / b) for b in sizes)


def prompt_batches(prompts: list[list[int]], batch_size: int, min_prompts: int) -> list[list[list[int]]]:
    """ceil(min_prompts / batch_size) consecutive batches of batch_size distinct prompts."""
    count = math.ceil(min_prompts / batch_size)
    return [prompts[i * batch_size : (i + 1) * batch_size] for i in range(count)]


def run_config(settings: BenchSettings) -> RunConfig:
    """load_config(--config, overrides) over the data section of the target's bootstrap card.json, if any."""
    base = []
    card = Path(settings.target).parent / "card.json"
    if card.is_file():
        payload = json.loads(card.read_text())
        if "data" in payload:
            base = [f"data.{key}={json.dumps(value)}" for key, value in payload["data"].items()]
    return load_config(settings.config, list(settings.overrides), base)


def load_drafters(settings: BenchSettings) -> dict[str, Drafter]:
    drafters: dict[str, Drafter] = {}
    for kind, path in (("eagle", settings.eagle), ("small_lm", settings.small_lm)):
        if path is not None:
            drafters[kind] = load_drafter(path)
            if drafters[kind].kind != kind:
                raise ValueError(f"--{kind.replace('_', '-')} {path} holds a {drafters[kind].kind!r} drafter")
    if settings.eagle is not None and settings.eagle_int8:
        drafters["eagle_int8"] = load_drafter(settings.eagle)
        drafters["eagle_int8"].int8 = True  # its engine's bind() builds the int8 drafting copy
    if settings.ngram:
        drafters["ngram"] = NgramDrafter()
    return drafters


def heldout_prompts(settings: BenchSettings, tokenizer: PreTrainedTokenizerBase) -> tuple[list[list[int]], dict]:
    """Encoded held-out prompts, enough for every batch plan, and the DataConfig they were drawn with."""
    # imported here: tlt.data loads reasoning-gym (seconds), which an --isolate child given prompts skips
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import heldout_problems, task_mix

    cfg = run_config(settings)
    problems = heldout_problems(task_mix(cfg.data), num_prompts(settings), cfg.data.seed)
    return [tokenizer.encode(format_prompt(p.question)) for p in problems], asdict(cfg.data)


def load_workload(
    settings: BenchSettings, prompts: list[list[int]] | None = None, data: dict | None = None
) -> Workload:
    """Target, drafters and prompts (from the held-out split unless given, e.g. to an --isolate child)."""
    model, tokenizer = load_hf_folder(settings.target)
    if prompts is None:
        prompts, data = heldout_prompts(settings, tokenizer)
    longest = max(map(len, prompts)) + settings.max_new_tokens + settings.max_verify_tokens
    return Workload(
        model=model,
        tokenizer=tokenizer,
        drafters=load_drafters(settings),
        prompts=prompts,
        data=data,
        max_seq_len=min(longest, model.config.max_position_embeddings),
        eos_token_id=tokenizer.eos_token_id if settings.stop_at_eos else None,
    )


class TimedDrafter(Drafter):
    """Delegates to a drafter and times `propose`: the draft cost of each SD step where it really runs."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.kind, self.uses_target_hidden = inner.kind, inner.uses_target_hidden
        self.seconds, self.calls = 0.0, 0

    def bind(self, target: torch.nn.Module) -> None:
        self.inner.bind(target)

    def start(self, tokens: torch.Tensor, hidden: torch.Tensor | None, lengths: torch.Tensor) -> None:
        self.inner.start(tokens, hidden, lengths)

    def append(self, tokens: torch.Tensor, prev_hidden: torch.Tensor | None, counts: torch.Tensor) -> None:
        self.inner.append(tokens, prev_hidden, counts)

    def propose(self, strategy: SpecStrategy) -> DraftTree:
        return self._timed(self.inner.propose, strategy)

    def propose_sampled(self, strategy: SpecStrategy, sampling, generator) -> DraftTree:
        return self._timed(self.inner.propose_sampled, strategy, sampling, generator)

    def _timed(self, propose, *args) -> DraftTree:
        start = time.perf_counter()
        tree = propose(*args)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return tree

    def keep(self, rows: torch.Tensor) -> None:
        self.inner.keep(rows)

    def save(self, path: str | Path) -> None:
        self.inner.save(path)


@dataclass
class RunOutput:
    """One pass over a cell's prompt batches."""

    seconds: float
    outputs: list[list[int]]  # response token ids per prompt
    steps: list[DecodeStepStats]  # native decode iterations (empty for HF)
    draft_seconds: float = 0.0  # time inside drafter.propose
    draft_calls: int = 0


Runner = Callable[[], RunOutput]


def native_runner(work: Workload, cell: Cell, settings: BenchSettings) -> Runner:
    """Plain native decoding, or SD on every step with `cell.strategy` (a FixedTuner whose threshold is b)."""
    timed = TimedDrafter(work.drafters[cell.drafter]) if cell.drafter else None
    tuner = FixedTuner(cell.strategy, threshold=cell.batch_size) if timed else None
    engine = NativeEngine(
        work.model, work.eos_token_id, work.max_seq_len, tuner=tuner, drafter=timed, truncate_prompts="left"
    )
    batches = prompt_batches(work.prompts, cell.batch_size, settings.min_prompts)

    def run() -> RunOutput:
        rollouts, steps = [], []
        if timed:
            timed.seconds, timed.calls = 0.0, 0
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            sampling = SamplingParams(cell.temperature, max_new_tokens=settings.max_new_tokens, seed=settings.seed + i)
            rollouts += engine.generate(batch, sampling)
            steps += engine.step_stats
        seconds = time.perf_counter() - start
        outputs = [r.token_ids.tolist() for r in rollouts]
        return RunOutput(seconds, outputs, steps, timed.seconds if timed else 0.0, timed.calls if timed else 0)

    return run


@contextmanager
def _generation_eos(model: torch.nn.Module, eos: int | None) -> Iterator[None]:
    """HF fills an unset eos_token_id from model.generation_config, so 'no EOS' has to be set there."""
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        yield
    finally:
        model.generation_config.eos_token_id = saved


def _left_pad(batch: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] left-padded ids and attention mask."""
    T = max(map(len, batch))
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in batch])
    return ids, mask


def _cut_at_eos(tokens: list[int], eos: int | None) -> list[int]:
    """HF pads rows that finished early; keep tokens up to and including the first EOS."""
    return tokens if eos is None or eos not in tokens else tokens[: tokens.index(eos) + 1]


def hf_runner(work: Workload, cell: Cell, settings: BenchSettings) -> Runner:
    """Greedy HF `generate`: plain, with the small_lm drafter's model as assistant, or prompt lookup."""
    lookup = settings.lookup_tokens if cell.drafter == HF_LOOKUP else None
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        do_sample=False,
        pad_token_id=work.pad_token_id,
        prompt_lookup_num_tokens=lookup,
    )
    extra = {"assistant_model": work.drafters["small_lm"].model} if cell.drafter == HF_ASSISTANT else {}
    batches = [
        _left_pad(b, work.pad_token_id) for b in prompt_batches(work.prompts, cell.batch_size, settings.min_prompts)
    ]

    def run() -> RunOutput:
        generated = []
        start = time.perf_counter()
        with _generation_eos(work.model, work.eos_token_id), torch.inference_mode():
            for ids, mask in batches:
                out = work.model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **extra)
                generated.append(out[:, ids.shape[1] :])
        seconds = time.perf_counter() - start
        outputs = [_cut_at_eos(row, work.eos_token_id) for block in generated for row in block.tolist()]
        return RunOutput(seconds, outputs, [])

    return run


RUNNERS: dict[str, Callable[[Workload, Cell, BenchSettings], Runner]] = {NATIVE: native_runner, HF: hf_runner}


@dataclass
class CellResult:
    """One cell's measurement; `outputs` (response ids of the first timed run) feed the identity check."""

    cell: Cell
    seconds: list[float]  # wall time of each timed run
    generated_tokens: int  # response tokens of one run, summed over its prompts
    num_prompts: int
    mean_running_batch: float | None  # mean over native decode steps (HF keeps finished rows in its batch)
    sd_steps: int  # native SD iterations of one run
    accepted_per_verify: float | None  # accepted draft tokens per row and SD iteration
    propose_seconds: float | None  # drafter.propose time per SD iteration (median over timed runs)
    post_eos_share: float  # share of response tokens after their row's first EOS (when rows run on)
    deterministic: bool  # every run, warm-up included, produced the same tokens
    memory: dict  # tlt.eval.memory.PeakMemory.to_dict() over the whole cell
    outputs: list[list[int]]

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.median_seconds

    @staticmethod
    def from_dict(payload: dict) -> CellResult:
        return CellResult(**{**payload, "cell": Cell(**payload["cell"])})


def measure_cell(work: Workload, cell: Cell, settings: BenchSettings) -> CellResult:
    """One cell alone: its runs back to back; memory over the whole cell."""
    with PeakMemory() as memory:
        run = RUNNERS[cell.engine](work, cell, settings)
        runs = [run() for _ in range(settings.warmup + settings.repeats)]
    return cell_result(work, cell, runs[: settings.warmup], runs[settings.warmup :], memory.to_dict())


def measure_cells(
    work: Workload, cells: list[Cell], settings: BenchSettings, progress: Callable[[str], None] = lambda line: None
) -> dict[Cell, CellResult]:
    """Every cell built and warmed up in turn (memory over that part), then `repeats` rounds that run every cell once,
    in an order rotated by the round."""
    prepared = {}
    for cell in cells:
        with PeakMemory() as memory:
            run = RUNNERS[cell.engine](work, cell, settings)
            warm = [run() for _ in range(settings.warmup)]
        prepared[cell] = (run, warm, memory.to_dict())
    timed: dict[Cell, list[RunOutput]] = {cell: [] for cell in cells}
    for round_ in range(settings.repeats):
        for cell in rotated(cells, round_):
            timed[cell].append(prepared[cell][0]())
        progress(f"round {round_ + 1}/{settings.repeats}: {sum(r[-1].seconds for r in timed.values()):.1f} s")
    return {cell: cell_result(work, cell, prepared[cell][1], timed[cell], prepared[cell][2]) for cell in cells}


def cell_result(work: Workload, cell: Cell, warm: list[RunOutput], timed: list[RunOutput], memory: dict) -> CellResult:
    first = timed[0]
    sd = [s for s in first.steps if s.sd_on]
    rows = sum(s.running_batch for s in sd)
    draft = [r.draft_seconds / r.draft_calls for r in timed if r.draft_calls]
    return CellResult(
        cell=cell,
        seconds=[r.seconds for r in timed],
        generated_tokens=sum(map(len, first.outputs)),
        num_prompts=len(first.outputs),
        mean_running_batch=statistics.mean(s.running_batch for s in first.steps) if first.steps else None,
        sd_steps=len(sd),
        accepted_per_verify=sum(s.accepted_tokens for s in sd) / rows if rows else None,
        propose_seconds=statistics.median(draft) if draft else None,
        post_eos_share=post_eos_share(first.outputs, work.tokenizer.eos_token_id),
        deterministic=all(r.outputs == first.outputs for r in warm + timed),
        memory=memory,
        outputs=first.outputs,
    )


def post_eos_share(outputs: list[list[int]], eos: int | None) -> float:
    """Share of tokens that follow their row's first EOS (text the policy would never have produced)."""
    after = sum(len(row) - row.index(eos) - 1 for row in outputs if eos is not None and eos in row)
    return after / max(1, sum(map(len, outputs)))
