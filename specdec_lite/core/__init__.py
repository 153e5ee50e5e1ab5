"""The thin core: everything the speculative loop needs, and nothing else.

  sampling    logits -> p or q under one SamplingParams (temperature, top-k, top-p, repetition penalty)
  verify      exact rejection sampling and greedy verification, pure functions
  tree        token trees: the tree, its attention mask and positions, tree verification, cache compaction
  lm          the model-wrapper protocol (feed / crop / cache_lengths) and the Hugging Face wrapper
  drafter     the drafter protocol (begin / propose / observe / rollback) and the independent draft model
  tokenizers  refusing a draft whose tokenizer differs from the target's; chat templating (``chat_ids``)
  requests    what a generation refuses before any work: every argument checked in one place
  decode      the loop, top to bottom, and the autoregressive baseline
  host_reads  counting the reads of tensor values into Python (each one a wait on a GPU)
  models      loading a model by package name, Hugging Face id or local path; the "auto" dtype
  batch_invariance  batch-invariant layers (bfloat16 on the CPU keeps greedy identity)
  timing      wall-clock costs on this machine: a forward over n new tokens, v(n)
  cost_profiles  measured costs kept per machine and setting (JSON in the cache), read back by later loads
  memory      will a model and its cache fit
  packed_linear  linear layers on oneDNN-packed weights, float32 and bfloat16 (cheaper forwards on CPUs)
"""
