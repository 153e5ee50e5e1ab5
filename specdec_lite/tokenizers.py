"""Tokenizers: which one a model uses (registered on the model), whether a draft's maps text to the same ids as the
target's (else q(x)/p(x) would compare different tokens), chat templating, and token lists padded into a batch."""
from __future__ import annotations

import functools
import hashlib
import json

import torch

# the tokenizer of a Hugging Face model is kept on the model itself (read by the compatibility checks)
TOKENIZER_ATTRIBUTE = "specdec_tokenizer"


@functools.lru_cache(maxsize=16)
def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the token -> id map and the special tokens: equal fingerprints mean interchangeable ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())
    return hashlib.sha256(json.dumps([vocab, special]).encode()).hexdigest()[:16]


def check_tokenizers(target_tokenizer, draft_tokenizer) -> None:
    """Refuse a pair whose tokenizers map text to different ids: q(x)/p(x) would compare different tokens."""
    if target_tokenizer is draft_tokenizer or \
            tokenizer_fingerprint(target_tokenizer) == tokenizer_fingerprint(draft_tokenizer):
        return
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        differing = len(set(t_vocab.items()) ^ set(d_vocab.items()))
        raise ValueError(
            f"the draft's tokenizer differs from the target's ({len(d_vocab)} vs {len(t_vocab)} tokens, "
            f"{differing} token/id pairs differ): speculative decoding needs a draft that shares the target's "
            "tokenizer; pick a draft from the same model family or train one with the target's tokenizer")
    raise ValueError("the draft's tokenizer has different special tokens from the target's; use the target's "
                     "tokenizer for both")


def chat_ids(tokenizer, text: str | list, device="cpu"):
    """(1, T) token ids of ``text`` as a user turn (or of a list of chat messages, ``{"role", "content"}``) with
    the tokenizer's chat template and the assistant prefix; for tokenizers without a chat template, plain
    tokenization (of the messages' contents, one per line). The notebooks, the scripts and the server all format
    prompts here."""
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
    else:
        ids = tokenizer("\n".join(m["content"] for m in messages), return_tensors="pt")["input_ids"]
    return ids.to(device)


def register_tokenizer(model: torch.nn.Module, tokenizer) -> None:
    """Tell specdec_lite which tokenizer a Hugging Face model uses (``load_model`` does this for you); it is kept
    on the model as ``model.specdec_tokenizer``."""
    setattr(model, TOKENIZER_ATTRIBUTE, tokenizer)


def tokenizer_of(model):
    """The tokenizer registered for ``model``, or None."""
    return getattr(model, TOKENIZER_ATTRIBUTE, None)


def padded(token_lists, pad_id: int = 0, left: bool = False):
    """(B, L) ids and their attention mask for a list of 1-D token sequences (tensors or lists), right-padded
    (teacher forcing, training), or with ``left`` left-padded (every sequence ends in the last column: prompts that
    decode together, as ``speculative_generate`` takes them with their ``attention_mask``)."""
    L = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(token_lists), L, dtype=torch.long)
    for r, tokens in enumerate(token_lists):
        span = slice(L - len(tokens), L) if left else slice(0, len(tokens))
        ids[r, span], mask[r, span] = torch.as_tensor(tokens), 1
    return ids, mask
