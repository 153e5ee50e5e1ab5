"""Target-made training text: append-only storage, resumable, prompts disjoint from evaluation prompts."""
import numpy as np

from specdec_lite.train import corpus

from conftest import tiny_llama


def test_training_prompts_are_many_unique_and_stable():
    prompts = corpus.training_prompts()
    assert len(prompts) > 2000  # the shipped corpus: hours of target generation
    assert len({p["id"] for p in prompts}) == len(prompts) == len({p["prompt"] for p in prompts})
    assert prompts == corpus.training_prompts()  # same seed, same order
    assert {p["family"] for p in prompts} == {"code", "explain", "advice", "translate", "chat"}


def test_generate_corpus_appends_and_resumes(tmp_path, embedded):
    _, tokenizer = embedded
    side = tokenizer.padding_side
    model = tiny_llama(vocab=49152, layers=1, hidden=32, seed=5, max_positions=8192)
    n1 = corpus.generate_corpus(model, tokenizer, tmp_path, budget_tokens=20, batch_size=2, max_new_tokens=8,
                                progress=False)
    first = corpus.load_index(tmp_path)
    n2 = corpus.generate_corpus(model, tokenizer, tmp_path, budget_tokens=20, batch_size=2, max_new_tokens=8,
                                progress=False)
    index = corpus.load_index(tmp_path)
    assert tokenizer.padding_side == side  # the caller's tokenizer is left as it was
    assert n1 >= 20 and n2 >= 20 and len(index) == 2 * len(first)
    assert len({e["id"] for e in index}) == len(index)  # the second run skipped what the first had done
    records = corpus.load_records(tmp_path)
    total = sum(len(arr) for _, arr in records)
    assert total == (tmp_path / "tokens.bin").stat().st_size // 2
    for entry, arr in records:
        assert entry["prompt"] in tokenizer.decode(arr[: entry["prompt_len"]])
        assert len(arr) == entry["prompt_len"] + entry["gen_len"] and arr.dtype == np.int64
