"""What a generation refuses, before any work: the one place where a request to the loop is checked.

``check_generation`` takes every argument of ``speculative_generate`` and ``autoregressive_generate`` and returns
the ``core.decode.Request`` the loop runs on (the wrapped target and drafter, the prompt as a (B, T) tensor, each row's left padding, the
end-of-sequence tokens), or raises an error naming the argument, the value it got and what to give instead. A
batch that would decode silently wrong (padded rows without their mask, token ids outside the vocabulary) is
refused here, never run.
"""
from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral, Real

import torch

from .core.decode import Request
from .core.drafter import Drafter, as_drafter
from .core.lm import HFCausalLM, as_language_model
from .tokenizers import tokenizer_of
from .core.sampling import SamplingParams
from .tokenizers import check_tokenizers

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes any 64-bit integer; we take the non-negative ones


def check_generation(target, draft, input_ids, *, attention_mask, gamma, max_new_tokens, sampling, seed,
                     eos_token_id, ignore_eos, timed=True, on_round=None, verifier=None,
                     plain: bool = False) -> Request:
    """Every argument of a generation checked, in the order a user would fix them; ``plain``: the baseline
    (``draft`` is ignored, gamma is 1)."""
    check_flag("ignore_eos", ignore_eos)
    check_flag("timed", timed)
    check_seed(seed)
    if on_round is not None and not callable(on_round):
        raise TypeError(f"on_round must be a function of the rows' new tokens (or None), got {type(on_round).__name__}")
    if verifier is not None and not all(callable(getattr(verifier, name, None)) for name in ("chain", "tree")):
        raise TypeError(f"verifier must be a core.decode.Verifier, got {type(verifier).__name__}")
    target_lm = as_language_model(model_or_advice(target, "target"))
    drafter = None if plain else as_drafter(model_or_advice(draft, "draft"), target).at(check_sampling(sampling))
    max_length, context_name = context_limit(target_lm, getattr(drafter, "lm", None))
    input_ids = check_request(input_ids, max_length, gamma, max_new_tokens, sampling, context_name)
    check_token_ids(input_ids, target_lm.vocab_size)
    input_ids, padding = check_padding(input_ids, attention_mask, target, sampling)
    if plain:
        check_batch(input_ids, padding, target_lm)
    else:
        check_pair(target, target_lm, drafter, input_ids, sampling, padding)
    return Request(target_lm, drafter, input_ids, padding, end_tokens(target, eos_token_id, ignore_eos))


# ---------------------------------------------------------------- arguments one by one
def is_integer(value) -> bool:
    """An integer that is not a bool (True would otherwise pass as 1)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number that is not a bool (a Python or NumPy int or float)."""
    return isinstance(value, Real) and not isinstance(value, bool)


def check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_seed(seed) -> None:
    if not is_integer(seed) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from 0 to 2**63 - 1, got {seed!r}")


def check_sampling(sampling) -> SamplingParams:
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams (sd.SamplingParams(temperature=...)), got "
                        f"{type(sampling).__name__}")
    return sampling


