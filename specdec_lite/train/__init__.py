"""Training the drafts the package ships (not needed to run the loop).

  corpus     text written by the target itself, stored compactly and appended to
  restore    the shipped training text, written into the cache from the repository's history
  features   the target's last hidden states over that text, by teacher forcing
  batching   padded batches for teacher forcing and training; the most frequent reply tokens
  draft      the standalone draft model, distilled from the target's top-k soft labels
  heads      the EAGLE-style head and the Medusa heads, trained on the features
  continued  the shipped EAGLE head continued on more of the target's replies
  gpu_train  that run on one GPU, prepared here: the training text packed to carry, one command there
  eagle3     the EAGLE-3-style head, trained unrolled on its own predictions
  refill     batched sampling whose rows take the next prompt as soon as their reply ends
  sources    training prompts harvested from the files installed on the machine
  self_prompts  requests the target writes itself, for prompts that read like the evaluation's
  teacher    installed text, tokenized, for teacher forcing
  loop       the training loop both use (schedule, clipping, held-out split and evaluation, checkpoints,
             time budget, resume)
  cards      the model card (README.md) written beside each trained draft
"""
