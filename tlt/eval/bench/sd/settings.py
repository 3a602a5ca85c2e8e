"""Settings of the SD benchmark (`tlt.eval.bench.sd.cli`) and the list of configurations (cells) it measures."""

from __future__ import annotations

from dataclasses import dataclass

from tlt.speculative.strategy import SpecStrategy

NATIVE, HF = "native", "hf"
HF_ASSISTANT, HF_LOOKUP = "assistant", "lookup"  # HF assisted generation: draft model / prompt lookup


@dataclass(frozen=True)
class BenchSettings:
    """Everything one benchmark run depends on; recorded verbatim in the results."""

    target: str  # HF folder of the target policy (model + tokenizer), e.g. runs/bootstrap-tiny/model
    out: str  # results folder: results.json, results.md, speedup.png
    eagle: str | None = None  # saved EAGLE drafter folder (tlt train-drafter)
    eagle_int8: bool = False  # also benchmark that EAGLE drafter drafting in int8 ("eagle_int8")
    small_lm: str | None = None  # saved small_lm drafter folder
    ngram: bool = True  # also benchmark the model-free n-gram drafter
    config: str | None = None  # YAML run config; its data section picks the held-out problems
    overrides: tuple[str, ...] = ()  # key=value config overrides
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    strategies: tuple[str, ...] = ("2_1_3", "3_1_4", "4_1_5", "3_2_6")
    temperatures: tuple[float, ...] = (0.0, 1.0)
    hf_batch_sizes: tuple[int, ...] = (1, 32)  # plain HF generate vs plain native; () skips the HF peers
    max_new_tokens: int = 128
    min_prompts: int = 8  # at batch b, ceil(min_prompts / b) batches of b distinct prompts run back to back
    stop_at_eos: bool = False  # False: rows run to max_new_tokens, so the batch never shrinks
    repeats: int = 3  # timed runs per cell (the median is reported)
    warmup: int = 1  # untimed runs per cell before the timed ones
    lookup_tokens: int = 10  # HF prompt_lookup_num_tokens
    cost_reps: int = 20  # timed forwards per point of the cost table (median)
    seed: int = 0
    isolate: bool = False  # run each cell in a fresh subprocess (memory per cell from a clean process)

    def __post_init__(self) -> None:
        checks = [
            ("batch_sizes", bool(self.batch_sizes) and min(self.batch_sizes) >= 1, "integers >= 1"),
            ("hf_batch_sizes", all(b >= 1 for b in self.hf_batch_sizes), "integers >= 1 (or none)"),
            ("temperatures", bool(self.temperatures) and min(self.temperatures) >= 0, "floats >= 0"),
            ("max_new_tokens", self.max_new_tokens >= 2, "an integer >= 2"),
            ("min_prompts", self.min_prompts >= 1, "an integer >= 1"),
            ("repeats", self.repeats >= 1, "an integer >= 1"),
            ("warmup", self.warmup >= 0, "an integer >= 0"),
            ("lookup_tokens", self.lookup_tokens >= 1, "an integer >= 1"),
            ("cost_reps", self.cost_reps >= 1, "an integer >= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag}: allowed {allowed}; got {getattr(self, name)!r}")
        for s in self.strategies:
            SpecStrategy.parse(s)

    @property
    def drafters(self) -> tuple[str, ...]:
        """Drafter kinds to benchmark, in report order."""
        chosen = (
            ("eagle", self.eagle is not None),
            ("eagle_int8", self.eagle is not None and self.eagle_int8),
            ("small_lm", self.small_lm is not None),
            ("ngram", self.ngram),
        )
        return tuple(kind for kind, on in chosen if on)

    @property
    def max_verify_tokens(self) -> int:
        return max(SpecStrategy.parse(s).verify_tokens for s in self.strategies) if self.strategies else 1


@dataclass(frozen=True)
class Cell:
    """One measured configuration: an engine decoding `batch_size` distinct prompts at a time."""

    engine: str  # NATIVE or HF
    batch_size: int
    temperature: float = 0.0
    drafter: str | None = None  # native: eagle / small_lm / ngram; hf: HF_ASSISTANT / HF_LOOKUP; None = plain
    strategy: str | None = None  # native SD strategy (steps_topk_verifytokens)

    @property
    def name(self) -> str:
        parts = [self.engine, self.drafter or "plain", self.strategy or "-"]
        return "/".join(parts) + f"/b{self.batch_size}/t{self.temperature:g}"

    @property
    def is_sd(self) -> bool:
        return self.engine == NATIVE and self.drafter is not None

    def plain(self) -> Cell:
        """The plain-decoding cell this one is compared with (same engine, batch size and temperature)."""
        return Cell(self.engine, self.batch_size, self.temperature)


def plan_cells(settings: BenchSettings) -> list[Cell]:
    """Cells in run order: each plain native cell right before the SD cells it is the baseline of."""
    cells = []
    for temperature in settings.temperatures:
        for b in settings.batch_sizes:
            cells.append(Cell(NATIVE, b, temperature))
            for kind in settings.drafters:
                cells += [Cell(NATIVE, b, temperature, kind, s) for s in settings.strategies]
    return cells + _hf_cells(settings, cells)


def _hf_cells(settings: BenchSettings, native: list[Cell]) -> list[Cell]:
    """Greedy HF peers: plain at hf_batch_sizes and batch 1 (plus the native plain baseline where missing),
    assisted generation (draft model, prompt lookup) at batch 1."""
    if not settings.hf_batch_sizes:
        return []
    cells = []
    for b in sorted({1, *settings.hf_batch_sizes}):
        if Cell(NATIVE, b) not in native:
            cells.append(Cell(NATIVE, b))
        cells.append(Cell(HF, b))
    if settings.small_lm is not None:
        cells.append(Cell(HF, 1, drafter=HF_ASSISTANT))
    return cells + [Cell(HF, 1, drafter=HF_LOOKUP)]