def model_or_advice(model, role: str):
    """``model`` as given, unless it is a name: then the error says how to load it."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        loader = "sd.load_model(name)" if role == "target" else "sd.load_draft(name, target)"
        raise TypeError(f"{role} is the name {model!r}, not a loaded model: load it first with {loader}")
    if model is None:
        raise TypeError(f"{role} is None: give a model loaded with sd.load_model"
                        + ("" if role == "target" else ", a Drafter or sd.load_draft(name, target)"))
    return model


def check_numbers(name: str, values, minimum: int) -> list[int]:
    """``values`` (an integer, or a list of them) as a list of integers >= ``minimum``."""
    listed = list(values) if isinstance(values, (list, tuple)) else [values]
    if not listed or not all(is_integer(n) and n >= minimum for n in listed):
        raise ValueError(f"{name} must be an integer >= {minimum} (or a list of them, one per row), got {values!r}")
    return [int(n) for n in listed]


def as_token_tensor(input_ids) -> torch.Tensor:
    """input_ids as a tensor: a tensor, a list of ids, or a list of equally long rows (tensors or lists)."""
    if isinstance(input_ids, Mapping):
        raise TypeError("input_ids is a dict (the tokenizer's whole output): pass input_ids=enc['input_ids'] and "
                        "attention_mask=enc['attention_mask']")
    if isinstance(input_ids, str):
        raise TypeError("input_ids is a string: tokenize it first (tokenizer(text, return_tensors='pt').input_ids, "
                        "or tokenizer.apply_chat_template(...))")
    if isinstance(input_ids, (list, tuple)) and input_ids and not all(is_integer(i) for i in input_ids):
        rows = [torch.as_tensor(row) if not torch.is_tensor(row) else row for row in input_ids]
        if any(row.dim() != 1 for row in rows):
            raise ValueError(f"input_ids rows must be 1-D sequences of token ids, got shapes "
                             f"{[tuple(row.shape) for row in rows]}")
        lengths = [len(row) for row in rows]
        if len(set(lengths)) > 1:
            raise ValueError(f"input_ids rows have different lengths {lengths}: pad them on the left and pass the "
                             "mask (tokenizer(texts, padding=True, padding_side='left', return_tensors='pt') gives "
                             "input_ids and attention_mask)")
        return torch.stack(rows)
    try:
        return torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"input_ids must be token ids (a LongTensor (T,) or (B, T), or a list of ints), got "
                        f"{type(input_ids).__name__} ({err})") from None


def check_request(input_ids, max_length, gamma: int, max_new_tokens: int | list, sampling,
                  context_name: str = "the model's context") -> torch.Tensor:
    """The prompt, gamma, max_new_tokens and sampling, and whether they fit the context. Returns input_ids as
    (B, T) long. ``max_new_tokens``: an integer, or a list of them, each row's own (a server's batch of requests)."""
    check_sampling(sampling)
    if not is_integer(gamma) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per round) must be an integer >= 1, got {gamma!r}")
    limits = check_numbers("max_new_tokens", max_new_tokens, 1)
    input_ids = as_token_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids is empty or not (T,) / (B, T) (shape {tuple(input_ids.shape)}); give at least "
                         "one prompt token, e.g. the tokenizer's BOS token")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if isinstance(max_new_tokens, (list, tuple)) and len(limits) != input_ids.shape[0]:
        raise ValueError(f"max_new_tokens gives {len(limits)} limits for {input_ids.shape[0]} rows: give one per row")
    longest = max(limits)  # the context must hold the longest row
    if max_length is not None:
        T = input_ids.shape[1]
        if T >= max_length:
            raise ValueError(f"the input has {T} tokens but {context_name} is {max_length}; shorten the prompt")
        if T + longest + gamma > max_length:
            raise ValueError(f"{T} prompt tokens + max_new_tokens {longest} + gamma {gamma} exceed "
                             f"{context_name} ({max_length}); lower max_new_tokens to at most "
                             f"{max_length - T - gamma}, or preallocate more (use_static_cache(model, max_length=...))")
    return input_ids.long()


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Every id inside the target's vocabulary (an id outside it would index past the embedding)."""
    low, high = torch.stack([input_ids.min(), input_ids.max()]).tolist()  # one read
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids holds the token id {bad}, outside the target's vocabulary (0 to "
                         f"{vocab_size - 1}): tokenize with the target's own tokenizer")


