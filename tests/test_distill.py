"""Draft training pieces on a tiny target: initialisation, soft labels, the loss going down, saving."""
import numpy as np
import pytest
import torch

import specdec_lite as sd
from specdec_lite.train import cards, draft as distill

from conftest import tiny_llama


@pytest.fixture(scope="module")
def tiny_setup():
    target = tiny_llama(vocab=64, layers=2, hidden=32, seed=0).cpu()
    g = torch.Generator().manual_seed(0)
    records = []
    for i in range(24):  # "target-made" text: the tiny target's own greedy continuations of random prompts
        prompt = torch.randint(0, 64, (1, 6), generator=g)
        reply = sd.autoregressive_generate(target, prompt, max_new_tokens=20, sampling=sd.SamplingParams(0)).tokens
        arr = torch.cat([prompt[0], reply]).numpy()
        records.append(({"prompt_len": 6, "gen_len": 20}, arr))
    sequences = distill.records_to_batches(records, max_len=64)
    return target, sequences, distill.teacher_topk(target, sequences, k=4, progress=False)


def test_teacher_topk_matches_the_target(tiny_setup):
    target, sequences, soft = tiny_setup
    tokens = sequences[0][0]
    probs = target(input_ids=tokens[None]).logits[0].softmax(-1)
    idx, p = soft[0]
    assert idx.shape == (len(tokens), 4)
    assert torch.equal(idx[:, 0].long(), probs.argmax(-1))
    assert torch.allclose(p[:, 0].float(), probs.max(-1).values, atol=1e-3)


def test_draft_shares_vocabulary_and_special_tokens():
    target = tiny_llama(vocab=64, layers=1, seed=0)
    target.config.eos_token_id = 7  # special tokens of its own (the test models have no EOS)
    draft = distill.make_draft(target, distill.DraftConfig(hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, num_key_value_heads=1,
                                                           intermediate_size=32))
    assert draft.config.vocab_size == target.config.vocab_size
    assert draft.config.eos_token_id == target.config.eos_token_id == 7
    assert draft.config.bos_token_id == target.config.bos_token_id
    assert draft.config.tie_word_embeddings


def test_training_lowers_the_loss_and_saves_a_loadable_draft(tiny_setup, tmp_path):
    target, sequences, soft = tiny_setup
    torch.manual_seed(0)
    draft = distill.make_draft(target, distill.DraftConfig(hidden_size=32, num_hidden_layers=1,
                                                           num_attention_heads=2, num_key_value_heads=1,
                                                           intermediate_size=64))
    cfg = distill.TrainConfig(steps=60, batch_size=8, lr=1e-2, warmup=5, topk=4, eval_every=30,
                              heldout_fraction=0.2)
    log = distill.train_draft(draft, sequences, soft, cfg, tmp_path, progress=False)
    # a uniform draft would have CE log(64) = 4.16 and agreement 1/64
    assert log[-1]["heldout_hard_ce"] < 0.6 * np.log(64) and log[-1]["heldout_hard_ce"] < log[0]["heldout_hard_ce"]
    assert log[-1]["heldout_agreement"] > 0.3
    loaded = type(draft).from_pretrained(tmp_path, dtype=torch.float32)  # float16 on disk
    gen = sd.speculative_generate(target, loaded, sequences[0][0][None, :6], gamma=3, max_new_tokens=20,
                                  sampling=sd.SamplingParams(0))
    assert gen.tokens.tolist() == sequences[0][0][6:26].tolist()  # greedy identity with the trained draft
    used = cards.training_data([{"gen_len": 20, "temperature": 0.0, "family": "code"}])
    card = cards.draft_card(tmp_path, loaded, "tiny", used, log, cfg)
    assert "| 60 |" in card and "parameters" in card
