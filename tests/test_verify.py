"""The verifier on its own: shapes, the acceptance rule, the overlap identity (C2), greedy verification."""
import pytest
import torch

import specdec_lite as sd
from specdec_lite.core.verify import outcome_distribution


def random_probs(*shape, seed=0):
    """Dirichlet(0.5) rows: spiky distributions, so draft and target disagree often."""
    torch.manual_seed(seed)
    return torch.distributions.Dirichlet(torch.full((shape[-1],), 0.5, dtype=torch.float64)).sample(shape[:-1])


def test_outcomes_of_hand_built_rows():
    """q is uniform (1/4 a token). A draft token is accepted for sure where p gives it >= 1/4, rejected for sure
    where p gives it 0; each p below leaves (p - q)+ a single token, so every outcome is known."""
    drafts = torch.tensor([[0, 1, 2]] * 4)
    q = torch.full((4, 3, 4), 0.25, dtype=torch.float64)
    p = torch.tensor([
        # all three accepted, then the bonus from p[3] (one token; p[2] gives that token 0)
        [[0.4, 0.2, 0.2, 0.2], [0.2, 0.4, 0.2, 0.2], [0.3, 0.3, 0.4, 0.0], [0.0, 0.0, 0.0, 1.0]],
        # the first rejected: (p - q)+ = (0, 0, 0, 0.25) -> token 3
        [[0.0, 0.25, 0.25, 0.5], [0.25] * 4, [0.25] * 4, [0.25] * 4],
        # two accepted, the third rejected: (p - q)+ = (0, 0.25, 0, 0) -> token 1
        [[0.4, 0.2, 0.2, 0.2], [0.2, 0.4, 0.2, 0.2], [0.25, 0.5, 0.0, 0.25], [0.25] * 4],
        # one accepted, the second rejected: (p - q)+ = (0.25, 0, 0, 0) -> token 0
        [[0.4, 0.2, 0.2, 0.2], [0.5, 0.0, 0.25, 0.25], [0.25] * 4, [0.25] * 4]], dtype=torch.float64)
    for seed in range(5):  # whatever the uniforms drawn
        n, nxt = sd.verify(drafts, q, p, torch.Generator().manual_seed(seed))
        assert n.tolist() == [3, 0, 2, 1] and nxt.tolist() == [3, 3, 1, 0]

    with pytest.raises(ValueError, match="q must be"):
        sd.verify(torch.zeros(1, 2, dtype=torch.long), torch.rand(1, 3, 4), torch.rand(1, 3, 4))


def test_identical_distributions_accept_everything():
    torch.manual_seed(1)
    B, gamma, V = 64, 3, 9
    p = random_probs(B, gamma + 1, V)
    q = p[:, :gamma].clone()
    drafts = torch.multinomial(q.reshape(-1, V), 1).reshape(B, gamma)
    n, _ = sd.verify(drafts, q, p, torch.Generator().manual_seed(0))
    assert (n == gamma).all()


def test_zero_target_probability_is_always_rejected_and_never_emitted():
    V = 4
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]]).repeat(1000, 1, 1)
    q = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]]).repeat(1000, 1, 1)
    drafts = torch.zeros(1000, 1, dtype=torch.long)
    n, nxt = sd.verify(drafts, q, p, torch.Generator().manual_seed(0))
    assert (n == 0).all() and ((nxt == 1) | (nxt == 2)).all()


