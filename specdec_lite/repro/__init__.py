"""The reproduction of the source articles' claims: what the notebooks call.

  toy, exact, stats, mutants   toy models, exact laws by enumeration, statistical tests, broken verifiers
  articles                     the articles' own listings, rerun as published
  theory                       expected tokens per round, speedup, optimal gamma, break-even points
  tasks                        evaluation prompts and chat templating
  evaluate, bench, demo        side-by-side runs against the baseline, a timing harness, a demonstration
  claims, report               claim rows and verdicts, tables and the results document
"""
