"""4-bit linear layers (``tuning/int4.py``): the blocks are read as llama.cpp stores them, the kernel computes with
the stored weights (exactly, in float32), and speculative decoding keeps an int4 target's output law.

Statistical design of the T = 1 check: N = 4,000 runs of the real loop (one batch of N copies of the prompt, a
tiny 4-bit Llama target of vocabulary 4, a tiny draft model, gamma 2), the joint law of the first 3 tokens (64
cells, those expected under 5 merged), Pearson chi-square against the target's own law, enumerated exactly; it
passes at p > 1e-3. Its power against a broken verifier (the residual drawn from p, ``repro.mutants``), computed
from both exact laws at this N and level, must exceed 0.99 (it is 1.0 to three decimals from N = 2,000 on), and the loop run with that verifier must be rejected
at p < 1e-6.
"""
import numpy as np
import pytest
import torch
from torch import nn

import specdec_lite as sd
from specdec_lite.names import EMBEDDED_EAGLE_DEEP_TTT
from specdec_lite.core.lm import static_state, use_static_cache
from specdec_lite.repro.exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference
from specdec_lite.repro.mutants import MUTANTS
from specdec_lite.repro.stats import chi_square_power, chi_square_pvalue
from specdec_lite.tuning import int4
from specdec_lite.tuning.int4 import GROUP, Int4Linear, dequantized, int4_linears, unpack_q4_1, unpermuted_rows

from conftest import tiny_llama


def q4_1_blocks(weight: torch.Tensor, generator: torch.Generator) -> tuple:
    """Random Q4_1 blocks (q, d, m) shaped like ``weight`` (N, K), with float16 d and m on the weight's scale."""
    n, k = weight.shape
    scale = weight.abs().max().item()
    d = (torch.rand(n, k // GROUP, generator=generator) * scale / 8).half().float()
    m = (-torch.rand(n, k // GROUP, generator=generator) * scale).half().float()
    q = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.int32)
    return q, d, m


def int4_tiny_llama(dtype=torch.float32, vocab=64, layers=2, seed=0):
    """A tiny Llama whose projections hold Q4_1 weights, run on the 4-bit kernel."""
    model = tiny_llama(vocab=vocab, layers=layers, seed=seed).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    blocks = {name: q4_1_blocks(module.weight, generator) for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and name != "lm_head"}
    with torch.no_grad():
        for name, (q, d, m) in blocks.items():
            model.get_submodule(name).weight.copy_(dequantized(q, d, m))
    assert int4_linears(model, blocks) == len(blocks) == 7 * layers
    return model


def test_a_q4_1_block_is_read_low_nibbles_first():
    """A block's bytes: float16 d, float16 m, then 16 bytes whose low 4 bits are weights 0..15 and high 4 bits
    weights 16..31 (llama.cpp's layout)."""
    q = np.arange(32) % 16
    values = (q[:16] | (q[16:][::-1] << 4)).astype(np.uint8)  # high nibbles: weights 16..31 = 15..0
    raw = np.concatenate([np.array([0.5], np.float16).view(np.uint8), np.array([-2.0], np.float16).view(np.uint8),
                          values])[None]
    got_q, d, m = unpack_q4_1(raw)
    assert got_q[0].tolist() == list(range(16)) + list(range(15, -1, -1))
    assert d.item() == 0.5 and m.item() == -2.0
    assert dequantized(got_q, d, m)[0, :3].tolist() == [-2.0, -1.5, -1.0]


def test_rows_are_unpermuted_as_transformers_loads_a_llama_gguf():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows, heads = 24, 3
    weights = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(weights, heads, heads)
    assert np.array_equal(weights[unpermuted_rows(rows, heads)], theirs)


@pytest.mark.parametrize("dtype, exact", [(torch.float32, True), (torch.bfloat16, False)])
def test_the_kernel_computes_with_the_stored_weights(dtype, exact):
    """float32: the kernel's weights are d * q + m bit for bit; bfloat16: its scales are rounded to bfloat16, so
    its weights are close to the model's, not equal (a number format of its own). A broken packing (zero = m,
    without the kernel's offset of 8 steps) is caught."""
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(64, 32, bias=False).to(dtype)
    q, d, m = q4_1_blocks(linear.weight, generator)
    with torch.no_grad():
        linear.weight.copy_(dequantized(q, d, m))
    layer = Int4Linear(linear, q, d, m)
    kernel = layer.kernel_weight()
    assert torch.equal(kernel, linear.weight.detach()) == exact
    torch.testing.assert_close(kernel.float(), linear.weight.detach().float(), rtol=0, atol=d.max().item() / 8)
    x = torch.randn(5, 64, generator=generator).to(dtype)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x).float(), (x @ linear.weight.T).float(),
                                   rtol=1e-5 if exact else 2e-2, atol=1e-4 if exact else 0.25)
    broken = Int4Linear(linear, q, d, m)
    broken.scales_and_zeros[..., 1] = m.t().to(dtype)
    assert not torch.allclose(broken.kernel_weight().float(), linear.weight.detach().float(), atol=1e-3)


def test_blocks_that_are_not_the_models_weights_are_refused_before_any_change():
    model = tiny_llama(layers=1)
    generator = torch.Generator().manual_seed(1)
    blocks = {"model.layers.0.mlp.up_proj": q4_1_blocks(model.model.layers[0].mlp.up_proj.weight, generator)}
    with pytest.raises(ValueError, match="not this model's weights: give the GGUF the model was converted from"):
        int4_linears(model, blocks)
    assert not any(isinstance(module, Int4Linear) for module in model.modules())


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="HuggingFaceTB/SmolLM2-360M-Instruct"), "only the embedded target"),
    (dict(dtype=torch.float16), "float32 or bfloat16 activations"),
    (dict(device_map="auto"), "device_map places the layers itself"),
    (dict(batch_invariant=True), "batch_invariant=True replaces the linear layers"),
])
def test_int4_refuses_what_it_cannot_run_before_loading(kwargs, message):
    settings = dict(name=sd.EMBEDDED_TARGET, device=torch.device("cpu"), dtype=torch.bfloat16, device_map=None,
                    batch_invariant=False)
    with pytest.raises(ValueError, match=message):
        int4.int4_source(**{**settings, **kwargs})


