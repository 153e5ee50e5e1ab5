"""The shipped drafts (data/drafts/) load and give the outputs recorded in tests/data/shipped_drafts.json: the
standalone draft's top-5 next-token logits at a few positions of a fixed chat prompt, and each head's first
round of proposals after a greedy prefill by the embedded target (tokens, and the top-3 values of the q the head
gives them at temperature 1).

Regenerate the reference (only after retraining a shipped draft): ``python tests/test_shipped_drafts.py``."""
import json
import sys
from pathlib import Path

import pytest
import torch

import specdec_lite as sd
from specdec_lite import names
from specdec_lite.core import models
from specdec_lite.repro import tasks

REFERENCE = Path(__file__).parent / "data" / "shipped_drafts.json"
PROMPT = "Write a Python function that returns the largest of three numbers."
POSITIONS = (0, 5, 10, -1)
GAMMA = 4


def draft_outputs(target, tokenizer) -> dict:
    draft, _ = models.load_model(names.EMBEDDED_DRAFT, device=target.device, dtype=torch.float32)
    ids = tasks.chat_ids(tokenizer, PROMPT).to(target.device)
    with torch.no_grad():
        logits = draft(input_ids=ids).logits[0].float()
    top = logits[list(POSITIONS)].topk(5, dim=-1)
    return {"ids": top.indices.tolist(), "values": top.values.tolist()}


def head_outputs(target, tokenizer, name: str) -> dict:
    """Proposals of the first drafting round (round 0 is the target's prefill) and their q at temperature 1."""
    drafter = sd.load_draft(name, target)
    rounds, original = [], drafter.propose

    def propose(seq, lengths, gamma, sampling, generator):
        drafts, q = original(seq, lengths, gamma, sampling, generator)
        rounds.append((seq[0, : int(lengths[0])].clone(), drafts.clone()))
        return drafts, q
    drafter.propose = propose
    ids = tasks.chat_ids(tokenizer, PROMPT).to(target.device)
    sd.speculative_generate(target, drafter, ids, gamma=GAMMA, max_new_tokens=8,
                            sampling=sd.SamplingParams(temperature=0))
    context, drafts = rounds[1]
    with torch.no_grad():
        q = drafter.reference_distributions(context, drafts, sd.SamplingParams(temperature=1.0))
    return {"tokens": drafts[0].tolist(), "q_top3": q[0].float().topk(3, dim=-1).values.tolist()}


def all_outputs(target, tokenizer) -> dict:
    return {"draft": draft_outputs(target, tokenizer),
            "eagle": head_outputs(target, tokenizer, names.EMBEDDED_EAGLE_DEEP_TTT),
            "medusa": head_outputs(target, tokenizer, names.EMBEDDED_MEDUSA)}


@pytest.mark.slow
def test_shipped_drafts_give_the_recorded_outputs():
    target, tokenizer = target_as_stored()
    got, ref = all_outputs(target, tokenizer), json.loads(REFERENCE.read_text())
    assert got["draft"]["ids"] == ref["draft"]["ids"]
    assert torch.allclose(torch.tensor(got["draft"]["values"]), torch.tensor(ref["draft"]["values"]), atol=1e-3)
    for kind in ("eagle", "medusa"):
        assert got[kind]["tokens"] == ref[kind]["tokens"], kind
        assert torch.allclose(torch.tensor(got[kind]["q_top3"]), torch.tensor(ref[kind]["q_top3"]),
                              atol=1e-4), kind


def target_as_stored():
    """The embedded target in float32 as transformers loads it, so that the heads run on the weights they ship
    (beside a tuned target a head drafts on 8-bit weights: ``heads.quantizes_head``)."""
    return sd.load_model(sd.EMBEDDED_TARGET, device="cpu", dtype=torch.float32, packed_linears=False)


if __name__ == "__main__":  # record the reference
    target, tokenizer = target_as_stored()
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(json.dumps(all_outputs(target, tokenizer), indent=1) + "\n")
    sys.stdout.write(REFERENCE.read_text())
