import pytest

from tlt.config import DataConfig
from tlt.data import splits
from tlt.data.splits import heldout_problems, is_heldout, sample_problems, task_mix, training_problems
from tlt.data.tasks import DEFAULT_MIX, TaskMix


def _percentile(values: list[int], q: float) -> int:
    values = sorted(values)
    return values[int(q * (len(values) - 1))]


def test_sample_deterministic_and_seed_dependent():
    a = sample_problems(DEFAULT_MIX, 40, seed=0)
    assert a == sample_problems(DEFAULT_MIX, 40, seed=0)
    assert a != sample_problems(DEFAULT_MIX, 40, seed=1)
    assert sample_problems(DEFAULT_MIX, 20, seed=0) == a[:20]


def test_default_mix_is_long_tailed():
    problems = sample_problems(DEFAULT_MIX, 2000, seed=0)
    lengths = [len(p.solution) for p in problems]
    p50, p99 = _percentile(lengths, 0.5), _percentile(lengths, 0.99)
    assert 25 <= p50 <= 80  # characters: one token per character in the compact reduction format
    assert p99 >= 5 * p50
    assert 400 <= max(lengths) <= 5000
    assert sum(p.difficulty == 1 for p in problems) > sum(p.difficulty >= 5 for p in problems)


def test_family_weights_are_respected():
    mix = TaskMix(("chain_sum", "products"), (1.0, 0.0), 3, 0.5)
    problems = sample_problems(mix, 30, seed=0)
    assert {p.family for p in problems} == {"chain_sum"}
    assert {p.difficulty for p in problems} <= {1, 2, 3}


def test_uniform_decay_reaches_the_top_level():
    mix = TaskMix(("chain_sum",), (1.0,), 3, 1.0)
    assert {p.difficulty for p in sample_problems(mix, 60, seed=0)} == {1, 2, 3}


def test_training_and_heldout_never_overlap():
    train = training_problems(DEFAULT_MIX, 400, seed=0)
    heldout = heldout_problems(DEFAULT_MIX, 60, seed=0)
    assert len(heldout) == 60 and len({p.question for p in heldout}) == 60
    assert not {p.question for p in train} & {p.question for p in heldout}
    assert all(is_heldout(p.question) for p in heldout) and not any(is_heldout(p.question) for p in train)
    assert heldout == heldout_problems(DEFAULT_MIX, 60, seed=0)


def test_heldout_of_a_small_space_reports_exhaustion(monkeypatch):
    monkeypatch.setattr(splits, "_MAX_DRAWS_PER_PROBLEM", 20)  # keeps the test short
    mix = TaskMix(("products",), (1.0,), 1, 0.5)  # 2-digit x 2-digit: 8100 questions, ~1000 held out
    with pytest.raises(ValueError, match="too few distinct questions"):
        heldout_problems(mix, 1100, seed=0)


def test_task_mix_from_data_config():
    cfg = DataConfig(families=["products", "chain_sum"], weights=[1, 3], max_difficulty=4, difficulty_decay=0.5)
    assert task_mix(cfg) == TaskMix(("products", "chain_sum"), (1.0, 3.0), 4, 0.5)
    assert task_mix(DataConfig()) == DEFAULT_MIX
