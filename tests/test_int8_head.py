"""A drafting head on 8-bit weights (``tuning.int8_head``): each product within its rounding bound, shapes and
dtypes kept, the policy that puts a head beside a tuned CPU target on it, and the law through it enumerated (the
other exactness tests draft beside untuned tiny targets, whose heads keep their float weights)."""
import pytest
import torch
from torch import nn

from conftest import tiny_llama
from test_heads import random_head_draft
from specdec_lite.core.sampling import SamplingParams
from specdec_lite.drafts import heads
from specdec_lite.repro.exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference
from specdec_lite.repro.mutants import MUTANTS
from specdec_lite.tuning.packed_linear import pack_linears
from specdec_lite.tuning.int8_head import Int8Linear, quantized_copy


def test_an_int8_product_is_within_its_rounding_bound():
    """Each output differs from the float product by at most what rounding the weights (half a step of the row's
    scale per weight) and the activations (bfloat16, 2^-8 relative) can make; the bound is tight enough that a
    product with the rows' scales shuffled lies outside it."""
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(48, 96, generator=g) * torch.linspace(0.01, 1.0, 48)[:, None], torch.randn(48, generator=g)
    x = torch.randn(5, 96, generator=g)
    layer = Int8Linear(weight, bias)
    exact = x @ weight.T + bias
    got = layer(x)
    step = weight.abs().amax(1) / 127
    bound = x.abs() @ (step[:, None] / 2).expand_as(weight).T + (x.abs() @ weight.abs().T) * 2 ** -8 + 1e-5
    assert ((got - exact).abs() <= bound).all()
    assert ((got - exact).abs() > 0).any()  # it is 8-bit: not the float product itself
    shuffled = Int8Linear(weight, bias)
    shuffled.scale = shuffled.scale.flip(0)
    assert ((shuffled(x) - exact).abs() > bound).any()


def test_int8_layers_keep_shapes_dtypes_zero_rows_and_each_rows_product():
    weight = torch.randn(6, 16)
    weight[2] = 0.0  # a row of zeros: its scale must not divide by zero
    layer = Int8Linear.of(nn.Linear(16, 6).requires_grad_(False))
    zero = Int8Linear(weight)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 3, 16, dtype=dtype)
        assert layer(x).shape == (2, 3, 6) and layer(x).dtype == dtype
        assert torch.isfinite(zero(x)).all() and (zero(x)[..., 2] == 0).all()
    assert (layer.in_features, layer.out_features) == (16, 6)
    rows = torch.randn(5, 16)  # each row's product is the same alone as among others
    assert torch.equal(layer(rows), torch.cat([layer(rows[i:i + 1]) for i in range(5)]))


def test_the_kernel_gets_whole_aligned_rows_or_the_layer_stays_float():
    """The kernel reads 16 activations at a time from aligned rows: a layer with another input size is refused
    (and left float in a copy), and activations that start inside a larger tensor are copied first, giving the same
    product as the aligned ones."""
    with pytest.raises(ValueError, match="multiple of 16"):
        Int8Linear(torch.randn(4, 12))
    copy = quantized_copy(nn.Sequential(nn.Linear(12, 16), nn.Linear(16, 4)))
    assert type(copy[0]) is nn.Linear and isinstance(copy[1], Int8Linear)
    layer = Int8Linear(torch.randn(8, 32))
    wide = torch.randn(1, 3 * 32 + 1, dtype=torch.bfloat16)
    inside = wide[0, 1:33]  # starts 2 bytes into the tensor
    assert inside.data_ptr() % 64 and torch.equal(layer(inside), layer(inside.clone()))


def test_a_quantized_copy_replaces_every_linear_and_leaves_the_original():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 2), nn.Tanh()))
    copy = quantized_copy(model)
    assert not any(type(m) is nn.Linear for m in copy.modules())
    assert sum(isinstance(m, Int8Linear) for m in copy.modules()) == 2 and isinstance(copy[2][1], nn.Tanh)
    assert sum(type(m) is nn.Linear for m in model.modules()) == 2  # a trainer holding it can go on training it
    x = torch.randn(3, 16)
    assert torch.allclose(copy(x), model(x), atol=0.05)


def test_a_drafting_head_runs_on_8_bit_weights_beside_a_tuned_cpu_target_only():
    """Beside a CPU target whose linear layers run packed, the drafter's head and output layer are 8-bit and its q
    still sums to one; the head it was given (a trainer may hold it) keeps its float weights. Beside the same
    target as transformers loads it, the head keeps its own weights too."""
    as_loaded = tiny_llama(vocab=64, layers=2, hidden=32)
    cfg = heads.head_config_for(as_loaded, "eagle", "tiny", sub_vocab_size=0)
    head = heads.build_head(cfg)
    plain = heads.make_drafter(head, cfg, as_loaded)
    assert not heads.quantizes_head(as_loaded) and not plain.quantized
    assert isinstance(plain.output.product, nn.Linear)
    packed = tiny_llama(vocab=64, layers=2, hidden=32)
    pack_linears(packed)
    drafter = heads.make_drafter(head, cfg, packed)
    assert heads.quantizes_head(packed) and drafter.quantized
    assert not any(type(m) is nn.Linear for m in drafter.head.modules())
    assert isinstance(drafter.output.product, Int8Linear)
    assert sum(type(m) is nn.Linear for m in head.modules()) > 0
    assert drafter.output.full_weight.dtype == torch.float32  # acceptance is measured against the target's own
    q = drafter.reference_distributions(torch.tensor([1, 2, 3, 4]), torch.tensor([[5, 6]]), SamplingParams(1.0))
    assert torch.allclose(q.sum(-1), torch.ones(1, 2), atol=1e-5)


def eight_bit_head_draft(target):
    """``random_head_draft``'s EAGLE head beside ``target`` packed: the drafter runs it on 8-bit weights."""
    pack_linears(target)
    drafter = random_head_draft(target, "eagle")
    assert drafter.quantized
    return drafter


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.8, top_k=4, top_p=0.9,
                                                                         repetition_penalty=1.3)])
def test_the_law_with_an_8_bit_head_is_the_targets_and_a_broken_verifier_shows(sampling):
    """Every branch of the first three tokens enumerated (``repro.exact``), gamma 1 and 2: the law through an 8-bit
    head is the target's to 1e-6, and the same enumeration with a verifier that draws its residual from p departs
    from it by more than 1e-3."""
    target = tiny_llama(vocab=5, hidden=32, seed=3)
    draft = eight_bit_head_draft(target)
    reference = exact_target_distribution(target, [1, 2], 3, sampling)
    for gamma in (1, 2):
        law = exact_speculative_distribution(target, draft, [1, 2], gamma, 3, sampling)
        assert max_abs_difference(law, reference) < 1e-6, gamma
    broken = exact_speculative_distribution(target, draft, [1, 2], 2, 3, sampling,
                                            verifier=MUTANTS["residual from p"])
    assert max_abs_difference(broken, reference) > 1e-3
