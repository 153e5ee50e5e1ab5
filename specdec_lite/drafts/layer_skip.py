"""Self-speculation: the target's own layers, a subset of them, as the draft (no extra weights)."""
from __future__ import annotations

import copy

import torch

from ..core.lm import HFCausalLM, as_language_model, static_state, use_static_cache
from ..core.drafter import ModelDraft


def shallow_copy_module(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object that shares every parameter and submodule with ``module``."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def layer_subset_model(target: torch.nn.Module, layers: list[int]) -> torch.nn.Module:
    """The target run through a subset of its decoder layers (then its final norm and head), sharing all
    weights: no extra parameters. Works for Llama-style models (``model.model.layers``)."""
    inner = getattr(target, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise NotImplementedError(f"layer skipping needs a Llama-style model with .model.layers; "
                                  f"{type(target).__name__} has none")
    n_layers = len(inner.layers)
    if not layers or any(not 0 <= i < n_layers for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"layers must be distinct indices in 0..{n_layers - 1}, got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    new_layers = []
    for new_index, old_index in enumerate(layers):
        layer = shallow_copy_module(inner.layers[old_index])
        attn = shallow_copy_module(layer.self_attn)
        attn.layer_idx = new_index  # its slot in the draft's own cache
        layer._modules["self_attn"] = attn
        new_layers.append(layer)
    new_inner = shallow_copy_module(inner)
    new_inner._modules["layers"] = torch.nn.ModuleList(new_layers)
    new_inner.config = config
    model = shallow_copy_module(target)
    model._modules["model"] = new_inner
    model.config = config
    return model


class LayerSkipDraft(ModelDraft):
    """Self-speculation: the target's own layers, a subset of them, with their own KV cache.

    ``exit_layer=k`` keeps layers 0..k-1 (early exit); ``layers=[...]`` keeps any subset; by default the middle
    third is skipped. The final norm and output layer are the target's.
    """

    def __init__(self, target: torch.nn.Module, layers: list[int] | None = None, exit_layer: int | None = None):
        n = target.config.get_text_config(decoder=True).num_hidden_layers
        if layers is not None and exit_layer is not None:
            raise ValueError("give either layers or exit_layer, not both")
        if exit_layer is not None:
            if not 1 <= exit_layer <= n:
                raise ValueError(f"exit_layer must be in 1..{n}, got {exit_layer}")
            layers = list(range(exit_layer))
        if layers is None:
            layers = [i for i in range(n) if not n // 3 <= i < 2 * n // 3]
        self.layers = list(layers)
        target_lm = as_language_model(target)
        subset = layer_subset_model(target, self.layers)
        state = static_state(target)
        if state is not None:  # a target on the static path gets a draft on it too
            use_static_cache(subset, max_length=state.max_length, compile=state.compile)
        super().__init__(HFCausalLM(subset, vocab_size=target_lm.vocab_size, role="draft"))
