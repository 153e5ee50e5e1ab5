"""Linear layers on oneDNN-packed weights (tuning/packed_linear.py): the same product as nn.Linear (float32, and
bfloat16 where oneDNN computes it), what loads packed by default, the refusals, and the baseline's unpacked
candidates."""
import pytest
import torch
from torch import nn

from specdec_lite.tuning.packed_linear import PackedLinear, can_pack, has_packed_linears, pack_linears
from specdec_lite.repro import baseline

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32),
                                reason="torch has no oneDNN (torch.backends.mkldnn) here")


PACKED_BFLOAT16 = can_pack(torch.device("cpu"), torch.bfloat16)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # bfloat16: a product rounded once, in another order


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not PACKED_BFLOAT16, reason="oneDNN does not compute bfloat16 on this CPU (no AVX-512 or AMX)"))])
def test_a_packed_linear_computes_the_linear_product_at_every_width(bias, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(dtype)
    packed = PackedLinear(linear)
    with torch.inference_mode():
        for shape in [(1, 96), (7, 96), (1, 33, 96), (2, 5, 96)]:
            x = torch.randn(shape, dtype=dtype)
            out = packed(x)
            assert out.dtype == dtype
            tol = TOLERANCE[dtype]
            torch.testing.assert_close(out, linear(x), rtol=tol, atol=tol)


def test_gradients_flow_as_through_nn_linear_and_an_in_place_change_is_packed_again():
    """oneDNN's packed product has no backward: with gradients on, the layer computes F.linear on its own weight.
    A weight changed in place after packing is repacked before its next use, so no stale copy is ever used."""
    torch.manual_seed(1)
    linear = nn.Linear(16, 8)
    packed = PackedLinear(nn.Linear(16, 8))
    packed.load_state_dict(linear.state_dict())  # in place: the packed copy is now stale until the next forward
    x = torch.randn(3, 16, requires_grad=True)
    packed(x).square().sum().backward()
    grad_packed, weight_grad = x.grad.clone(), packed.weight.grad.clone()
    x.grad = None
    linear(x).square().sum().backward()
    torch.testing.assert_close(grad_packed, x.grad)
    torch.testing.assert_close(weight_grad, linear.weight.grad)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        packed.weight.mul_(2)
        torch.testing.assert_close(packed(x), 2 * (x @ linear.weight.T) + linear.bias, rtol=1e-5, atol=1e-5)


def test_pack_linears_replaces_every_linear_and_refuses_float16_before_changing_anything():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    assert pack_linears(model) == 2 and has_packed_linears(model)
    assert [type(m).__name__ for m in model.modules()].count("PackedLinear") == 2
    half = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4).half())
    with pytest.raises(ValueError, match="packed_linears=False"):
        pack_linears(half)
    assert type(half[0]) is nn.Linear and not has_packed_linears(half)


def test_float32_loads_packed_on_the_cpu_by_default_and_the_refusals_say_what_to_do(local_pairs):
    """float32 loads packed; bfloat16 loads packed exactly where oneDNN computes it; float16 never does."""
    import specdec_lite as sd

    path = str(local_pairs / "tiny-2l")
    packed, _ = sd.load_model(path, device="cpu", dtype="float32")
    plain, _ = sd.load_model(path, device="cpu", dtype="float32", packed_linears=False)
    bfloat16, _ = sd.load_model(path, device="cpu", dtype="bfloat16")
    float16, _ = sd.load_model(path, device="cpu", dtype="float16")
    assert has_packed_linears(packed) and not has_packed_linears(plain) and not has_packed_linears(float16)
    assert has_packed_linears(bfloat16) == PACKED_BFLOAT16
    assert [baseline.configuration(m) for m in (packed, plain, bfloat16, float16)] == [
        "float32", "float32 unpacked", "bfloat16", "float16"]
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, plain(ids).logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="not float16 on cpu"):
        sd.load_model(path, device="cpu", dtype="float16", packed_linears=True)
    if not PACKED_BFLOAT16:
        with pytest.raises(ValueError, match="not bfloat16 on cpu"):
            sd.load_model(path, device="cpu", dtype="bfloat16", packed_linears=True)
    with pytest.raises(ValueError, match="neither device_map nor batch_invariant"):
        sd.load_model(path, device="cpu", dtype="float32", packed_linears=True, batch_invariant=True)


