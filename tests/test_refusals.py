"""Clear refusals: bad input is refused with a message that says what to do, before any work starts."""
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

import specdec_lite as sd
from specdec_lite.repro.toy import MarkovLM, random_pair

from conftest import tiny_llama


class CountingMarkov(MarkovLM):
    """A toy model that counts its forwards, to show a refusal came before any work."""

    def __init__(self, transition):
        super().__init__(transition)
        self.forwards = 0

    def feed(self, tokens, num_logits=None):
        self.forwards += 1
        return super().feed(tokens, num_logits)


@pytest.fixture
def pair():
    t, d = random_pair(6, 0.5, 0)
    return CountingMarkov(t.transition), CountingMarkov(d.transition)


def refused(pair, match, **kwargs):
    target, draft = pair
    args = dict(input_ids=torch.tensor([[0, 1]]), gamma=4, max_new_tokens=8)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        sd.speculative_generate(target, draft, args.pop("input_ids"), **args)
    assert target.forwards == 0 and draft.forwards == 0


def test_gamma_below_one(pair):
    refused(pair, "gamma .* must be an integer >= 1", gamma=0)


def test_max_new_tokens_below_one(pair):
    refused(pair, "max_new_tokens must be an integer >= 1", max_new_tokens=0)


def test_empty_input(pair):
    refused(pair, "input_ids is empty", input_ids=torch.zeros(1, 0, dtype=torch.long))


def test_negative_temperature():
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        sd.SamplingParams(temperature=-0.1)


@pytest.mark.parametrize("top_p", [0.0, 1.5, -1])
def test_top_p_outside_unit_interval(top_p):
    with pytest.raises(ValueError, match="top_p must be in \\(0, 1\\]"):
        sd.SamplingParams(top_p=top_p)


def test_sampling_must_be_sampling_params(pair):
    refused(pair, "sampling must be a SamplingParams", sampling={"temperature": 0})


def test_input_longer_than_context():
    target = tiny_llama(max_positions=16, layers=1)
    with pytest.raises(ValueError, match="context is 16; shorten the prompt"):
        sd.speculative_generate(target, sd.NGramDraft(), torch.zeros(1, 20, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="lower max_new_tokens to at most 6"):
        sd.speculative_generate(target, sd.NGramDraft(), torch.zeros(1, 6, dtype=torch.long), gamma=4,
                                max_new_tokens=8)
    with pytest.raises(ValueError, match="context is 16"):
        sd.autoregressive_generate(target, torch.zeros(1, 16, dtype=torch.long), max_new_tokens=4)


def test_vocabulary_that_cannot_be_aligned(pair):
    target, _ = pair
    smaller = CountingMarkov(torch.full((5, 5), 0.2, dtype=torch.float64))
    refused((target, smaller), "cannot be aligned")
    with pytest.raises(ValueError, match="cannot be aligned"):
        sd.speculative_generate(tiny_llama(vocab=64, layers=1), tiny_llama(vocab=48, layers=1, seed=2),
                                torch.tensor([[1, 2]]), max_new_tokens=4)


def test_tokenizer_smaller_than_model_is_refused():
    model = tiny_llama(vocab=32, layers=1)
    tok = word_tokenizer(40)
    sd.register_tokenizer(model, tok)
    with pytest.raises(ValueError, match="vocabulary cannot be aligned"):
        sd.speculative_generate(model, sd.NGramDraft(), torch.tensor([[1, 2]]), max_new_tokens=4)


def word_tokenizer(n, prefix="t"):
    vocab = {f"{prefix}{i}": i for i in range(n)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token=f"{prefix}0")))


def test_tokenizers_that_do_not_match():
    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        sd.check_tokenizers(word_tokenizer(64, "a"), word_tokenizer(64, "b"))
    sd.check_tokenizers(word_tokenizer(64), word_tokenizer(64))  # equal ones pass
    target, draft = tiny_llama(layers=1), tiny_llama(layers=1, seed=1)
    sd.register_tokenizer(target, word_tokenizer(64, "a"))
    sd.register_tokenizer(draft, word_tokenizer(64, "b"))
    with pytest.raises(ValueError, match="tokenizer differs"):
        sd.speculative_generate(target, draft, torch.tensor([[1, 2]]), max_new_tokens=4)


