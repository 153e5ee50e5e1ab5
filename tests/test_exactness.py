"""Lossless: exact enumeration and Monte Carlo through the real loop, and the mutation check.

Statistical design (Monte Carlo): N = 200,000 independent runs of ``speculative_generate`` (one batch, the very
loop real models run, on toy Markov models), the joint law of the first 3 emitted tokens (gamma = 2, so the
three tokens span round boundaries), Pearson chi-square against the target's exact law, cells with an expected
count under 5 merged. The test passes at p > 1e-3 (false-alarm rate 0.1%; the seed is fixed, so the outcome
is deterministic). Power: for each broken verifier whose exact law we can enumerate, the noncentral
chi-square power of this very test at N = 200,000 and level 1e-3 is computed and must exceed 0.99; each one
is then run and must be rejected at p < 1e-6.
"""
import pytest
import torch

import specdec_lite as sd
from specdec_lite.core.decode import EXACT
from specdec_lite.repro import unbiased
from specdec_lite.repro.exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference
from specdec_lite.repro.mutants import MUTANTS, NO_EXACT_LAW
from specdec_lite.repro.stats import chi_square_power, chi_square_pvalue
from specdec_lite.repro.toy import article000_pair, article004_pair, random_pair


N_SAMPLES = 200_000
LEVEL = 1e-3
N_TOKENS, GAMMA = 3, 2
PAIRS = {"article000": article000_pair, "article004": article004_pair, "dirichlet": lambda: random_pair(6, 0.5, 0)}
SETTINGS = {
    "plain": sd.SamplingParams(),
    "temperature+top_k+top_p+penalty": sd.SamplingParams(temperature=0.8, top_k=4, top_p=0.9,
                                                         repetition_penalty=1.3),
}


# ---------------------------------------------------------------- exact enumeration
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_exact_law_of_first_tokens_equals_target(pair, setting):
    target, draft = PAIRS[pair]()
    sampling = SETTINGS[setting]
    for gamma, n in [(1, 3), (2, 3), (3, 4)]:
        spec = exact_speculative_distribution(target, draft, [0], gamma, n, sampling)
        ref = exact_target_distribution(target, [0], n, sampling)
        assert max_abs_difference(spec, ref) < 1e-9, (gamma, n)
        assert sum(spec.values()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("pair", PAIRS)
def test_exact_law_with_point_mass_ngram_draft(pair):
    target, _ = PAIRS[pair]()
    prompt = [0, 1, 2, 0, 1]
    spec = exact_speculative_distribution(target, sd.NGramDraft(max_ngram=2), prompt, 3, 4)
    assert max_abs_difference(spec, exact_target_distribution(target, prompt, 4)) < 1e-9


# ---------------------------------------------------------------- Monte Carlo through the loop
def first_tokens(target, draft, n_samples=N_SAMPLES, seed=0, sampling=sd.SamplingParams(), verifier=EXACT):
    return unbiased.first_tokens(target, draft, n_samples, GAMMA, N_TOKENS, seed, sampling, verifier)


def chi_square(samples, law):
    return chi_square_pvalue(samples, law)


def power(null_law, alt_law):
    return chi_square_power(null_law, alt_law, N_SAMPLES, LEVEL)


@pytest.mark.parametrize("pair", PAIRS)
def test_monte_carlo_agrees_with_target(pair):
    target, draft = PAIRS[pair]()
    law = exact_target_distribution(target, [0], N_TOKENS)
    assert chi_square(first_tokens(target, draft), law) > LEVEL


def test_monte_carlo_with_sampling_settings_and_ngram():
    target, draft = random_pair(6, 0.5, 0)
    sampling = SETTINGS["temperature+top_k+top_p+penalty"]
    law = exact_target_distribution(target, [0], N_TOKENS, sampling)
    assert chi_square(first_tokens(target, draft, sampling=sampling, seed=1), law) > LEVEL
    prompt = torch.tensor([[0, 1, 2, 0, 1]]).repeat(N_SAMPLES, 1)
    gen = sd.speculative_generate(target, sd.NGramDraft(), prompt, gamma=GAMMA, max_new_tokens=N_TOKENS, seed=2)
    law = exact_target_distribution(target, [0, 1, 2, 0, 1], N_TOKENS)
    assert chi_square(torch.stack(gen.sequences).numpy(), law) > LEVEL


# ---------------------------------------------------------------- mutation check
@pytest.mark.parametrize("mutant", MUTANTS)
def test_statistical_tests_reject_broken_verifiers(mutant):
    target, draft = random_pair(6, 0.5, 0)
    law = exact_target_distribution(target, [0], N_TOKENS)
    broken = MUTANTS[mutant]
    if mutant not in NO_EXACT_LAW:
        broken_law = exact_speculative_distribution(target, draft, [0], GAMMA, N_TOKENS, verifier=broken)
        # the exact check sees the bug, and the Monte Carlo test has the power to see it
        assert max_abs_difference(broken_law, law) > 1e-3
        assert power(law, broken_law) > 0.99
    assert chi_square(first_tokens(target, draft, verifier=broken), law) < 1e-6
    # the same samples' size with the exact verifier passes
    assert chi_square(first_tokens(target, draft, seed=5), law) > LEVEL
