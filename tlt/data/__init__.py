"""Math task data: problem records and mixes, reasoning-gym and JSONL sources, the prompt format, rewards."""

from tlt.data.jsonl import read_jsonl, write_jsonl
from tlt.data.prompts import format_prompt, format_response
from tlt.data.rewards import extract_answer, extract_last_number, math_reward, math_rewards
from tlt.data.splits import heldout_problems, sample_problems, task_mix, training_problems
from tlt.data.tasks import DEFAULT_MIX, MathProblem, TaskMix

__all__ = [
    "DEFAULT_MIX",
    "MathProblem",
    "TaskMix",
    "extract_answer",
    "extract_last_number",
    "format_prompt",
    "format_response",
    "heldout_problems",
    "math_reward",
    "math_rewards",
    "read_jsonl",
    "sample_problems",
    "task_mix",
    "training_problems",
    "write_jsonl",
]
