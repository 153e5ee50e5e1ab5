"""Teacher-forced training text: installed code, documentation and translation catalogs, tokenized (no sampling).

A draft head trained on the target's hidden states needs much more text than the target can write on a CPU
(``corpus.py``), and any text does for teacher forcing: the target reads it and its own predictions are the
labels. So this module stores what is installed on the machine, tokenized with the target's tokenizer:

    code         the Python files of the standard library and of the installed packages (``sources.py``)
    docs         their documentation files (.md, .rst, .txt), the packages' descriptions (METADATA), the Python
                 language reference (``pydoc_data``) and the system's documentation (Debian READMEs, the CMake
                 and Vim manuals, npm's docs)
    translation  the system's gettext catalogs (``*.mo``; the machine holds almost no ``.po`` sources) in French,
                 Spanish, German, Italian and Portuguese, as chat conversations: "Translate into French: <English
                 message>" answered by the catalog's translation, in the target's chat template

Files that are huge, binary or machine-generated are skipped (``sources.read_text``) and repeated texts stored
once. Documents come in an order drawn with ``--seed``; each kind takes its share of the budget (``SHARES``) and
no package more than ``--package-share`` of that share, so many packages have their say. Documents are cut into
chunks of ``--chunk`` tokens, stored in the cache (``paths.teacher_dir()``; the shipped text is restored there
by ``python -m specdec_lite.train.restore``):

    tokens.bin    uint16 token ids, chunks back to back
    index.jsonl   one line per chunk: kind, package, version, path (relative to the package's root), sha1 (of
                  the document), chunk (its number in the document), offset (in tokens.bin) and length

    python -m specdec_lite.train.teacher --budget 4000000    # resumes: stored documents are skipped

The same installed files and arguments give the same store; a larger budget extends it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import paths
from . import sources
from .restore import missing_text

SHARES = {"code": 0.55, "docs": 0.3, "translation": 0.15}  # of 4M: what the docs on this machine allow
MIN_CHARS = 200
PAIRS_PER_CATALOG = 200


@dataclass(frozen=True)
class Document:
    kind: str
    package: str
    version: str
    path: str
    text: str


def teacher_dir() -> Path:
    return paths.teacher_dir()


def code_documents(seed: int = 0):
    """The Python files of the standard library and the installed packages, in the order drawn with ``seed``."""
    yield from _read(sources.stdlib_files() + sources.package_files(), "code", seed)


def doc_documents(seed: int = 0):
    """The documentation files and descriptions of the installed packages, the system's documentation, then the
    Python reference's topics."""
    files = sources.package_files((*sources.DOC_SUFFIXES, "METADATA")) + sources.system_doc_files()
    yield from _read(files, "docs", seed)
    for source, text in sources.python_reference():
        yield Document("docs", sources.STDLIB, platform.python_version(), source.split(":", 1)[1], text)


def _read(files: list[sources.SourceFile], kind: str, seed: int):
    for f in sorted(files, key=lambda f: sources.stable_hash(f"{seed}:{f.package}:{f.path}")):
        text = sources.read_text(f)
        if text and len(text) >= MIN_CHARS:
            yield Document(kind, f.package, f.version, f.path, text)


def translation_documents(tokenizer, seed: int = 0):
    """A chat conversation per catalog (in the order drawn with ``seed``): up to ``PAIRS_PER_CATALOG`` of its
    messages of two words or more that have a translation of their own, each asked for and answered in turn."""
    found = sources.catalogs()
    for language, domain, path in sorted(found, key=lambda c: sources.stable_hash(f"{seed}:{c[1]}:{c[0]}")):
        pairs = [(en, tr) for en, tr in sources.read_mo(path).items()
                 if tr.strip() and tr != en and len(en.split()) >= 2]
        if len(pairs) < 5:
            continue
        pairs = random.Random(f"{seed}:{language}:{domain}").sample(pairs, min(len(pairs), PAIRS_PER_CATALOG))
        chat = [turn for en, tr in pairs for turn in ({"role": "user", "content": f"Translate into {language}: {en}"},
                                                       {"role": "assistant", "content": tr})]
        text = tokenizer.apply_chat_template(chat, tokenize=False)
        yield Document("translation", domain, "", path.relative_to(path.parents[2]).as_posix(), text)


def documents(kind: str, tokenizer, seed: int = 0):
    """The documents of ``kind`` ("code", "docs" or "translation"), read one at a time in the order drawn with
    ``seed`` (a hash of each one's package and path)."""
    if kind == "translation":
        return translation_documents(tokenizer, seed)
    return code_documents(seed) if kind == "code" else doc_documents(seed)


def teacher_folder(out_dir: Path | None = None) -> Path:
    """``out_dir``, or the teacher text in the cache, which must then be there (``train.restore`` writes it)."""
    if out_dir is not None:
        return Path(out_dir)
    if not (teacher_dir() / "index.jsonl").exists():
        raise missing_text(teacher_dir(), "teacher text")
    return teacher_dir()