def end_tokens(target, eos_token_id=None, ignore_eos: bool = False) -> list[int]:
    """The token ids that end a row of a run on ``target``: ``eos_token_id`` when given (an id or a list of ids);
    else the target's own end-of-sequence token(s), where transformers' ``generate`` reads them
    (``generation_config.eos_token_id``, an id or a list); none for a model without a generation config (the toy
    models) or with ``ignore_eos=True`` (every run then makes exactly max_new_tokens tokens: timing, fixed-length
    statistics)."""
    if ignore_eos:
        if eos_token_id is not None:
            raise ValueError(f"eos_token_id={eos_token_id!r} and ignore_eos=True contradict each other: give "
                             "eos_token_id to stop at those tokens, or ignore_eos=True to run to max_new_tokens")
        return []
    given = eos_token_id is not None
    if not given:
        eos_token_id = getattr(getattr(hf_model_of(target), "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return []
    ids = eos_token_id.tolist() if torch.is_tensor(eos_token_id) else eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else [ids]
    if given and not all(is_integer(e) and e >= 0 for e in ids):
        raise ValueError(f"eos_token_id must be a token id or a list of them (integers >= 0), got {eos_token_id!r}")
    return [int(e) for e in ids]


# ---------------------------------------------------------------- padding and batches
def check_padding(input_ids: torch.Tensor, attention_mask, target,
                  sampling: SamplingParams) -> tuple[torch.Tensor, list[int] | None]:
    """A left-padded batch comes with its ``attention_mask`` (B, T) of 0 (pad) and 1 (token), as transformers'
    ``generate`` takes it. Refuses a mask that cannot be one (its shape, its values, padding on the right, a row
    without tokens), a batch that looks padded but has no mask (``check_unmasked_padding``), and padding with a
    repetition penalty (the pads would count as tokens the row has seen). Returns input_ids without the columns
    that are padding in every row, and each row's count of left pads (None: no row has any), as Python ints."""
    if attention_mask is None:
        check_unmasked_padding(input_ids, target)
        return input_ids, None
    try:
        mask = torch.as_tensor(attention_mask)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"attention_mask must be a tensor (B, T) of 0 and 1 (what the tokenizer returned), got "
                        f"{type(attention_mask).__name__}") from None
    mask = mask[None, :] if mask.dim() == 1 else mask
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(input_ids.shape)}: pass "
                         "the attention_mask the tokenizer returned with these input_ids")
    rows = mask.tolist()  # read once, before any work
    for b, row in enumerate(rows):
        if any(value not in (0, 1) for value in row):
            raise ValueError(f"attention_mask must hold 0 (padding) and 1 (token) only, row {b} holds "
                             f"{sorted(set(row) - {0, 1})}: pass the tokenizer's attention_mask")
        if 1 not in row:
            raise ValueError(f"row {b} of attention_mask is all zeros: every prompt needs at least one token")
        if 0 in row[row.index(1):]:
            raise ValueError(f"row {b} of attention_mask has padding after its tokens: pad on the left, as for "
                             "generate (tokenizer(..., padding_side='left'), or tokenizer.padding_side = 'left')")
    pads = [row.index(1) for row in rows]
    common = min(pads)
    pads = [pad - common for pad in pads]
    if any(pads) and sampling.repetition_penalty != 1.0:
        raise NotImplementedError("repetition_penalty with left-padded rows is not implemented (the pads would count "
                                  "as tokens the row has seen): batch prompts of equal length, run them one at a "
                                  "time, or use repetition_penalty=1.0")
    return input_ids[:, common:], (pads if any(pads) else None)


def check_unmasked_padding(input_ids: torch.Tensor, target) -> None:
    """Refuse a batch without a mask that looks padded with the target's pad token (its tokenizer's, or its
    generation config's): a row that ends with it (right padding, the tokenizer's default side), or rows that start
    with different numbers of it (left padding). Its pads would be read as prompt tokens. A batch whose rows really
    end with that token passes with an all-ones mask."""
    pad = pad_token_of(target)
    if input_ids.shape[0] < 2 or pad is None:
        return
    rows = input_ids.tolist()
    right = [b for b, row in enumerate(rows) if row[-1] == pad]
    leading = [next((i for i, token in enumerate(row) if token != pad), len(row)) for row in rows]
    if right or len(set(leading)) > 1:
        side = f"rows {right} end with" if right else f"rows start with {leading} copies of"
        raise ValueError(f"{side} the pad token {pad} and no attention_mask was given: this batch looks padded, and "
                         "its pads would be read as prompt tokens. Pad on the left and pass the mask: "
                         "tokenizer(texts, padding=True, padding_side='left', return_tensors='pt') gives input_ids "
                         "and attention_mask (as for generate)")


