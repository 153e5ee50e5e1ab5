"""Instruments that measure a run on this machine (they read ``core``; the drafts and the reproduction use them).

  timing         wall-clock costs on this machine: a forward over n new tokens, v(n)
  cost_profiles  measured costs kept per machine and setting (JSON in the cache), read back by later loads
  host_reads     counting the reads of tensor values into Python (each one a wait on a GPU)
"""
