"""specdec_lite: speculative decoding, small enough to read, exact enough to trust.

Notation (Leviathan et al. 2023), never inverted anywhere in this package:
  p      the TARGET model's next-token distribution
  q      the DRAFT's next-token distribution
  gamma  draft tokens proposed per round
  alpha  expected per-token acceptance, E[sum_x min(p(x), q(x))] = 1 - E[TV(p, q)]
  c      cost of one draft step / cost of one target step
  v      cost of the target's forward over gamma+1 tokens / cost of one decode step
An "accepted length" counts the tokens a round emits including the corrected or bonus token (so it is >= 1).
Some of the source articles (docs/SOURCES.md) swap p and q; this code never does. The claims the
reproduction checks are listed in docs/CLAIMS.md, the measurements in docs/RESULTS.md.

Layout (each layer imports only the ones above it):
  paths     where shipped data, results and caches live
  names     what a model name points to (the embedded target, shipped drafts, folders, hub ids)
  tokenizers  whether two tokenizers are interchangeable; chat templating
  tuning    what a model may get at load: compiled forwards, packed linear layers, batch invariance, devices and
            dtypes, the memory check
  core      sampling, the verifier, the model-wrapper protocol, the drafter protocol, the loop, model loading
  requests  every check of a request, before any work;  generate  the entry points: check, then run the loop
  instruments  timing, kept cost profiles, counting host reads: what measures a run
  drafts    draft kinds: n-gram (prompt lookup), layer skip, feature-level heads, token trees and adaptive
            length; loading a draft by name (load_draft("auto", target): the recommended drafting)
  repro     the reproduction: toy models, exact enumeration, statistics, theory, tasks, evaluation, claims
  train     target-made text, features, the training loop for the draft and the heads, model cards
  sweep     (top) the notebooks for several model pairs;  serve  (top) an OpenAI-compatible server over the loop
"""
from .generate import autoregressive_generate, speculative_generate
from .core.stats import Generation, GenerationStats
from .core.drafter import Drafter, ModelDraft
from .core.lm import HFCausalLM
from .tokenizers import register_tokenizer
from .names import EMBEDDED_DRAFT, EMBEDDED_TARGET
from .core.models import load_model
from .core.sampling import SamplingParams
from .tokenizers import check_tokenizers
from .core.verify import verify, verify_greedy
from .drafts.heads import EagleDraft, MedusaDraft, load_head
from .drafts.layer_skip import LayerSkipDraft
from .drafts.loading import calibrate, load_draft, load_pair
from .drafts.ngram import NGramDraft
from .drafts.trees import AdaptiveLength, EagleTreeDraft, HybridTreeDraft, LookupTreeDraft, SampledTreeDraft



def __getattr__(name: str):
    """``theory`` and ``MarkovLM`` live in the reproduction (``repro``), loaded on first use: ``import
    specdec_lite`` loads the loop, not the reproduction."""
    if name == "theory":
        from .repro import theory
        return theory
    if name == "MarkovLM":
        from .repro.toy import MarkovLM
        return MarkovLM
    raise AttributeError(f"module 'specdec_lite' has no attribute {name!r}")


__all__ = [
    "SamplingParams", "verify", "verify_greedy", "load_model", "speculative_generate", "autoregressive_generate",
    "Generation", "GenerationStats", "theory", "Drafter", "ModelDraft", "NGramDraft", "LayerSkipDraft",
    "HFCausalLM", "MarkovLM", "register_tokenizer", "check_tokenizers", "EMBEDDED_TARGET", "EMBEDDED_DRAFT",
    "load_pair", "load_draft", "load_head", "EagleDraft", "MedusaDraft", "AdaptiveLength", "EagleTreeDraft",
    "HybridTreeDraft", "LookupTreeDraft", "SampledTreeDraft", "calibrate",
]
