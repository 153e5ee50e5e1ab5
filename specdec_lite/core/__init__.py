"""The thin core: everything the speculative loop needs, and nothing else.

  sampling    logits -> p or q under one SamplingParams (temperature, top-k, top-p, repetition penalty)
  verify      exact rejection sampling and greedy verification, pure functions
  tree        token trees: the tree, its attention mask and positions, tree verification, cache compaction
  slots       the slot rule of caches whose rows roll back by different counts (the target's, the heads')
  lm          the model-wrapper protocol (LanguageModel: reset / feed / crop / cache_lengths, and what a wrapper
              declares it can do) and the Hugging Face wrapper
  drafter     the drafter protocol (begin / propose / observe / rollback) and the independent draft model
  decode      the loop, top to bottom, and the autoregressive baseline, over a checked request
  stats       what a run returns (tokens, statistics) and the clock of its phases
  models      loading a model, with the tuning it may get

Below the core: what a model name points to (``names``), tokenizer checks and chat templating (``tokenizers``), and
what a model may get at load (``tuning``: compiled forwards, packed layers, devices and dtypes). Above it: the
request checks (``requests``), the entry points that check a request and run the loop (``generate``), and the
instruments that time and count a run (``instruments``).
"""
