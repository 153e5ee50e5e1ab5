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
        sd.speculative_generate(target, object(), torch.tensor([[1]]))


@pytest.mark.parametrize("name", ["/path/that/does/not/exist", "./missing-model", "~/nowhere/model", "a/b/c"])
def test_a_model_that_is_neither_folder_nor_name_nor_hub_id_is_refused(name):
    with pytest.raises(FileNotFoundError, match="cannot be loaded: no folder is there"):
        sd.load_model(name, device="cpu")


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: a refusal that must not touch the network."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"the network was asked: {args}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("name, closest", [("ngram", "n-gram"), ("n-grma", "n-gram"), ("atuo", "auto"),
                                           ("layerskip", "layer-skip"), ("smollm2-135m-drft", "smollm2-135m-draft")])
def test_a_misspelt_draft_name_is_refused_at_once_offline_naming_the_closest(name, closest, no_network):
    """A name that is no registered name, no folder and not shaped like a hub id ('org/name') was looked up on the
    hub (25 s of retries, then a network error): now refused in under a second, listing the names and the closest,
    from load_draft, load_pair (before the target loads) and the notebooks' and server's check."""
    import time

    from specdec_lite.drafts.loading import DRAFT_NAMES, check_draft_name

    target = tiny_llama(layers=1)
    for refuse in (lambda: sd.load_draft(name, target), lambda: sd.load_pair(draft=name),
                   lambda: check_draft_name(name)):
        start = time.perf_counter()
        with pytest.raises(FileNotFoundError, match=f"Did you mean '{closest}'") as err:
            refuse()
        assert time.perf_counter() - start < 1.0
        assert all(known in str(err.value) for known in DRAFT_NAMES)


def test_a_misspelt_model_name_is_refused_at_once_offline(no_network):
    with pytest.raises(FileNotFoundError, match="Did you mean 'smollm2-135m-instruct'"):
        sd.load_model("smollm2-135m-instrct", device="cpu")


def test_a_hub_id_the_hub_cannot_serve_is_refused_in_one_line(monkeypatch, tmp_path):
    """An 'org/name' id that is not cached: refused at once where HF_HUB_OFFLINE is set or the hub's host cannot be
    reached, saying so in one line; passed on (to transformers) where the host answers."""
    import socket
    import time

    from specdec_lite.names import looks_like_hub_id, resolve_name

    assert looks_like_hub_id("meta-llama/Llama-3.1-8B-Instruct") and looks_like_hub_id("gpt2")
    assert not looks_like_hub_id("/abs/path") and not looks_like_hub_id("../x") and not looks_like_hub_id("a/b/c")
    assert resolve_name(str(tmp_path)) == str(tmp_path)
    hub_id = "specdec-lite-tests/not-a-model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache and HF_HUB_OFFLINE is set") as err:
        sd.load_model(hub_id, device="cpu")
    assert "\n" not in str(err.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with socket.socket() as closed:  # a port nothing listens on: the host cannot be reached
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="127.0.0.1 cannot be reached"):
        resolve_name(hub_id)
    assert time.perf_counter() - start < 5
    with socket.socket() as listening:  # a host that answers: the id goes on to the hub
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert resolve_name(hub_id) == hub_id


@pytest.fixture
def padded_target():
    """A tiny model whose generation config names pad token 0, and counts its forwards."""
    target = tiny_llama(layers=1)
    target.generation_config.pad_token_id = 0
    target.forwards = []
    target.register_forward_pre_hook(lambda *_: target.forwards.append(1))
    return target


@pytest.mark.parametrize("rows", [[[5, 6, 7], [8, 0, 0]],  # right padding (a tokenizer's default side)
                                  [[5, 6, 7], [0, 0, 8]],  # left padding
                                  [[0, 6, 7], [0, 0, 8]]])  # left padding under a BOS that is the pad token
def test_a_padded_batch_without_its_mask_is_refused_before_any_forward(padded_target, rows):
    """Such a batch was decoded as if its pads were prompt tokens (a right-padded "Hi" answered '<|im_end|>')."""
    for run in (lambda ids: sd.speculative_generate(padded_target, sd.NGramDraft(), ids, max_new_tokens=4),
                lambda ids: sd.autoregressive_generate(padded_target, ids, max_new_tokens=4)):
        with pytest.raises(ValueError, match="looks padded.*Pad on the left and pass the mask"):
            run(torch.tensor(rows))
    assert not padded_target.forwards


def test_unpadded_batches_pass_the_padding_check(padded_target):
    """Rows that start with one pad-like token each (a BOS), or that really end with it (given an all-ones mask)."""
    out = sd.autoregressive_generate(padded_target, torch.tensor([[0, 6, 7], [0, 5, 8]]), max_new_tokens=2)
    assert [len(row) for row in out.sequences] == [2, 2]
    ids = torch.tensor([[5, 6, 0], [8, 9, 0]])
    out = sd.autoregressive_generate(padded_target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=2)
    assert [len(row) for row in out.sequences] == [2, 2]


