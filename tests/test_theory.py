"""theory.py: the closed forms, checked against brute force and against the loop itself."""
import numpy as np
import pytest
import torch

import specdec_lite as sd
from specdec_lite import theory
from specdec_lite.toy import MarkovLM


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_expected_tokens_is_the_truncated_geometric_sum(alpha, gamma):
    # E[N] = sum_{k=0}^{gamma} alpha^k: the round reaches draft k with probability alpha^k
    assert theory.expected_tokens(alpha, gamma) == pytest.approx(sum(alpha ** k for k in range(gamma + 1)))


def test_expected_tokens_limits_and_vectorization():
    assert theory.expected_tokens(1.0, 4) == 5.0
    assert theory.expected_tokens(0.0, 4) == 1.0
    values = theory.expected_tokens(np.array([0.5, 1.0]), 3)
    assert np.allclose(values, [1.875, 4.0])
    assert theory.expected_tokens(0.8, 200) == pytest.approx(theory.expected_tokens_limit(0.8))
    with pytest.raises(ValueError, match="alpha must lie in"):
        theory.expected_tokens(1.2, 3)


def test_speedup_and_best_gamma():
    # alpha 0.8, c 0.1, gamma 4: E[N] = 3.3616, cost 1.4 -> 2.401
    assert theory.speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    assert theory.speedup(0.8, 4, 0.1, v=1.7) == pytest.approx(3.3616 / 2.1)
    brute = max(range(1, 17), key=lambda g: theory.expected_tokens(0.8, g) / (g * 0.1 + 1))
    assert theory.best_gamma(0.8, 0.1) == brute == 6
    assert theory.best_gamma(0.8, 0.1, v=lambda g: 1 + 0.2 * g) < 6  # a verification cost growing with gamma
    with pytest.raises(ValueError):
        theory.speedup(0.5, 3, -0.1)


def constant_alpha_pair(alpha: float):
    """Context-free target p = (alpha, 1-alpha, 0) and draft q = (alpha, 0, 1-alpha): overlap exactly alpha."""
    p = torch.tensor([alpha, 1 - alpha, 0.0], dtype=torch.float64).repeat(3, 1)
    q = torch.tensor([alpha, 0.0, 1 - alpha], dtype=torch.float64).repeat(3, 1)
    return MarkovLM(p), MarkovLM(q)


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_loop_accepted_length_matches_expected_tokens(alpha):
    """The loop's mean accepted length equals E[N] when every position's acceptance is alpha
    (20,000 rows x 40 tokens; standard error of the mean below 0.01, tolerance 0.03)."""
    target, draft = constant_alpha_pair(alpha)
    gamma = 4
    gen = sd.speculative_generate(target, draft, torch.zeros(20_000, 1, dtype=torch.long), gamma=gamma,
                                  max_new_tokens=40, seed=3)
    assert gen.stats.mean_accepted_length == pytest.approx(theory.expected_tokens(alpha, gamma), abs=0.03)
    assert gen.stats.acceptance_rate == pytest.approx(
        (theory.expected_tokens(alpha, gamma) - 1) / gamma, abs=0.01)