def pad_token_of(target) -> int | None:
    """The target's pad token: its registered tokenizer's, else its generation config's (None: unknown)."""
    model = hf_model_of(target)
    pad = getattr(tokenizer_of(model), "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    return pad if isinstance(pad, int) else None


def hf_model_of(target):
    """The Hugging Face model behind ``target`` (itself, or a wrapper's ``model``), or None (the toy models)."""
    return target if isinstance(target, torch.nn.Module) else getattr(target, "model", None)


def context_limit(*lms) -> tuple[int | None, str]:
    """The tightest context among the models (and static caches) of a run, and how to name it."""
    limits = [(lm.max_length, lm.context_name) for lm in lms if lm is not None and lm.max_length is not None]
    return min(limits, key=lambda item: item[0]) if limits else (None, "the model's context")


def check_batch(input_ids, padding: list[int] | None, *lms) -> None:
    """Rows of a batch accept different numbers of drafts and end at different times: a batch needs wrappers whose
    rows may hold different numbers of tokens (``ragged_batches``: the toy models, Hugging Face models on the
    dynamic cache), and left padding needs wrappers that take it (``takes_padding``)."""
    B = input_ids.shape[0]
    for lm in (lm for lm in lms if lm is not None):
        if B > 1 and not lm.ragged_batches:
            if isinstance(lm, HFCausalLM) and lm.static is not None:
                raise NotImplementedError(
                    f"a batch of {B} prompts needs the dynamic cache (the static cache runs one prompt at a time): "
                    "load the model with load_model(..., cache='dynamic') or call use_dynamic_cache(model)")
            raise NotImplementedError(f"a batch of {B} prompts needs per-row cache lengths, which "
                                      f"{type(lm).__name__} does not keep: run it with batch size 1")
        if padding is not None and not lm.takes_padding:
            raise NotImplementedError(f"{type(lm).__name__} takes no left padding: give it prompts of equal length "
                                      "(no padded rows in attention_mask)")


def check_batched_drafter(drafter: Drafter, input_ids) -> None:
    """Token trees draft for one prompt (a tree's forward, mask and walk are batch 1). Chain drafts take batches,
    feature-level ones included: ``EagleDraft`` and ``MedusaDraft`` keep each row's features, and the EAGLE head
    each row's entries under a key mask (``heads.py``)."""
    if input_ids.shape[0] > 1 and drafter.proposes_trees:
        raise NotImplementedError(
            f"{type(drafter).__name__} proposes token trees and drafts for one prompt at a time, got a batch of "
            f"{input_ids.shape[0]}: run it with batch size 1, or batch with a chain draft (a draft model, "
            "NGramDraft, LayerSkipDraft, an EAGLE or Medusa head)")


def batch_refusal(target, draft=None, sampling: SamplingParams = SamplingParams()) -> str | None:
    """Why ``target`` with ``draft`` (None: plain decoding) cannot decode a left-padded batch of prompts at
    ``sampling``, as the loop's checks would refuse it (``check_batch``, ``check_batched_drafter``); None where it
    can. A server asks before it gathers requests into a batch."""
    two = torch.zeros((2, 1), dtype=torch.long)
    target_lm = as_language_model(target)
    try:
        if draft is None:
            check_batch(two, [1, 0], target_lm)
        else:
            drafter = as_drafter(draft, target).at(sampling)
            check_batch(two, [1, 0], target_lm, getattr(drafter, "lm", None))
            check_batched_drafter(drafter, two)
    except NotImplementedError as err:
        return str(err)
    return None


def check_pair(target, target_lm, drafter: Drafter, input_ids, sampling: SamplingParams,
               padding: list[int] | None = None) -> None:
    """What a draft and a target must have in common, what a batch needs, and what token trees need; each refusal
    says what to do."""
    draft_lm = getattr(drafter, "lm", None)
    check_batch(input_ids, padding, target_lm, draft_lm)
    check_batched_drafter(drafter, input_ids)
    if drafter.vocab_size is not None and drafter.vocab_size != target_lm.vocab_size:
        raise ValueError(
            f"the draft's vocabulary ({drafter.vocab_size} tokens) cannot be aligned with the target's "
            f"({target_lm.vocab_size}); use a draft trained with the target's tokenizer")
    if draft_lm is not None and draft_lm.device != target_lm.device:
        raise ValueError(f"the draft is on {draft_lm.device} but the target takes its input on {target_lm.device}; "
                         f"move the draft there first (draft.to({str(target_lm.device)!r}))")
    if drafter.uses_target_features and not target_lm.supports_hidden:
        raise TypeError(f"{type(drafter).__name__} reads the target's hidden states, which "
                        f"{type(target_lm).__name__} does not provide; use a Hugging Face target")
    if drafter.proposes_trees:
        check_tree_request(target_lm, sampling)
    draft_model = getattr(draft_lm, "model", None)  # tokenizers registered by load_model must be the same
    t_tok = tokenizer_of(target) if isinstance(target, torch.nn.Module) else None
    d_tok = tokenizer_of(draft_model) if isinstance(draft_model, torch.nn.Module) else None
    if t_tok is not None and d_tok is not None:
        check_tokenizers(t_tok, d_tok)


def check_tree_request(target_lm, sampling: SamplingParams) -> None:
    """Token trees run at batch 1 (``check_batched_drafter``), without the repetition penalty (its per-node
    prefixes are not implemented)."""
    if sampling.repetition_penalty != 1.0:
        raise NotImplementedError("token trees do not support repetition_penalty; use a chain draft or penalty 1.0")
    if not target_lm.supports_trees:
        raise TypeError(f"{type(target_lm).__name__} cannot score a token tree (it does not declare supports_trees)")