def test_a_right_padded_chat_batch_is_refused(local_pairs):
    """The user's case: apply_chat_template(..., padding=True) pads on the right by default."""
    from transformers import AutoTokenizer

    target, tok = sd.load_model(str(local_pairs / "tiny-1l"), device="cpu", dtype=torch.float32)
    chats = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Write a haiku about caches."}]]
    ids = tok.apply_chat_template(chats, add_generation_prompt=True, padding=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    with pytest.raises(ValueError, match="rows \\[0\\] end with the pad token"):
        sd.speculative_generate(target, sd.NGramDraft(), ids, max_new_tokens=4)
    assert isinstance(AutoTokenizer.from_pretrained(local_pairs / "tiny-1l").pad_token_id, int)


@pytest.mark.parametrize("arguments, error, match", [
    (dict(sampling="greedy"), TypeError, "sampling must be a SamplingParams"),
    (dict(gamma=True), ValueError, "gamma .* must be an integer >= 1, got True"),
    (dict(gamma=2.0), ValueError, "gamma .* must be an integer >= 1, got 2.0"),
    (dict(max_new_tokens="8"), ValueError, "max_new_tokens must be an integer >= 1"),
    (dict(seed=2**70), ValueError, "seed must be an integer from 0 to 2\\*\\*63 - 1"),
    (dict(seed=-1), ValueError, "seed must be an integer"),
    (dict(seed=1.5), ValueError, "seed must be an integer"),
    (dict(ignore_eos="yes"), TypeError, "ignore_eos must be True or False"),
    (dict(eos_token_id="</s>"), ValueError, "eos_token_id must be a token id"),
    (dict(on_round=3), TypeError, "on_round must be a function"),
    (dict(input_ids=torch.tensor([[0, 9]])), ValueError, "token id 9, outside the target's vocabulary \\(0 to 5\\)"),
    (dict(input_ids=torch.tensor([[-1, 2]])), ValueError, "token id -1, outside"),
    (dict(input_ids=[torch.tensor([0, 1, 2]), torch.tensor([3])]), ValueError,
     "rows have different lengths \\[3, 1\\]: pad them on the left and pass the mask"),
    (dict(input_ids="hello"), TypeError, "input_ids is a string: tokenize it first"),
    (dict(input_ids={"input_ids": [[0, 1]]}), TypeError, "pass input_ids=enc\\['input_ids'\\]"),
    (dict(input_ids=torch.tensor([[0.0, 1.0]])), TypeError, "integer token ids"),
    (dict(attention_mask="all"), TypeError, "attention_mask must be a tensor"),
])
def test_every_argument_is_checked_before_any_work_naming_it(pair, arguments, error, match):
    target, draft = pair
    args = dict(input_ids=torch.tensor([[0, 1]]), gamma=4, max_new_tokens=8)
    args.update(arguments)
    with pytest.raises(error, match=match):
        sd.speculative_generate(target, draft, args.pop("input_ids"), **args)
    assert target.forwards == 0 and draft.forwards == 0


def test_rows_given_as_a_list_of_equal_tensors_run_as_a_batch(pair):
    target, draft = pair
    rows = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    out = sd.speculative_generate(target, draft, rows, max_new_tokens=3)
    assert [len(row) for row in out.sequences] == [3, 3]


@pytest.mark.parametrize("settings, error, match", [
    (dict(temperature="hot"), TypeError, "temperature must be a finite number, got 'hot'"),
    (dict(temperature=float("inf")), TypeError, "temperature must be a finite number"),
    (dict(top_p=None), TypeError, "top_p must be a finite number"),
    (dict(top_k=2.5), TypeError, "top_k must be an integer"),
    (dict(repetition_penalty=True), TypeError, "repetition_penalty must be a finite number"),
])
def test_sampling_settings_of_the_wrong_type_are_refused_naming_them(settings, error, match):
    with pytest.raises(error, match=match):
        sd.SamplingParams(**settings)


def test_names_where_models_go_are_refused_saying_how_to_load_them(pair):
    target, _ = pair
    with pytest.raises(TypeError, match="target is the name 'smollm2-135m-instruct', not a loaded model"):
        sd.speculative_generate("smollm2-135m-instruct", target, torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match="draft is the name 'n-gram'.*sd.load_draft"):
        sd.speculative_generate(target, "n-gram", torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match="load_draft needs the loaded target"):
        sd.load_draft("n-gram", "smollm2-135m-instruct")


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


def test_the_server_refuses_a_misspelt_draft_in_one_line_without_a_traceback():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "specdec_lite.serve", "--draft", "ngram"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "Did you mean 'n-gram'" in run.stderr and "Traceback" not in run.stderr
