"""The reproduction of the source articles' claims: what the notebooks call.

  toy, exact, stats, mutants     toy models, exact laws by enumeration, statistical tests, broken verifiers
  articles                       the articles' own listings, rerun as published
  unbiased                       the losslessness experiments (notebook 01)
  theory, speedup_tables, costs  expected tokens, speedup, optimal gamma, break-even; the tables of notebook 02;
                                 measured verification cost v(gamma) and draft cost c
  tasks, evaluate                evaluation prompts and chat templating; side-by-side runs and their summaries
  baseline                       the fastest plain decoding in the same run: what every speedup is over
  batching                       throughput against batch size: plain batched decoding against each drafting (C15)
  bench, demo                    a timing harness against transformers, a short demonstration
  llama_cpp                      llama.cpp's plain decoding of the embedded GGUF, timed beside ours (bench)
  gpu_bench                      the GPU check's benchmark: real model shapes, eager against compiled
  endpoints                      OpenAI-compatible servers benchmarked side by side, and servers in subprocesses
  greedy_load                    greedy answers and throughput of the plain server under load, per configuration
  checks, claims, report         each claim's tolerance check, claim rows and verdicts, the results document
  notebook                       the notebooks' shared set-up
  figures                        every figure the notebooks and scripts save, drawn to be read at its size
"""
