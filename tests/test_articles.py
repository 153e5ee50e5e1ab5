"""The articles' listings, re-implemented faithfully, tested as published (C3, C22)."""
import numpy as np
import torch

from specdec_lite.repro import articles
from specdec_lite.repro.exact import exact_target_distribution
from specdec_lite.repro.stats import chi_square_pvalue
from specdec_lite.repro.toy import article000_pair
from specdec_lite.repro.unbiased import marginal_law


def target_law_at(positions, gamma=4):
    """Exact law of the target's tokens at the given output positions, after the initial token 0."""
    target, _ = article000_pair()
    return marginal_law(exact_target_distribution(target, [0], max(positions)), positions)


def test_article000_listing_is_biased_at_the_bonus_position():
    """As published, the first round's bonus token (output position gamma+1 = 5) is drawn from position 4's
    distribution; 60,000 runs reject it by chi-square on (token 4, token 5), and the fixed listing passes."""
    law = target_law_at([4, 5])
    published = articles.article000_tokens_at(60_000, [4, 5], seed=1)
    fixed = articles.article000_tokens_at(60_000, [4, 5], seed=2, fixed=True)
    assert chi_square_pvalue(published, law) < 1e-6
    assert chi_square_pvalue(fixed, law) > 1e-3


def test_article000_listing_is_right_before_the_bonus():
    law = target_law_at([1, 2, 3])
    assert chi_square_pvalue(articles.article000_tokens_at(30_000, [1, 2, 3], seed=3), law) > 1e-3


def test_article004_listing_is_unbiased_and_its_check_is_weak():
    """C22: the article's loop passes both its own check and a chi-square on transition counts; a biased
    variant (10% of draft tokens accepted unchecked) still passes the article's check at the article's 20,000
    steps, while the chi-square rejects it."""
    honest = articles.article004_check(steps=20000, gamma=5)
    assert honest["passes"] and honest["chi_square_pvalue"] > 1e-3
    biased = articles.article004_check(steps=20000, gamma=5, leak=0.1)
    assert biased["passes"] and biased["chi_square_pvalue"] < 1e-6