def test_packed_linears_are_refused_for_compiled_forwards_before_loading(local_pairs, monkeypatch):
    """torch's compiler cannot compile the packed product: packed_linears=True with compile=True is refused before
    anything loads, and so is compiling a model already packed (test_static_cache loads compile=True unpacked)."""
    import specdec_lite as sd
    from transformers import AutoModelForCausalLM

    from specdec_lite.core.lm import use_static_cache

    packed, _ = sd.load_model(str(local_pairs / "tiny-1l"), device="cpu", dtype="float32")
    with pytest.raises(ValueError, match=r"packed for oneDNN, which torch's compiler cannot compile: load it with "
                                         r"packed_linears=False"):
        use_static_cache(packed, compile=True)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded anyway"))
    with pytest.raises(ValueError, match=r"packed_linears=True does not go with compile=True.*load with "
                                         r"packed_linears=None \(the default, off with compile=True\) or False"):
        sd.load_model(str(local_pairs / "tiny-1l"), device="cpu", dtype="float32", cache="static", compile=True,
                      packed_linears=True)


def test_a_head_on_a_packed_target_drafts_on_8_bit_weights(local_pairs):
    """The EAGLE head runs tuned where its target does: beside a packed target on 8-bit weights
    (``tuning.int8_head``), beside one as transformers loads it as ``nn.Linear`` layers."""
    import specdec_lite as sd
    from specdec_lite.drafts.heads import EagleHead, head_config_for, make_drafter
    from specdec_lite.tuning.int8_head import Int8Linear

    for packed_linears in (None, False):
        target, _ = sd.load_model(str(local_pairs / "tiny-2l"), device="cpu", dtype="float32",
                                  packed_linears=packed_linears)
        cfg = head_config_for(target, "eagle")
        draft = make_drafter(EagleHead(cfg), cfg, target)
        assert has_packed_linears(target) == (packed_linears is None) and not has_packed_linears(draft.head)
        kinds = {type(m) for m in draft.head.modules() if "Linear" in type(m).__name__}
        assert kinds == ({Int8Linear} if packed_linears is None else {nn.Linear})
        assert isinstance(draft.output.product, Int8Linear) == (packed_linears is None)


@pytest.mark.parametrize("packed_linears", [None, False])
@pytest.mark.parametrize("vocab_ids", [None, torch.tensor([5, 0, 17, 3])])
def test_the_heads_output_layer_is_the_targets_own_product_packed_or_not(local_pairs, vocab_ids, packed_linears):
    """The drafters' output layer (``OutputLayer.sub_logits``) computes the target's output product over its
    sub-vocabulary, packed where the target's layers are and as ``nn.Linear`` where they are not."""
    import specdec_lite as sd
    from specdec_lite.drafts.heads import OutputLayer

    target, _ = sd.load_model(str(local_pairs / "tiny-2l"), device="cpu", dtype="float32",
                              packed_linears=packed_linears)
    weight = target.get_output_embeddings().weight.detach()
    vocab = weight.shape[0]
    output = OutputLayer(target, vocab, vocab_ids)
    assert isinstance(output.product, PackedLinear) == (packed_linears is None)
    hidden = torch.randn(3, weight.shape[1])
    expected = hidden @ (weight if vocab_ids is None else weight[vocab_ids]).T
    with torch.inference_mode():
        torch.testing.assert_close(output.sub_logits(hidden), expected, rtol=1e-5, atol=1e-5)
        full = output.logits(hidden[0])
    kept = torch.arange(vocab) if vocab_ids is None else vocab_ids
    torch.testing.assert_close(full[kept], expected[0], rtol=1e-5, atol=1e-5)
    assert torch.isinf(full).sum() == vocab - len(kept)