def test_batches_that_run_one_prompt_at_a_time_are_refused_clearly():
    """Batches of real models run on the dynamic cache with chain drafts, heads included (``test_batched.py``); the
    static cache and token trees take one prompt at a time, and say so before any forward."""
    from specdec_lite.core.lm import use_static_cache
    from specdec_lite.drafts import heads

    x = torch.tensor([[1, 2], [3, 4]])
    static, draft = use_static_cache(tiny_llama(layers=1), max_length=64), tiny_llama(layers=1, seed=1)
    target = tiny_llama(layers=1, seed=2)
    cfg = heads.head_config_for(target, "eagle", "tiny", sub_vocab_size=0)
    tree = sd.EagleTreeDraft(heads.make_drafter(heads.build_head(cfg), cfg, target))
    forwards = []
    for model in (static, draft, target):
        model.register_forward_pre_hook(lambda *_: forwards.append(1))
    with pytest.raises(NotImplementedError, match="needs the dynamic cache .*use_dynamic_cache"):
        sd.speculative_generate(static, draft, x, max_new_tokens=16, sampling=sd.SamplingParams(temperature=1.0))
    with pytest.raises(NotImplementedError, match="needs the dynamic cache .*use_dynamic_cache"):
        sd.autoregressive_generate(static, x, max_new_tokens=16)
    with pytest.raises(NotImplementedError, match="EagleTreeDraft proposes token trees .*batch size 1"):
        sd.speculative_generate(target, tree, x, max_new_tokens=16)
    assert not forwards


def test_bad_draft_arguments():
    with pytest.raises(ValueError, match="min_ngram"):
        sd.NGramDraft(max_ngram=1, min_ngram=2)
    target = tiny_llama(layers=4)
    with pytest.raises(ValueError, match="exit_layer must be in 1..4"):
        sd.LayerSkipDraft(target, exit_layer=5)
    with pytest.raises(ValueError, match="distinct indices"):
        sd.LayerSkipDraft(target, layers=[0, 0])
    with pytest.raises(TypeError, match="draft must be"):
        sd.speculative_generate(target, "not a model", torch.tensor([[1]]))


@pytest.mark.parametrize("name", ["/path/that/does/not/exist", "./missing-model", "~/nowhere/model", "a/b/c"])
def test_a_model_that_is_neither_folder_nor_name_nor_hub_id_is_refused(name):
    with pytest.raises(FileNotFoundError, match="not a folder, not a package name"):
        sd.load_model(name, device="cpu")


def test_hub_ids_and_folders_pass_the_name_check(tmp_path):
    from specdec_lite.core.models import looks_like_hub_id, resolve_name

    assert looks_like_hub_id("meta-llama/Llama-3.1-8B-Instruct") and looks_like_hub_id("gpt2")
    assert not looks_like_hub_id("/abs/path") and not looks_like_hub_id("../x") and not looks_like_hub_id("a/b/c")
    assert resolve_name(str(tmp_path)) == str(tmp_path)
    assert resolve_name("meta-llama/Llama-3.2-1B-Instruct") == "meta-llama/Llama-3.2-1B-Instruct"


@pytest.mark.parametrize("name", ["hybrid-tree", "eagle-tree-drawn", "hybrid-dynamic-store", "lookup-tree",
                                  "store-tree", "smollm2-135m-eagle"])
def test_a_removed_draft_name_is_refused_listing_the_names_load_draft_takes(name):
    """A drafting or head that was removed is refused before anything loads (not looked up as a hub id), and the
    message lists every name ``load_draft`` takes; ``check_draft_name`` (the notebooks' first check) says the same."""
    from specdec_lite.drafts.loading import DRAFT_NAMES, check_draft_name

    target = tiny_llama(layers=2)
    for refuse in (lambda: sd.load_draft(name, target), lambda: check_draft_name(name)):
        with pytest.raises(ValueError, match=f"draft '{name}' was removed") as err:
            refuse()
        assert f"load_draft takes {', '.join(DRAFT_NAMES)}, a head folder" in str(err.value)
    assert set(DRAFT_NAMES) == {"auto", "hybrid-dynamic", "dynamic-tree", "eagle-tree", "n-gram", "layer-skip"}
