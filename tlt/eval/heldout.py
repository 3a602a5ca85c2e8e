"""Quick batched evaluation on held-out problems: accuracy and response-length percentiles.

Greedy by default; at a temperature > 0 the accuracy is the mean over `samples` sampled responses per problem
(avg@k), the measure that moves first when RL sharpens a policy's sampling distribution."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from tlt.data.prompts import format_prompt
from tlt.data.rewards import count_grading_errors, math_reward


@dataclass
class LengthStats:
    p50: float
    p90: float
    p99: float
    max: int
    mean: float

    @staticmethod
    def of(lengths: list[int]) -> LengthStats:
        t = torch.tensor(lengths, dtype=torch.float64)
        q = torch.quantile(t, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
        return LengthStats(p50=q[0], p90=q[1], p99=q[2], max=int(t.max()), mean=float(t.mean()))


@dataclass
class EvalReport:
    accuracy: float
    num_problems: int
    response_tokens: LengthStats
    truncated: float  # fraction of responses that hit max_new_tokens
    accuracy_by_family: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    temperature: float = 0.0  # 0: greedy
    samples: int = 1  # responses per problem the accuracy is averaged over
    grading_errors: int = 0  # responses that could not be graded (scored 0; tlt.data.rewards)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        s = self.response_tokens
        how = "greedy" if self.temperature == 0 else f"mean of {self.samples} samples at T={self.temperature:g}"
        return (
            f"accuracy {self.accuracy:.1%} ({how}) on {self.num_problems} problems; response tokens p50 {s.p50:.0f} "
            f"p90 {s.p90:.0f} p99 {s.p99:.0f} max {s.max} (p99/p50 {s.p99 / max(s.p50, 1):.1f}); "
            f"truncated {self.truncated:.1%}; {self.seconds:.0f} s"
            + (f"; {self.grading_errors} responses could not be graded (scored 0)" if self.grading_errors else "")
        )


def heldout_prompt_ids(tokenizer, count: int) -> list[list[int]]:
    """Token ids of the first `count` held-out problems of the default data config, as prompts (benchmarks)."""
    from tlt.config import DataConfig
    from tlt.data.splits import heldout_problems, task_mix

    data = DataConfig()
    return [tokenizer.encode(format_prompt(p.question)) for p in heldout_problems(task_mix(data), count, data.seed)]


def generate_responses(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[list[int]]:
    """Response token ids per prompt (EOS included when produced), with the native rollout engine: greedy at
    temperature 0, else sampled; the batch at offset i seeds the engine's generator with seed + i.

    The engine drops finished rows, so a batch with a long tail costs what its running rows cost.
    """
    from tlt.backends.base import SamplingParams
    from tlt.backends.native import NativeEngine

    ids = [tokenizer.encode(p) for p in prompts]
    limit = max(len(p) for p in ids) + max_new_tokens
    engine = NativeEngine(model, tokenizer.eos_token_id, max_seq_len=min(limit, model.config.max_position_embeddings))
    out: list[list[int]] = []
    for start in range(0, len(ids), batch_size):
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + start)
        out += [r.token_ids.tolist() for r in engine.generate(ids[start : start + batch_size], params)]
    return out


def evaluate(
    model,
    tokenizer,
    problems,
    max_new_tokens: int = 768,
    batch_size: int = 64,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
) -> EvalReport:
    """Accuracy (math reward) and response lengths of `model` on `problems` (MathProblem records): greedy, or
    at `temperature` > 0 the mean over `samples` sampled responses per problem (round k's batch at offset
    i is sampled with seed + k * len(problems) + i, so no two batches share a seed)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if temperature == 0 and samples > 1:
        raise ValueError(
            "greedy decoding (temperature 0) gives the same response every time; samples > 1 needs a temperature > 0"
        )
    start = time.perf_counter()
    prompts = [format_prompt(p.question) for p in problems]
    responses: list[list[int]] = []
    scores: list[float] = []
    grading_errors = 0
    by_family: dict[str, list[float]] = {}
    for k in range(samples):
        batch = generate_responses(
            model, tokenizer, prompts, max_new_tokens, batch_size, temperature, seed + k * len(prompts)
        )
        graded = [
            math_reward(tokenizer.decode(r, skip_special_tokens=True), p.answer)
            for r, p in zip(batch, problems, strict=True)
        ]
        graded, errors = count_grading_errors(graded)
        grading_errors += errors
        for score, p in zip(graded, problems, strict=True):
            scores.append(score)
            by_family.setdefault(p.family, []).append(score)
        responses += batch
    eos = tokenizer.eos_token_id
    return EvalReport(
        accuracy=sum(scores) / len(scores),
        num_problems=len(problems),
        response_tokens=LengthStats.of([len(r) for r in responses]),
        truncated=sum(1 for r in responses if not r or r[-1] != eos) / len(responses),
        accuracy_by_family={f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        seconds=time.perf_counter() - start,
        temperature=temperature,
        samples=samples,
        grading_errors=grading_errors,
    )