def test_acceptance_probability_equals_overlap_c2():
    """C2: P(accept) = sum_x min(p(x), q(x)); exact by outcome_distribution, and by 400k Monte Carlo draws
    (standard error about 8e-4, tolerance 5 standard errors)."""
    V = 7
    p = random_probs(1, 2, V, seed=3)
    q = random_probs(1, 1, V, seed=4)
    overlap = torch.minimum(p[0, 0], q[0, 0]).sum().item()
    # exact: P(num_accepted = 1) summed over next tokens, averaged over the draft token x ~ q
    exact = sum(q[0, 0, x].item() * outcome_distribution(torch.tensor([[x]]), q, p)[0, 1].sum().item()
                for x in range(V))
    assert exact == pytest.approx(overlap, abs=1e-12)
    N = 400_000
    drafts = torch.multinomial(q[0, 0], N, replacement=True, generator=torch.Generator().manual_seed(1))[:, None]
    n, _ = sd.verify(drafts, q.expand(N, -1, -1), p.expand(N, -1, -1), torch.Generator().manual_seed(2))
    se = (overlap * (1 - overlap) / N) ** 0.5
    assert abs(n.double().mean().item() - overlap) < 5 * se


def test_outcome_distribution_is_a_distribution_and_first_token_is_p():
    B, gamma, V = 3, 3, 6
    p = random_probs(B, gamma + 1, V, seed=5)
    q = random_probs(B, gamma, V, seed=6)
    # average over drafts x1 ~ q1: the first emitted token must be distributed as p1
    first = torch.zeros(V, dtype=torch.float64)
    for x in range(V):
        drafts = torch.tensor([[x, 0, 0]])
        law = outcome_distribution(drafts, q[:1], p[:1])[0]
        assert law.sum().item() == pytest.approx(1.0, abs=1e-12)
        first[x] += q[0, 0, x] * law[1:].sum()  # accepted: x is emitted first
        first += q[0, 0, x] * law[0]  # rejected at once: the corrected token is first
    assert torch.allclose(first, p[0, 0], atol=1e-12)


def test_point_mass_drafts():
    V = 5
    p = random_probs(2000, 3, V, seed=7)
    drafts = torch.zeros(2000, 2, dtype=torch.long)
    n, nxt = sd.verify(drafts, None, p, torch.Generator().manual_seed(0))
    # a rejected point mass x is never the corrected token
    assert (nxt[n == 0] != 0).all()
    law = outcome_distribution(drafts[:1], None, p[:1])[0]
    assert law[0, 0].item() == 0.0 and law.sum().item() == pytest.approx(1.0)
    assert law[1:].sum().item() == pytest.approx(p[0, 0, 0].item())


def test_greedy_verification():
    drafts = torch.tensor([[3, 4, 5], [3, 9, 5], [1, 2, 3]])
    argmax = torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6], [0, 2, 3, 7]])
    n, nxt = sd.verify_greedy(drafts, argmax)
    assert n.tolist() == [3, 1, 0] and nxt.tolist() == [6, 4, 0]


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="gamma\\+1"):
        sd.verify(torch.zeros(1, 2, dtype=torch.long), None, torch.rand(1, 2, 4).softmax(-1))
    with pytest.raises(ValueError, match="q must be"):
        sd.verify(torch.zeros(1, 2, dtype=torch.long), torch.rand(1, 3, 4), torch.rand(1, 3, 4))
    with pytest.raises(ValueError, match="draft_tokens must be an integer tensor"):
        sd.verify(torch.zeros(1, 2), None, torch.rand(1, 3, 4).softmax(-1))  # float "token ids"


def test_greedy_verification_refuses_what_it_would_broadcast():
    """One row of argmaxes for a batch of 3 drafts would compare by broadcasting and answer for every row from
    the first row's choices: refused, as are argmaxes one position short, floats and a 1-D draft."""
    drafts = torch.tensor([[3, 4, 5], [3, 9, 5], [1, 2, 3]])
    for argmax in (torch.tensor([[3, 4, 5, 6]]), torch.tensor([[3, 4, 5]] * 3), torch.zeros(3, 4)):
        with pytest.raises(ValueError, match="target_argmax must be an integer tensor \\(B, gamma\\+1\\) = \\(3, 4\\)"):
            sd.verify_greedy(drafts, argmax)
    with pytest.raises(ValueError, match="draft_tokens must be an integer tensor \\(B, gamma\\)"):
        sd.verify_greedy(torch.tensor([3, 4, 5]), torch.tensor([[3, 4, 5, 6]]))