def load_index(out_dir: Path | None = None) -> list[dict]:
    """The stored chunks' index entries (none in a new folder)."""
    path = teacher_folder(out_dir) / "index.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_chunks(out_dir: Path | None = None) -> list[tuple[dict, np.ndarray]]:
    """[(index entry, token ids)] for every stored chunk."""
    out_dir = teacher_folder(out_dir)
    if not (out_dir / "tokens.bin").exists():
        return []
    tokens = np.fromfile(out_dir / "tokens.bin", dtype=np.uint16)
    return [(e, tokens[e["offset"]: e["offset"] + e["length"]].astype(np.int64)) for e in load_index(out_dir)]


def _append(out_dir: Path, doc: Document, sha1: str, ids: list[int], chunk: int) -> int:
    """Append one document's ids as chunks of ``chunk`` tokens; returns the number of tokens stored."""
    bin_path = out_dir / "tokens.bin"
    offset = bin_path.stat().st_size // 2 if bin_path.exists() else 0
    with open(bin_path, "ab") as fb, open(out_dir / "index.jsonl", "a") as fi:
        for n, start in enumerate(range(0, len(ids), chunk)):
            piece = np.asarray(ids[start: start + chunk], dtype=np.uint16)
            fb.write(piece.tobytes())
            fi.write(json.dumps({"kind": doc.kind, "package": doc.package, "version": doc.version, "path": doc.path,
                                 "sha1": sha1, "chunk": n, "offset": offset, "length": len(piece)}) + "\n")
            offset += len(piece)
    return len(ids)


def build_teacher_text(tokenizer, out_dir: Path | None = None, budget_tokens: int = 4_000_000, chunk: int = 1024,
                       package_share: float = 0.05, seed: int = 0, kinds=tuple(SHARES), progress: bool = True) -> int:
    """Append tokenized documents to ``out_dir`` until each kind of ``kinds`` holds its share of
    ``budget_tokens`` (``SHARES``; a document is stored whole, so a kind may pass its share by one document).
    Documents already stored (same package and path, or same text) are skipped, and so are those of a package
    that holds ``package_share`` of its kind's share. Returns the number of tokens added."""
    from ..show import progress_bar

    out_dir = Path(out_dir or teacher_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(tokenizer) > 65535:
        raise ValueError("token ids are stored as uint16; this tokenizer has more than 65,535 tokens")
    index = load_index(out_dir)
    seen = {(e["package"], e["path"]) for e in index} | {e["sha1"] for e in index}
    per_kind = Counter({kind: 0 for kind in kinds})
    per_package = Counter()
    for e in index:
        per_kind[e["kind"]] += e["length"]
        per_package[e["kind"], e["package"]] += e["length"]
    added = 0
    bar = progress_bar(total=budget_tokens, initial=sum(per_kind.values()), desc="teacher-forced tokens",
                       disable=not progress)
    for kind in kinds:
        for doc in documents(kind, tokenizer, seed):
            if per_kind[kind] >= SHARES[kind] * budget_tokens:
                break
            sha1 = hashlib.sha1(" ".join(doc.text.split()).encode()).hexdigest()
            full = per_package[kind, doc.package] >= package_share * SHARES[kind] * budget_tokens
            if full or (doc.package, doc.path) in seen or sha1 in seen:
                continue
            seen |= {(doc.package, doc.path), sha1}
            ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
            n = _append(out_dir, doc, sha1, ids, chunk)
            per_kind[kind] += n
            per_package[kind, doc.package] += n
            added += n
            bar.update(n)
    bar.close()
    return added


def main(argv=None):
    from transformers import AutoTokenizer

    from ..names import EMBEDDED_TARGET, embedded_target_path, resolve_name

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=EMBEDDED_TARGET, help="whose tokenizer (default: the embedded target)")
    parser.add_argument("--out", default=None, help="default: the teacher text in the cache (paths.teacher_dir())")
    parser.add_argument("--budget", type=int, default=4_000_000, help="tokens the store should hold in all")
    parser.add_argument("--chunk", type=int, default=1024, help="tokens a chunk")
    parser.add_argument("--package-share", type=float, default=0.05, help="most of a kind's share one package may fill")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", nargs="+", default=list(SHARES), choices=list(SHARES))
    args = parser.parse_args(argv)
    path = embedded_target_path() if args.target == EMBEDDED_TARGET else resolve_name(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    out_dir = Path(args.out or teacher_dir())
    n = build_teacher_text(tokenizer, out_dir, args.budget, args.chunk, args.package_share, args.seed, args.kinds)
    index = load_index(out_dir)
    print(f"added {n} tokens; {sum(e['length'] for e in index)} tokens in {len(index)} chunks in {out_dir}")


if __name__ == "__main__":
    main()