def test_a_compiled_int4_target_decodes_what_the_eager_one_does():
    """compile=True on 4-bit layers (float32, one layer): the compiled graph autotunes its matrix products (the only
    way inductor may put the 4-bit product on its C++ template), and greedy decoding through it gives the eager
    int4 model's tokens. One compiled shape (one token) keeps the test short: chains and trees run through the same
    compiled forward, whose wider shapes tests/test_static_trees.py checks on models without 4-bit layers."""
    eager, compiled = int4_tiny_llama(layers=1, seed=5), int4_tiny_llama(layers=1, seed=5)
    x = torch.tensor([[3, 9, 27, 17, 51]])
    greedy = sd.SamplingParams(temperature=0.0)
    reference = sd.autoregressive_generate(eager, x, max_new_tokens=12, sampling=greedy, ignore_eos=True).tokens
    use_static_cache(compiled, max_length=64, compile=True)
    ours = sd.autoregressive_generate(compiled, x, max_new_tokens=12, sampling=greedy, ignore_eos=True).tokens
    assert torch.equal(ours, reference) and static_state(compiled).forward.settings["max_autotune"]


def test_t1_law_of_an_int4_target_is_kept_and_a_broken_verifier_is_rejected():
    """The module's text: exact enumeration, then N = 4,000 runs of the loop, chi-square and its power."""
    target = int4_tiny_llama(vocab=4, seed=3)
    draft = tiny_llama(vocab=4, layers=1, seed=4)
    prompt, sampling, n, level = [1, 3, 0], sd.SamplingParams(temperature=1.0), 4_000, 1e-3
    law = exact_target_distribution(target, prompt, 3, sampling)
    assert max_abs_difference(exact_speculative_distribution(target, draft, prompt, 2, 3, sampling), law) < 1e-6
    broken = MUTANTS["residual from p"]
    broken_law = exact_speculative_distribution(target, draft, prompt, 2, 3, sampling, verifier=broken)
    assert chi_square_power(law, broken_law, n, level) > 0.99

    def first_three(verifier, seed):
        gen = sd.speculative_generate(target, draft, torch.tensor([prompt] * n), gamma=2, max_new_tokens=3,
                                      sampling=sampling, seed=seed, verifier=verifier)
        return torch.stack(gen.sequences).numpy()

    assert chi_square_pvalue(first_three(sd.core.decode.EXACT, 0), law) > level
    assert chi_square_pvalue(first_three(broken, 1), law) < 1e-6


def test_the_embedded_target_on_its_4_bit_blocks(embedded_int4):
    """float32: the 210 projections run on the kernel, which computes with the very weights of the float32 model
    (checked on six of them; ``int4_linears`` checked every block against the model's weights), and greedy
    speculative decoding with the shipped EAGLE head's chain is plain greedy decoding, token for token (the chain:
    "auto"'s dynamic tree would first time this slow float32 kernel for its tree costs)."""
    model, tokenizer = embedded_int4
    layers = [module for module in model.modules() if isinstance(module, Int4Linear)]
    assert len(layers) == 210
    assert all(torch.equal(layer.kernel_weight(), layer.weight.detach()) for layer in layers[::35])
    ids = sd.tokenizers.chat_ids(tokenizer, "Write a haiku about the sea.")
    greedy = sd.SamplingParams(temperature=0.0)
    plain = sd.autoregressive_generate(model, ids, max_new_tokens=12, sampling=greedy, ignore_eos=True)
    spec = sd.speculative_generate(model, sd.load_draft(EMBEDDED_EAGLE_DEEP_TTT, model), ids, max_new_tokens=12, sampling=greedy,
                                   ignore_eos=True)
    assert torch.equal(plain.tokens, spec.tokens) and spec.stats.mean_accepted_length > 1


@pytest.fixture(scope="module")
def embedded_int4(embedded):
    return sd.load_model(sd.EMBEDDED_TARGET, device="cpu", dtype="float32", int4=True)
