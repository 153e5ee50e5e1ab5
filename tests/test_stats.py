"""The chi-square helper: calibrated under the null, powerful under a shifted law, strict on impossible
outcomes."""
import numpy as np

from specdec_lite.repro import stats


def test_chi_square_is_calibrated_and_detects_a_shift():
    rng = np.random.default_rng(0)
    law = {(0,): 0.5, (1,): 0.3, (2,): 0.2}
    pvalues = [stats.chi_square_pvalue(rng.choice(3, size=(2000, 1), p=[0.5, 0.3, 0.2]), law) for _ in range(200)]
    assert 0.02 < np.mean(np.array(pvalues) < 0.05) < 0.1  # about 5% false alarms at level 0.05
    shifted = rng.choice(3, size=(2000, 1), p=[0.45, 0.33, 0.22])
    assert stats.chi_square_pvalue(shifted, law) < 1e-3
    power = stats.chi_square_power(law, {(0,): 0.45, (1,): 0.33, (2,): 0.22}, 2000, level=1e-3)
    assert power > 0.8
    assert stats.chi_square_pvalue(np.array([[3]] * 10 + [[0]] * 10), law) == 0.0  # impossible outcome


def test_kl_and_empirical_law():
    samples = np.array([[0, 1], [0, 1], [1, 1], [0, 0]])
    assert stats.empirical_law(samples) == {(0, 0): 0.25, (0, 1): 0.5, (1, 1): 0.25}
    p = {(0,): 0.5, (1,): 0.5}
    assert stats.kl_divergence(p, p) == 0.0 and stats.kl_divergence(p, {(0,): 0.9, (1,): 0.1}) > 0.5
