"""Quick batched greedy evaluation on held-out problems: accuracy and response-length percentiles."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from tlt.data.prompts import format_prompt
from tlt.data.rewards import math_reward


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

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        s = self.response_tokens
        return (
            f"accuracy {self.accuracy:.1%} on {self.num_problems} problems; response tokens p50 {s.p50:.0f} "
            f"p90 {s.p90:.0f} p99 {s.p99:.0f} max {s.max} (p99/p50 {s.p99 / max(s.p50, 1):.1f}); "
            f"truncated {self.truncated:.1%}; {self.seconds:.0f} s"
        )


def greedy_responses(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[list[int]]:
    """Greedy response token ids per prompt (EOS included when produced), with the native rollout engine.

    The engine drops finished rows, so a batch with a long tail costs what its running rows cost.
    """
    from tlt.backends.base import SamplingParams
    from tlt.backends.native import NativeEngine

    ids = [tokenizer.encode(p) for p in prompts]
    limit = max(len(p) for p in ids) + max_new_tokens
    engine = NativeEngine(model, tokenizer.eos_token_id, max_seq_len=min(limit, model.config.max_position_embeddings))
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens)
    out: list[list[int]] = []
    for start in range(0, len(ids), batch_size):
        out += [r.token_ids.tolist() for r in engine.generate(ids[start : start + batch_size], params)]
    return out


def evaluate(model, tokenizer, problems, max_new_tokens: int = 768, batch_size: int = 64) -> EvalReport:
    """Greedy accuracy (math reward) and response lengths of `model` on `problems` (MathProblem records)."""
    start = time.perf_counter()
    responses = greedy_responses(
        model, tokenizer, [format_prompt(p.question) for p in problems], max_new_tokens, batch_size
    )
    scores = [
        math_reward(tokenizer.decode(r, skip_special_tokens=True), p.answer)
        for r, p in zip(responses, problems, strict=False)
    ]
    by_family: dict[str, list[float]] = {}
    for p, s in zip(problems, scores, strict=True):
        by_family.setdefault(p.family, []).append(s)
    eos = tokenizer.eos_token_id
    return EvalReport(
        accuracy=sum(scores) / len(scores),
        num_problems=len(problems),
        response_tokens=LengthStats.of([len(r) for r in responses]),
        truncated=sum(1 for r in responses if not r or r[-1] != eos) / len(responses),
        accuracy_by_family={f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        seconds=time.perf_counter() - start,
    )
