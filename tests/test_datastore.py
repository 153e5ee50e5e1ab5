"""Retrieval drafting from the target's earlier replies: the suffix array against brute force, the tree it
grows, the refusals. Its exact law (alone and inside the hybrid tree), the chi-square through the loop, the broken
verifiers and greedy identity on the embedded target are in test_trees.py and test_faster_drafting.py, beside
the other drafters'."""
import numpy as np
import pytest
import torch

import specdec_lite as sd
from specdec_lite.drafts.datastore import SEPARATOR, Datastore, DatastoreTreeDraft

GREEDY = sd.SamplingParams(temperature=0.0)


def random_records(seed=0, vocab=5, count=150, longest=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, longest)) for _ in range(count)]


def occurrences_by_hand(records, pattern):
    """Positions (record, start) where ``pattern`` occurs inside one record."""
    return [(r, s) for r, rec in enumerate(records) for s in range(len(rec) - len(pattern) + 1)
            if list(rec[s:s + len(pattern)]) == list(pattern)]


@pytest.mark.parametrize("key_length", [2, 5, 24])
def test_suffix_array_is_sorted_and_finds_every_occurrence(key_length):
    """The packed sort equals a sort of the suffixes' first key_length tokens; every pattern's range holds exactly
    its occurrences inside one record (none across a record's end)."""
    records = random_records()
    store = Datastore(records, key_length=key_length)
    keys = [tuple(store.tokens[p: p + key_length]) for p in store.sa]
    assert keys == sorted(keys) and len(store) == sum(len(r) + 1 for r in records)
    rng = np.random.default_rng(1)
    for n in range(1, key_length + 1):
        for _ in range(5):
            pattern = rng.integers(0, 5, n).tolist()
            lo, hi = store.occurrences(pattern)
            assert hi - lo == len(occurrences_by_hand(records, pattern)), pattern


def test_wide_vocabularies_pack_fewer_tokens_a_word():
    """Ids above 2^16 (a 128k vocabulary) sort as numbers too."""
    records = [np.array([70000, 5, 131000]), np.array([5, 70000, 5]), np.array([131000, 131000, 2])]
    store = Datastore(records, key_length=4)
    keys = [tuple(store.tokens[p: p + 4]) for p in store.sa]
    assert keys == sorted(keys)
    lo, hi = store.occurrences([70000, 5])
    assert hi - lo == 2


def test_longest_match_and_continuations_by_hand():
    records = [np.array([1, 2, 3, 4]), np.array([9, 2, 3, 4]), np.array([7, 2, 3, 5]), np.array([2, 3])]
    store = Datastore(records, key_length=6)
    n, lo, hi = store.longest_match([8, 9, 2, 3], max_match=5)
    assert (n, hi - lo) == (3, 1)  # "9 2 3" occurs once; "8 9 2 3" nowhere
    n, lo, hi = store.longest_match([0, 2, 3], max_match=5)
    assert (n, hi - lo) == (2, 4)  # "2 3": four times, once at a record's end
    following = store.continuations(lo, hi, 2)
    assert [(t, b - a) for t, a, b in following] == [(4, 2), (5, 1)]  # most frequent first; the end is left out
    assert store.longest_match([6], max_match=5) == (0, 0, 0)
    # a range read at sample points finds the same candidates and exact counts
    wide = Datastore([np.array([1, 2] * 300 + [1, 3] * 100)], key_length=4)
    _, lo, hi = wide.longest_match([1], max_match=1)
    sampled = wide.continuations(lo, hi, 1, sample=16)
    assert [(t, b - a) for t, a, b in sampled] == [(2, 300), (3, 100)]


