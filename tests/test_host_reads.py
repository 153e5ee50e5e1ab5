"""Host reads per round (issue #47): on a GPU every value read into Python waits for the device, so the loop
reads what a round decided once. Counted on a tiny random Llama (``instruments.host_reads``): every Python-level read of
a tensor on a CPU run (which errs high: it also counts reads a GPU run would make of host tensors), every
synchronization the CUDA runtime reports on a GPU (SPECDEC_TEST_DEVICE=cuda). The limits: plain decoding at most
1 per token, a chain round at most 2 (any temperature, batch 1), a tree round at most 3 outside the tree
drafter's own ``propose_tree`` (which builds the tree on the host); each run may add 1, the output read once at
the end."""
import pytest
import torch

import specdec_lite as sd
from conftest import DEVICE, tiny_llama
from specdec_lite.instruments.host_reads import count_cuda_syncs, count_host_reads
from specdec_lite.drafts.trees import LookupTreeDraft

GREEDY, T1 = sd.SamplingParams(temperature=0.0), sd.SamplingParams(temperature=1.0)
PROMPT = torch.tensor([3, 9, 4, 7, 3, 9, 5, 1, 3, 9, 6, 2, 3, 9])  # lookup trees find branches in it
OUTPUT = 1  # the run's output, read once when it finishes
CHECKS = 1  # the request's check, before any work, that its token ids lie inside the vocabulary


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(layers=2, seed=0), tiny_llama(layers=1, seed=1)


def counting():
    return count_cuda_syncs() if DEVICE == "cuda" else count_host_reads()


class OutsideDrafting(LookupTreeDraft):
    """Lookup trees whose ``propose_tree`` reads are set apart: the limit is the round's own."""

    def __init__(self, reads):
        super().__init__(branches=3, max_ngram=2)
        self.reads, self.inside = reads, 0

    def propose_tree(self, *args):
        before = self.reads.count
        tree = super().propose_tree(*args)
        self.inside += self.reads.count - before
        return tree


def reads_of(run):
    """(reads, rounds) of ``run(reads)``, the reads made inside a drafter's propose_tree left out."""
    run(None)  # warm-up: what runs once per process (a first forward's set-up) is not a round's
    with counting() as reads:
        out, drafter = run(reads)
    inside = getattr(drafter, "inside", 0)
    return reads.count - inside, out.stats.rounds, dict(reads.calls)


@pytest.mark.parametrize("sampling", [GREEDY, T1], ids=["greedy", "T=1"])
@pytest.mark.parametrize("eos", [None, 63], ids=["no EOS", "with an EOS token"])
def test_plain_decoding_reads_at_most_once_per_token(pair, sampling, eos):
    target, _ = pair
    count, rounds, calls = reads_of(lambda reads: (sd.autoregressive_generate(
        target, PROMPT.to(DEVICE), max_new_tokens=24, sampling=sampling, eos_token_id=eos), None))
    assert rounds == 24 and count <= 1 * rounds + CHECKS + OUTPUT, calls


@pytest.mark.parametrize("sampling", [GREEDY, T1], ids=["greedy", "T=1"])
def test_a_chain_round_reads_at_most_twice(pair, sampling):
    target, draft = pair
    count, rounds, calls = reads_of(lambda reads: (sd.speculative_generate(
        target, sd.ModelDraft(draft), PROMPT.to(DEVICE), gamma=4, max_new_tokens=24, sampling=sampling), None))
    assert count <= 2 * rounds + CHECKS + OUTPUT, calls


@pytest.mark.parametrize("sampling", [GREEDY, T1], ids=["greedy", "T=1"])
def test_a_tree_round_reads_at_most_three_times(pair, sampling):
    target, _ = pair

    def run(reads):
        drafter = OutsideDrafting(reads) if reads is not None else LookupTreeDraft(branches=3, max_ngram=2)
        out = sd.speculative_generate(target, drafter, PROMPT.to(DEVICE), gamma=3, max_new_tokens=24,
                                      sampling=sampling)
        return out, drafter

    count, rounds, calls = reads_of(run)
    assert count <= 3 * rounds + CHECKS + OUTPUT, calls
    assert max(run(None)[0].stats.proposed_lengths) > 3  # the trees really branched


def test_the_counter_sees_a_read(pair):
    """The counter itself: a read of a value is counted, and it leaves torch as it found it."""
    method = torch.Tensor.item
    with counting() as reads:
        torch.ones(2, device=DEVICE).sum().item()
    assert reads.count >= 1 and torch.Tensor.item is method
