"""A short demonstration on the embedded target: ``python -m specdec_lite.repro.demo``.

Prints one speculative generation per draft kind that needs no training (n-gram prompt lookup, layer skip),
its statistics, and checks it against the autoregressive baseline (greedy: identical tokens).
"""
from __future__ import annotations

import argparse

import torch

from ..generate import autoregressive_generate, speculative_generate
from ..tuning.devices import DTYPE_HELP
from ..names import EMBEDDED_TARGET
from ..core.models import load_model
from ..core.sampling import SamplingParams
from ..drafts.layer_skip import LayerSkipDraft
from ..drafts.ngram import NGramDraft
from .tasks import chat_ids

PROMPT = "Rewrite this list in alphabetical order, one per line: pear, apple, mango, cherry, banana, kiwi."


def main(max_new_tokens: int = 64, gamma: int = 4, dtype: str = "auto") -> None:
    model, tokenizer = load_model(EMBEDDED_TARGET, dtype=dtype)
    x = chat_ids(tokenizer, PROMPT, model.device)
    greedy = SamplingParams(temperature=0)
    base = autoregressive_generate(model, x, max_new_tokens=max_new_tokens, sampling=greedy)  # to the model's EOS
    print(f"prompt: {PROMPT}\n\nautoregressive ({base.stats.tokens_per_second:.1f} tokens/s):\n"
          f"{tokenizer.decode(base.tokens)}\n")
    for name, draft in [("n-gram prompt lookup", NGramDraft()), ("layer skip (first 20 layers)",
                                                                  LayerSkipDraft(model, exit_layer=20))]:
        for sampling in (greedy, SamplingParams(temperature=1.0)):
            gen = speculative_generate(model, draft, x, gamma=gamma, max_new_tokens=max_new_tokens,
                                       sampling=sampling, seed=0)
            s = gen.stats
            same = torch.equal(gen.tokens, base.tokens) if sampling.greedy else "n/a (sampled)"
            print(f"--- {name}, temperature {sampling.temperature}, gamma {gamma}")
            print(tokenizer.decode(gen.tokens))
            print(f"rounds {s.rounds}, acceptance rate {s.acceptance_rate:.2f}, mean accepted length "
                  f"{s.mean_accepted_length:.2f} (bonus included), {s.tokens_per_second:.1f} tokens/s, "
                  f"draft {s.draft_seconds:.2f} s, target {s.target_seconds:.2f} s; identical to greedy "
                  f"baseline: {same}\n")


def cli(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per round")
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    args = parser.parse_args(argv)
    main(args.max_new_tokens, args.gamma, args.dtype)


if __name__ == "__main__":
    cli()
