"""specdec_lite: speculative decoding, small enough to read, exact enough to trust.

Notation (Leviathan et al. 2023), never inverted anywhere in this package:
  p      the TARGET model's next-token distribution
  q      the DRAFT's next-token distribution
  gamma  draft tokens proposed per round
  alpha  expected per-token acceptance, E[sum_x min(p(x), q(x))] = 1 - E[TV(p, q)]
  c      cost of one draft step / cost of one target step
  v      cost of the target's forward over gamma+1 tokens / cost of one decode step
An "accepted length" counts the tokens a round emits including the corrected or bonus token (so it is >= 1).
Some source articles (see ../shared/seeds) swap p and q; this code never does.
"""
from . import theory
from .decode import Generation, GenerationStats, autoregressive_generate, speculative_generate
from .drafts import Drafter, LayerSkipDraft, ModelDraft, NGramDraft
from .lm import HFCausalLM, register_tokenizer
from .heads import EagleDraft, MedusaDraft, load_head
from .models import EMBEDDED_DRAFT, EMBEDDED_TARGET, check_tokenizers, load_draft, load_model, load_pair
from .sampling import SamplingParams
from .toy import MarkovLM
from .verify import verify, verify_greedy

__all__ = [
    "SamplingParams", "verify", "verify_greedy", "load_model", "speculative_generate", "autoregressive_generate",
    "Generation", "GenerationStats", "theory", "Drafter", "ModelDraft", "NGramDraft", "LayerSkipDraft",
    "HFCausalLM", "MarkovLM", "register_tokenizer", "check_tokenizers", "EMBEDDED_TARGET", "EMBEDDED_DRAFT",
    "load_pair", "load_draft", "load_head", "EagleDraft", "MedusaDraft",
]
