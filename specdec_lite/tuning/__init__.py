"""Tuning a model may get when it loads (``core.models`` applies it; a drafting head gets ``int8_head``; nothing
here imports ``core``).

  packed_linear     linear layers on oneDNN-packed weights, float32 and bfloat16 (cheaper eager forwards on CPUs)
  batch_invariance  batch-invariant layers (a position's logits independent of the forward's width)
  memory            will a model and its cache fit, before it loads
  compiled          the compiled forward of the static cache (inductor with freezing on a CPU, CUDA graphs on a GPU)
  devices           which device "auto" means, which dtype decodes fastest there, refusing what cannot run
  int4              linear layers on the 4-bit blocks a GGUF stores (torch's CPU 4-bit kernel)
  int8_head         a drafting head's linear layers on 8-bit weights (a cheaper drafting depth on CPUs)
"""
