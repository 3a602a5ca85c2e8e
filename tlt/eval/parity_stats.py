"""Statistics for paired 0/1 scores of two models on the same problems: Wilson intervals and exact McNemar,
both from scipy.stats.binomtest (scipy comes with the `eval` extra, as lm-eval needs it).

Wilson: E. B. Wilson (1927), https://doi.org/10.1080/01621459.1927.10502953.
McNemar exact: the discordant pairs are Binomial(b + c, 1/2) under "no difference"; two-sided binomial test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion `successes / n`."""
    from scipy.stats import binomtest

    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and n >= 1, got {successes}/{n}")
    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return ci.low, ci.high


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (A right / B wrong, and the reverse)."""
    from scipy.stats import binomtest

    if only_a < 0 or only_b < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_a}, {only_b}")
    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


@dataclass(frozen=True)
class PairedComparison:
    """Model A vs model B on the same n problems, each scored 0 or 1."""

    n: int
    correct_a: int
    correct_b: int
    only_a: int  # problems A got right and B got wrong
    only_b: int  # problems B got right and A got wrong

    @property
    def accuracy_a(self) -> float:
        return self.correct_a / self.n

    @property
    def accuracy_b(self) -> float:
        return self.correct_b / self.n

    @property
    def difference(self) -> float:
        """Accuracy of B minus accuracy of A (= (only_b - only_a) / n)."""
        return (self.only_b - self.only_a) / self.n

    @property
    def ci_a(self) -> tuple[float, float]:
        return wilson_interval(self.correct_a, self.n)

    @property
    def ci_b(self) -> tuple[float, float]:
        return wilson_interval(self.correct_b, self.n)

    @property
    def p_value(self) -> float:
        return mcnemar_exact(self.only_a, self.only_b)

    def differs(self, alpha: float = 0.05) -> bool:
        return self.p_value < alpha


def compare_paired(scores_a: Sequence[float], scores_b: Sequence[float]) -> PairedComparison:
    """Paired counts of two equally long 0/1 score lists (problem i of A pairs with problem i of B)."""
    if len(scores_a) != len(scores_b) or not scores_a:
        raise ValueError(f"need two non-empty score lists of one length, got {len(scores_a)} and {len(scores_b)}")
    if any(s not in (0, 1) for s in (*scores_a, *scores_b)):
        raise ValueError("paired scores must be 0 or 1")
    pairs = list(zip(scores_a, scores_b, strict=True))
    return PairedComparison(
        n=len(pairs),
        correct_a=int(sum(scores_a)),
        correct_b=int(sum(scores_b)),
        only_a=sum(1 for a, b in pairs if a and not b),
        only_b=sum(1 for a, b in pairs if b and not a),
    )


def verdict(differs: bool, alpha: float = 0.05) -> str:
    return "differs" if differs else f"no significant difference at alpha={alpha:g}"
