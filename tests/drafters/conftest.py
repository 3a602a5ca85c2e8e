import pytest

from tests.tiny_model import random_target


@pytest.fixture(scope="session")
def native_target():
    """A tiny random Qwen2 with varied greedy continuations (unit norm weights) and no near ties."""
    return random_target(0.15, unit_norms=True)


@pytest.fixture(scope="session")
def looping_target():
    """The backends' test target: its greedy continuations fall into loops (38 38 38 ..., 17 17 ...)."""
    return random_target(0.15)