def test_the_tree_holds_the_most_frequent_paths_within_the_budget():
    """Frequencies are shares of the longest match's occurrences; a path below min_frequency and nodes beyond
    the budget or gamma are left out; a chosen tree, built the same way each time."""
    records = [np.array([5, 1, 2, 3])] * 6 + [np.array([5, 1, 2, 4])] * 3 + [np.array([5, 1, 7])]
    store = Datastore(records, key_length=8)
    draft = DatastoreTreeDraft(store, budget=4, max_match=4, min_frequency=0.2)
    branches = draft.branches([9, 5, 1], gamma=3)
    # [7] (0.1) is below min_frequency; the records end after 3 and 4, so nothing grows under them
    assert [(p, round(f, 3)) for p, f in branches] == [([2], 0.9), ([2, 3], 0.6), ([2, 4], 0.3)]
    seq = torch.tensor([[9, 5, 1]])
    tree = draft.propose_tree(seq, torch.tensor([3]), 3, GREEDY, None)
    assert tree.tokens.tolist() == [1, 2, 3, 4] and tree.parents.tolist() == [-1, 0, 1, 1]
    assert not bool(tree.drawn.any())
    small = DatastoreTreeDraft(store, budget=1, max_match=4, min_frequency=0.0)
    assert small.branches([9, 5, 1], gamma=3) == [([2], 0.9)]
    assert DatastoreTreeDraft(store).branches([8, 8], gamma=3) == []  # no match: no nodes


def test_bad_stores_and_settings_are_refused():
    with pytest.raises(ValueError, match="at least one non-empty record"):
        Datastore([np.array([], dtype=np.int64)])
    with pytest.raises(ValueError, match=">= 0"):
        Datastore([np.array([1, -1, 2])])
    with pytest.raises(ValueError, match="key_length"):
        Datastore([np.array([1, 2])], key_length=1)
    with pytest.raises(ValueError, match="budget"):
        DatastoreTreeDraft(Datastore([np.array([1, 2])]), budget=0)


def test_a_target_that_did_not_write_the_corpus_is_refused(local_pairs):
    """Another model's token ids would mean other text: the store says whose replies it holds and what to do."""
    other, _ = sd.load_model(str(local_pairs / "tiny-4l"), dtype="float32")
    records = [({"target": "smollm2-135m-instruct", "prompt_len": 2}, np.array([1, 2, 3, 4]))]
    with pytest.raises(ValueError, match="written by \\['smollm2-135m-instruct'\\].*train.corpus"):
        Datastore.from_corpus(other, records)
    with pytest.raises(ValueError, match="needs replies"):
        sd.load_draft("store-tree", other)


def test_the_store_of_the_embedded_target_holds_its_replies_only(embedded):
    """From the shipped corpus: the replies (prompts left out), every record ended by a separator."""
    model, _ = embedded
    from specdec_lite.train import corpus

    records = corpus.load_records()
    store = Datastore.from_corpus(model, records)
    reply_tokens = sum(e["gen_len"] for e, _ in records)
    assert len(store) == reply_tokens + len(records)
    assert int((store.tokens[: len(store)] == SEPARATOR).sum()) == len(records)


def test_the_default_store_reads_the_records_it_was_benchmarked_with(embedded):
    """The corpus grows as training text; the store reads its first STORE_RECORDS records only."""
    model, _ = embedded
    from specdec_lite.drafts.datastore import STORE_RECORDS
    from specdec_lite.train import corpus

    records = corpus.load_records()
    assert len(records) > STORE_RECORDS
    first = records[:STORE_RECORDS]
    assert len(Datastore.from_corpus(model)) == sum(e["gen_len"] for e, _ in first) + len(first)


def test_the_default_store_counts_the_records_of_its_own_target(local_pairs, monkeypatch):
    """A target that appended its replies after the embedded target's STORE_RECORDS still finds them."""
    from specdec_lite.drafts import datastore

    other, _ = sd.load_model(str(local_pairs / "tiny-4l"), dtype="float32")
    embedded_records = [({"target": "smollm2-135m-instruct", "prompt_len": 2}, np.array([1, 2, 3]))] * 3
    own = ({"target": "tiny-4l", "prompt_len": 2, "gen_len": 3}, np.array([5, 6, 7, 8, 9]))
    monkeypatch.setattr(datastore, "STORE_RECORDS", 2)
    monkeypatch.setattr(datastore, "load_records", lambda: embedded_records + [own])
    assert len(Datastore.from_corpus(other)) == own[0]["gen_len"] + 1
