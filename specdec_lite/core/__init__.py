"""The thin core: everything the speculative loop needs, and nothing else.

  sampling    logits -> p or q under one SamplingParams (temperature, top-k, top-p, repetition penalty)
  verify      exact rejection sampling and greedy verification, pure functions
  tree        token trees: the tree, its attention mask and positions, tree verification, cache compaction
  slots       the slot rule of caches whose rows roll back by different counts (the target's, the heads')
  lm          the model-wrapper protocol (LanguageModel: reset / feed / crop / cache_lengths, and what a wrapper
              declares it can do) and the Hugging Face wrapper
  compiled    the compiled forward of the static cache (inductor with freezing on a CPU, CUDA graphs on a GPU)
  drafter     the drafter protocol (begin / propose / observe / rollback) and the independent draft model
  tokenizers  refusing a draft whose tokenizer differs from the target's; chat templating (``chat_ids``)
  requests    what a generation refuses before any work: every argument checked in one place
  decode      the loop, top to bottom, and the autoregressive baseline
  stats       what a run returns (tokens, statistics) and the clock of its phases
  models      loading a model by package name, Hugging Face id or local path; the "auto" dtype

CPU tuning applied at load lives in ``specdec_lite.tuning``, the instruments that time and count a run in
``specdec_lite.instruments``.
"""