def test_verify_handles_large_batches_in_one_call():
    """Every draft is token 0 with q = 1/64; p gives it 1/128 (acceptance 1/2) and its mass to token 1, so
    (p - q)+ is token 1 alone; the bonus distribution is token 5 alone. Then P(n = 0, 1, 2) = 1/2, 1/4, 1/4."""
    B, gamma, V = 20_000, 2, 64
    p = torch.full((B, gamma + 1, V), 1.0 / V)
    p[:, :gamma, 0], p[:, :gamma, 1] = 1.0 / 128, 1.0 / 64 + 1.0 / 128
    p[:, gamma] = 0.0
    p[:, gamma, 5] = 1.0
    q = torch.full((B, gamma, V), 1.0 / V)
    n, nxt = sd.verify(torch.zeros(B, gamma, dtype=torch.long), q, p, torch.Generator().manual_seed(0))
    shares = torch.bincount(n, minlength=gamma + 1) / B
    assert shares.tolist() == pytest.approx([0.5, 0.25, 0.25], abs=0.02)  # 0.02: more than 5 standard errors
    assert torch.equal(nxt, torch.where(n == gamma, 5, 1))


def test_sample_draws_each_row_from_its_own_law():
    """``sample`` (inverse transform) against the exact law of each row: 20,000 draws a row over 6 tokens, one of
    them of weight 0 (never drawn), rows unnormalised. At level 1e-3 the test has power > 0.99 against a law off
    by 0.02 on two tokens (checked below), and it rejects a sampler reading the next row's cumulative weights."""
    from specdec_lite.core.sampling import sample
    from specdec_lite.repro.stats import chi_square_power, chi_square_pvalue

    weights = torch.tensor([[0.1, 0.3, 0.0, 0.2, 0.15, 0.25], [2.0, 0.0, 1.0, 0.5, 0.25, 0.25]], dtype=torch.float64)
    n = 20_000
    draws = sample(weights.expand(n, 2, 6).transpose(0, 1), torch.Generator().manual_seed(0))  # (2, n)
    for row, law_weights in zip(draws, weights):
        law = {(i,): float(w / law_weights.sum()) for i, w in enumerate(law_weights) if w > 0}
        assert 2 not in row.tolist() or law_weights[2] > 0
        assert chi_square_pvalue(row.numpy()[:, None], law) > 1e-3
        off = dict(law)
        first, second = sorted(law)[:2]
        off[first], off[second] = law[first] + 0.02, law[second] - 0.02
        assert chi_square_power(law, off, n) > 0.99
    assert 1 not in draws[1].tolist() and 2 not in draws[0].tolist()  # weight 0: never drawn
    swapped = draws.flip(0)  # each row's draws judged against the other row's law
    law0 = {(i,): float(w / weights[0].sum()) for i, w in enumerate(weights[0]) if w > 0}
    assert chi_square_pvalue(swapped[0].numpy()[:, None], law0) < 1e-3


def test_sample_never_draws_a_zero_weight_token_at_the_end_of_the_vocabulary(monkeypatch):
    """The largest uniform below 1: the draw is the last token of positive weight, not a zero-weight one after it."""
    from specdec_lite.core.sampling import sample

    largest_below_one = torch.nextafter(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.full(shape, float(largest_below_one), **{
        k: v for k, v in kw.items() if k in ("dtype", "device")}))
    weights = torch.tensor([[0.0, 3.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    assert sample(weights).tolist() == [1, 1]


def test_sample_refuses_rows_without_weight():
    from specdec_lite.core.sampling import sample

    with pytest.raises(ValueError, match="sums to 0 or is not finite"):
        sample(torch.tensor([[0.5, 0.5], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="sums to 0 or is not finite"):
        sample(torch.tensor([float("nan"), 1.0]))
