"""The two entry points: ``speculative_generate`` and its baseline ``autoregressive_generate``. Each checks the
request in one place (``requests.py``), before any work, then runs the loop (``core/decode.py``) on what the checks
return."""
from __future__ import annotations

from typing import Callable

from .core.decode import EXACT, Verifier, run_plain, run_speculative
from .core.sampling import SamplingParams
from .core.stats import Generation
from .requests import check_generation


def speculative_generate(target, draft, input_ids, *, attention_mask=None, gamma: int = 4,
                         max_new_tokens: int = 128, sampling: SamplingParams = SamplingParams(), seed: int = 0,
                         eos_token_id=None, ignore_eos: bool = False, timed: bool = True, verifier: Verifier = EXACT,
                         on_round: Callable[[list], None] | None = None) -> Generation:
    """Speculative decoding: ``draft`` proposes gamma tokens, ``target`` verifies them in one forward.

    target: a Hugging Face causal LM or a toy model; draft: a Hugging Face causal LM with the target's tokenizer, a
    toy model, or a Drafter (``NGramDraft``, ``LayerSkipDraft``, a head, a tree drafter). input_ids: (T,) or (B, T).
    A batch of prompts of different lengths comes left-padded with its ``attention_mask`` (B, T), as transformers'
    ``generate`` takes it (``requests.check_padding``); each row is decoded as it would be alone. Batches run on
    Hugging Face models on the dynamic cache (``core/lm.py``: masked slots) and on the toy models, with every chain
    draft, the EAGLE and Medusa heads included (each row's features and head entries are its own, ``drafts/heads.py``);
    token trees and the static cache run one prompt at a time (``requests.check_pair``). With ``sampling.temperature
    == 0`` each row's output is the target's own greedy output, token for token (bitwise where the target's forwards
    are batch-invariant, see ``load_model``; a batch's forwards may round differently from a lone prompt's, so a
    near-tie of the argmax can part a row from it). A row ends at max_new_tokens (an integer, or a list: each row's
    own) or just after an end-of-sequence token: by default the target's own (its generation config's
    ``eos_token_id``, as transformers' ``generate``; none for the toy models), else ``eos_token_id`` (an id or a
    list); ``ignore_eos=True`` runs every row to max_new_tokens (equal work for timing). ``timed=False`` skips the per-round
    device synchronization (the stats' per-phase seconds then mean little on a GPU). ``verifier`` is the exact
    one unless a test hands in a broken one. ``on_round``, when given, is called after every round with each
    row's new tokens so far (``Decoding.emitted``): what a server streams as the rounds finish; when it returns True
    the run ends there, returning what it made so far (a server whose clients have all gone).
    """
    request = check_generation(target, draft, input_ids, attention_mask=attention_mask, gamma=gamma,
                               max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, eos_token_id=eos_token_id,
                               ignore_eos=ignore_eos, timed=timed, on_round=on_round, verifier=verifier)
    return run_speculative(request, gamma, max_new_tokens, sampling, seed, timed, verifier, on_round)


def autoregressive_generate(target, input_ids, *, attention_mask=None, max_new_tokens: int = 128,
                            sampling: SamplingParams = SamplingParams(), seed: int = 0,
                            eos_token_id=None, ignore_eos: bool = False, timed: bool = True,
                            on_round: Callable[[list], None] | None = None) -> Generation:
    """The baseline: one target forward per token, through the same wrapper, sampling rule and generator;
    ``attention_mask`` (a left-padded batch), ``eos_token_id``, ``ignore_eos`` and ``on_round`` as in
    ``speculative_generate`` (``on_round`` is called after every token, and ends the run when it returns True)."""
    request = check_generation(target, None, input_ids, attention_mask=attention_mask, gamma=1,
                               max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, eos_token_id=eos_token_id,
                               ignore_eos=ignore_eos, timed=timed, on_round=on_round, plain=True)
    return run_plain(request, max_new_tokens, sampling, seed, timed, on_round)
