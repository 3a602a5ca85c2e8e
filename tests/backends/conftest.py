import pytest

from tests.tiny_model import random_target


@pytest.fixture(scope="session")
def native_target():
    """A tiny random Qwen2 whose weights are scaled up so greedy continuations vary and ties are rare."""
    return random_target(0.15)
