"""The target's last hidden states over its own text, by teacher forcing: training data for feature-level drafts
(EAGLE-style head, Medusa heads; ``heads.py``).

One forward of the target over each record of the target-made text (``paths.corpus_dir()``) gives, at every
position i, the hidden state f_i that its output layer turns into the logits for token i+1 (after the final norm:
``lm_head(f_i)`` are the logits). They are stored as float16, one row per token, aligned with ``tokens.bin`` (row j
= token j), in a cache folder (about 1.2 kB a token: 580 MB for the 500k tokens of the shipped corpus; too big to
commit, remade in about 15 minutes):

    python -m specdec_lite.train.features              # resumes: records already done are skipped

A fingerprint of the target's weights is stored beside them, so features of another model are never mixed in.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import torch

from ..tuning.devices import DTYPE_HELP
from ..names import EMBEDDED_TARGET
from ..core.models import load_model
from ..drafts.fingerprint import weights_fingerprint
from .. import paths
from ..tokenizers import padded
from .corpus import load_index
from .restore import missing_text


SORTED_BATCHES = 16  # batches per chunk: a chunk's records are batched by length (a third less padding than in
# corpus order), and a chunk is the unit of resumption


def features_dir(target_name: str, root: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(target_name)).strip("_")[-80:]
    return Path(root or paths.features_root()) / safe


def _meta_path(out_dir: Path) -> Path:
    return out_dir / "meta.json"


def feature_store(out_dir: Path, total_tokens: int, hidden_size: int, mode: str = "r") -> np.memmap:
    return np.memmap(out_dir / "features.f16", dtype=np.float16, mode=mode, shape=(total_tokens, hidden_size))


@torch.inference_mode()
def extract_features(target, corpus_dir: Path | None = None, out_dir: Path | None = None, target_name: str = "",
                     batch_size: int = 16, max_records: int | None = None, progress: bool = True,
                     first_record: int = 0) -> dict:
    """Write the target's last hidden state at every token of corpus records ``first_record`` to ``max_records`` - 1
    (to the last by default) to ``out_dir``; resumes where an earlier run stopped (the features cover one range of
    records, from the ``first_record`` of the first run on). Returns the metadata (see ``load_features``)."""
    from ..show import progress_bar

    corpus_dir = Path(corpus_dir or paths.corpus_dir())
    index = load_index(corpus_dir)
    if not index:
        raise missing_text(corpus_dir, "target-made text")
    index = index[:max_records] if max_records else index
    out_dir = Path(out_dir or features_dir(target_name or type(target).__name__))
    out_dir.mkdir(parents=True, exist_ok=True)
    hidden = target.config.get_text_config(decoder=True).hidden_size
    fingerprint = weights_fingerprint(target)
    total = index[-1]["offset"] + index[-1]["prompt_len"] + index[-1]["gen_len"]
    meta = json.loads(_meta_path(out_dir).read_text()) if _meta_path(out_dir).exists() else {}
    if meta and (meta["fingerprint"] != fingerprint or meta["hidden_size"] != hidden):
        raise ValueError(f"{out_dir} holds features of another model (fingerprint {meta['fingerprint']}, this "
                         f"target {fingerprint}); give another out_dir or delete that folder")
    first = meta.get("first_record", 0) if meta else first_record
    if first > first_record:
        raise ValueError(f"{out_dir} holds features of records {first} on, and record {first_record} on are asked "
                         "for: give another out_dir, or delete that folder to start again")
    done = meta.get("records_done", first)
    path = out_dir / "features.f16"
    with open(path, "ab") as f:  # grow the file to the corpus size (the corpus only ever grows)
        f.truncate(max(path.stat().st_size, total * hidden * 2))
    store = feature_store(out_dir, total, hidden, mode="r+")
    tokens = np.fromfile(corpus_dir / "tokens.bin", dtype=np.uint16)
    meta = {"target": target_name, "fingerprint": fingerprint, "hidden_size": hidden,
            "corpus": str(corpus_dir), "dtype": "float16", "first_record": first, "records_done": done,
            "tokens": int(total)}
    bar = progress_bar(total=len(index), initial=done, desc="target features", disable=not progress)
    for start in range(done, len(index), batch_size * SORTED_BATCHES):
        chunk = index[start: start + batch_size * SORTED_BATCHES]
        by_length = sorted(chunk, key=lambda e: e["prompt_len"] + e["gen_len"])
        for i in range(0, len(by_length), batch_size):
            write_batch(target, tokens, by_length[i: i + batch_size], store)
        store.flush()  # the chunk is done: the records before start + len(chunk) all have their features
        meta.update(records_done=start + len(chunk), tokens=int(total))
        _meta_path(out_dir).write_text(json.dumps(meta, indent=1) + "\n")
        bar.update(len(chunk))
    bar.close()
    return meta


def write_batch(target, tokens: np.ndarray, batch: list[dict], store: np.memmap) -> None:
    """One padded target forward over the records ``batch`` (index entries); their last hidden states go to
    ``store`` at their offsets."""
    seqs = [torch.from_numpy(tokens[e["offset"]: e["offset"] + e["prompt_len"] + e["gen_len"]].astype(np.int64))
            for e in batch]
    ids, mask = padded(seqs)
    out = target(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                 output_hidden_states=True, logits_to_keep=1)
    feats = out.hidden_states[-1].to(torch.float16).cpu().numpy()
    for r, e in enumerate(batch):
        store[e["offset"]: e["offset"] + len(seqs[r])] = feats[r, : len(seqs[r])]


def load_features(out_dir: Path) -> tuple[np.memmap, dict]:
    """(features (tokens, hidden) float16 memmap aligned with tokens.bin, metadata); only records
    ``meta['first_record']`` to ``meta['records_done']`` - 1 of the corpus index are filled."""
    out_dir = Path(out_dir)
    if not _meta_path(out_dir).exists():
        raise FileNotFoundError(f"no features in {out_dir}: run `python -m specdec_lite.train.features` first")
    meta = {"first_record": 0, **json.loads(_meta_path(out_dir).read_text())}  # older folders start at 0
    return feature_store(out_dir, meta["tokens"], meta["hidden_size"]), meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=EMBEDDED_TARGET)
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--corpus", default=None, help="default: the training text in the cache (paths.corpus_dir())")
    parser.add_argument("--out", default=None, help="default: the cache folder for this target")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-records", type=int, default=None)
    parser.add_argument("--first-record", type=int, default=0, help="the first record to extract (a new folder)")
    args = parser.parse_args(argv)
    model, _ = load_model(args.target, dtype=args.dtype)
    out = Path(args.out) if args.out else features_dir(args.target)
    meta = extract_features(model, args.corpus and Path(args.corpus), out, args.target, args.batch_size,
                            args.max_records, first_record=args.first_record)
    print(f"records {meta['first_record']} to {meta['records_done'] - 1}: features in {out}")


if __name__ == "__main__":
    main()
