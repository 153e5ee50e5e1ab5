"""Draft kinds beyond an independent draft model (which lives in ``core.drafter``).

  ngram        prompt lookup: a point-mass draft, no model
  layer_skip   the target's own layers, a subset of them (self-speculation)
  heads        feature-level drafts on the target's hidden states: an EAGLE-style head and Medusa heads
  trees        adaptive draft length, token-tree drafts (lookup, EAGLE head, hybrid), SpecInfer sampled trees
  pacing       drafting that rests while the cost model says it does not pay ("auto" runs paced)
  fingerprint  which target a head was trained on
  loading      any draft kind by name; a (target, draft, tokenizer) pair in one call; calibrating "auto"
  calibrate    python -m specdec_lite.drafts.calibrate: this machine's dynamic-tree costs, kept
"""
