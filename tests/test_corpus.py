"""Training text: target-made (append-only storage, resumable), prompts harvested from installed files (deterministic,
the four tasks, disjoint from the evaluation prompts), teacher-forced text (round trip, resume), and the shipped
text restored from the repository's history."""
import struct
from collections import Counter

import numpy as np
import pytest

from specdec_lite.repro import tasks
from specdec_lite import paths
from specdec_lite.train import cards, corpus, restore, sources, teacher

from conftest import tiny_llama


def test_training_prompts_are_many_unique_and_stable():
    prompts = corpus.training_prompts()
    assert len(prompts) > 2000  # the shipped corpus: hours of target generation
    assert len({p["id"] for p in prompts}) == len(prompts) == len({p["prompt"] for p in prompts})
    assert prompts == corpus.training_prompts()  # same seed, same order
    assert {p["family"] for p in prompts} == {"code", "explain", "advice", "translate", "chat"}


def test_generate_corpus_appends_and_resumes(tmp_path, embedded):
    _, tokenizer = embedded
    side = tokenizer.padding_side
    model = tiny_llama(vocab=49152, layers=1, hidden=32, seed=5, max_positions=8192)
    n1 = corpus.generate_corpus(model, tokenizer, tmp_path, budget_tokens=20, batch_size=2, max_new_tokens=8,
                                progress=False)
    first = corpus.load_index(tmp_path)
    n2 = corpus.generate_corpus(model, tokenizer, tmp_path, budget_tokens=20, batch_size=2, max_new_tokens=8,
                                progress=False)
    index = corpus.load_index(tmp_path)
    assert tokenizer.padding_side == side  # the caller's tokenizer is left as it was
    assert n1 >= 20 and n2 >= 20 and len(index) == 2 * len(first)
    assert len({e["id"] for e in index}) == len(index)  # the second run skipped what the first had done
    records = corpus.load_records(tmp_path)
    total = sum(len(arr) for _, arr in records)
    assert total == (tmp_path / "tokens.bin").stat().st_size // 2
    for entry, arr in records:
        assert entry["prompt"] in tokenizer.decode(arr[: entry["prompt_len"]])
        assert len(arr) == entry["prompt_len"] + entry["gen_len"] and arr.dtype == np.int64


# --- prompts harvested from installed files (sources.py) ----------------------------------------------------------

@pytest.fixture(scope="module")
def harvested():
    return sources.harvest_prompts(files_per_package=5)


def test_harvested_prompts_are_deterministic_cover_the_four_tasks_and_have_stable_ids(harvested):
    assert sources.harvest_prompts(files_per_package=5) == harvested
    by_family = Counter(p["family"] for p in harvested)
    assert set(by_family) == set(sources.FAMILIES) == set(tasks.TASKS) and min(by_family.values()) >= 50, by_family
    assert len({p["id"] for p in harvested}) == len(harvested) == len({p["prompt"] for p in harvested})
    assert all(p["id"] == f"src-{p['family']}-{sources.stable_hash(p['prompt'])}" and p["source"] for p in harvested)
    langs = Counter(lang for p in harvested if p["family"] == "translation" for lang in sources.LANGUAGES
                    if f" {lang}" in p["prompt"])
    assert set(langs) == set(sources.LANGUAGES)


def test_harvested_prompts_do_not_leak_into_evaluation_prompts(harvested):
    """The check of tests/test_tasks.py (equal, contained, or an 8-word run in common), on the new sources."""
    from test_tasks import ngrams

    evaluation = [p["prompt"] for p in tasks.load_prompts()]
    grams = set().union(*(ngrams(e) for e in evaluation))
    for p in harvested:
        assert not any(p["prompt"] in e or e in p["prompt"] for e in evaluation), p["id"]
        assert not ngrams(p["prompt"]) & grams, p["id"]


def test_leaking_prompts_are_dropped():
    evaluation = sources.evaluation_prompts()
    planted = [sources._prompt("translation", "x", evaluation[0]),  # equal
               sources._prompt("summarization", "x", f"Please summarize this briefly:\n\n{evaluation[-1]}"),
               sources._prompt("code", "x", " ".join(evaluation[1].split()[:9]) + " in Haskell."),  # 8-word run
               sources._prompt("dialogue", "x", "How do I parse a date in Python?"),
               sources._prompt("dialogue", "x", "How do I parse a date in Python?")]  # repeated text
    assert [p["prompt"] for p in sources.without_leaks(planted)] == ["How do I parse a date in Python?"]


def test_text_helpers():
    assert sources.verb_phrase("Return the sum of two numbers.") == ("returns the sum of two numbers",
                                                                     "return the sum of two numbers")
    assert sources.verb_phrase("Applies a patch to a file.")[1] == "apply a patch to a file"
    assert sources.verb_phrase("The sum of two numbers.") is None  # no verb
    assert sources.verb_phrase("Return `x` + 1.") is None  # code
    assert sources.is_prose("This module provides a simple way to read and write files.")
    assert not sources.is_prose(">>> x = read_file('a.txt')\nThis reads it.")
    assert not sources.is_prose(":param path: the file to read, which must exist.")
    assert sources.plain("Use :func:`~os.path.join` and ``x``.") == "Use os.path.join and x."
    text = "\n\n".join(["One short paragraph that is plain prose here."] * 12)
    assert all(40 <= len(p.split()) <= 260 for p in sources.passages(text))
    assert sources.sentences("Read the file. It holds the list of names.") == ["It holds the list of names."]


def write_mo(path, messages):
    """A compiled gettext catalog (little-endian .mo) holding ``messages`` ({original: translation})."""
    keys = sorted(messages)
    ids, strs = [k.encode() for k in keys], [messages[k].encode() for k in keys]
    start = 28 + 16 * len(keys)
    blob, table_o, table_t = b"", [], []
    for table, items in ((table_o, ids), (table_t, strs)):
        for item in items:
            table.append((len(item), start + len(blob)))
            blob += item + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, len(keys), 28, 28 + 8 * len(keys), 0, 0)
    path.write_bytes(header + b"".join(struct.pack("<2I", *e) for e in table_o + table_t) + blob)


def test_read_mo(tmp_path):
    write_mo(tmp_path / "a.mo", {"": "header", "Open the file": "Ouvrir le fichier", "one\0two": "x",
                                 "ctx\x04Save": "y"})
    assert sources.read_mo(tmp_path / "a.mo") == {"Open the file": "Ouvrir le fichier"}


def test_read_text_skips_huge_binary_and_generated_files(tmp_path):
    def read(name, text):
        (tmp_path / name).write_text(text)
        return sources.read_text(sources.SourceFile("p", "1", tmp_path, name))

    assert read("ok.py", "def f():\n    return 1\n") is not None
    assert read("gen.py", "# Generated by the protocol buffer compiler.  DO NOT EDIT!\nx = 1\n") is None
    assert read("min.js", "x" * 1001) is None and read("table.txt", ("1," * 200 + "\n") * 3) is None
    assert read("big.py", "x = 1\n" * 40_000) is None
    (tmp_path / "bin.py").write_bytes(b"\xff\xfe\x00\x01")
    assert sources.read_text(sources.SourceFile("p", "1", tmp_path, "bin.py")) is None


def test_family_batches_take_turns_and_alternate_greedy_and_t1():
    todo = [{"id": f"src-{f}-{i}", "family": f, "prompt": "x" * (i % 7)} for f in ("a", "b") for i in range(20)]
    done = [{"id": "src-a-old", "family": "a", "temperature": 0.0}] * 4  # family a has 4 greedy records already
    batches = list(corpus.family_batches(todo, 4, done, window=2))
    assert [b[0]["family"] for b, _ in batches] == ["a", "b"] * 5
    assert all(len({p["family"] for p in b}) == 1 for b, _ in batches)
    assert [t for b, t in batches if b[0]["family"] == "a"] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [t for b, t in batches if b[0]["family"] == "b"] == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert [len(p["prompt"]) for p in batches[0][0] + batches[2][0]] == sorted(len(p["prompt"]) for p in todo[:8])
    assert sorted(p["id"] for b, _ in batches for p in b) == sorted(p["id"] for p in todo)


# --- teacher-forced text (teacher.py) -------------------------------------------------------------------------------

def fake_documents(monkeypatch, docs):
    monkeypatch.setattr(teacher, "documents", lambda kind, tokenizer, seed=0: [d for d in docs if d.kind == kind])


def test_teacher_text_round_trips_and_resumes(tmp_path, monkeypatch, embedded):
    _, tokenizer = embedded
    text = "def add(a, b):\n    return a + b\n" * 60
    docs = [teacher.Document("code", "pkg", "1.0", f"pkg/m{i}.py", f"# module {i}\n{text}") for i in range(6)]
    docs.append(teacher.Document("code", "other", "2.0", "other/copy.py", docs[0].text))  # same text: stored once
    docs.append(teacher.Document("docs", "pkg", "1.0", "README.md", "A package that adds numbers. " * 50))
    fake_documents(monkeypatch, docs)
    n1 = teacher.build_teacher_text(tokenizer, tmp_path, budget_tokens=2000, chunk=256, package_share=1.0,
                                    progress=False)
    index = teacher.load_index(tmp_path)
    assert n1 == sum(e["length"] for e in index) == (tmp_path / "tokens.bin").stat().st_size // 2
    assert {e["kind"] for e in index} == {"code", "docs"} and "other/copy.py" not in {e["path"] for e in index}
    assert max(e["length"] for e in index) == 256
    for path in {e["path"] for e in index}:
        chunks = [arr for e, arr in teacher.load_chunks(tmp_path) if e["path"] == path]
        assert tokenizer.decode(np.concatenate(chunks)) == next(d.text for d in docs if d.path == path)
    assert teacher.build_teacher_text(tokenizer, tmp_path, budget_tokens=2000, chunk=256, package_share=1.0,
                                      progress=False) == 0  # resumed: nothing left to add
    n2 = teacher.build_teacher_text(tokenizer, tmp_path, budget_tokens=4000, chunk=256, package_share=1.0,
                                    progress=False)
    index2 = teacher.load_index(tmp_path)
    assert n2 > 0 and index2[: len(index)] == index and len({(e["path"], e["chunk"]) for e in index2}) == len(index2)


def test_teacher_text_package_share(tmp_path, monkeypatch, embedded):
    _, tokenizer = embedded
    docs = [teacher.Document("code", pkg, "1", f"{pkg}/m{i}.py", f"x_{pkg}_{i} = {i}\n" * 80)
            for pkg in ("a", "b") for i in range(10)]
    fake_documents(monkeypatch, docs)
    teacher.build_teacher_text(tokenizer, tmp_path, budget_tokens=20_000, package_share=0.1, kinds=("code",),
                               progress=False)
    per_package = Counter()
    for e in teacher.load_index(tmp_path):
        per_package[e["package"]] += e["length"]
    cap = 0.1 * teacher.SHARES["code"] * 20_000  # a package stops after the document that reaches it
    assert set(per_package) == {"a", "b"} and all(cap <= n < cap + 800 for n in per_package.values())


def test_translation_documents_are_chat_conversations(tmp_path, monkeypatch, embedded):
    _, tokenizer = embedded
    catalog = tmp_path / "fr" / "LC_MESSAGES" / "demo.mo"
    catalog.parent.mkdir(parents=True)
    write_mo(catalog, {f"Open file number {i}": f"Ouvrir le fichier numéro {i}" for i in range(8)})
    monkeypatch.setattr(sources, "catalogs", lambda: [("French", "demo", catalog)])
    (doc,) = teacher.translation_documents(tokenizer)
    assert (doc.kind, doc.package, doc.path) == ("translation", "demo", "fr/LC_MESSAGES/demo.mo")
    assert doc.text.count("Translate into French: Open file number") == 8
    assert "<|im_start|>assistant\nOuvrir le fichier numéro 3<|im_end|>" in doc.text


# --- the shipped training text, restored (restore.py) ---------------------------------------------------------------

def test_restored_text_is_what_the_shipped_checkpoints_were_trained_on(restored_text):
    records = corpus.load_records(restored_text["target_text"])
    assert len(records) == 36_495 and all(len(ids) == e["prompt_len"] + e["gen_len"] for e, ids in records)
    assert len(teacher.load_chunks(restored_text["teacher_text"])) > 1000
    index = [e for e, _ in records]
    for checkpoint in sorted(paths.drafts_dir().iterdir()):
        used = cards.trained_on(checkpoint)
        assert cards.training_data(index[: used["records"]]) == used, checkpoint.name


def test_restoring_again_leaves_the_text_as_it_is(restored_text, monkeypatch, capsys):
    monkeypatch.setenv(paths.CACHE_ENV, str(restored_text["target_text"].parent))
    before = {f: f.stat().st_mtime_ns for folder in restored_text.values() for f in folder.iterdir()}
    assert restore.restore_text() == restored_text
    assert capsys.readouterr().out.count("left as it is") == 2
    assert {f: f.stat().st_mtime_ns for folder in restored_text.values() for f in folder.iterdir()} == before


def test_missing_training_text_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path))
    for load in (corpus.load_index, corpus.load_records, teacher.load_index, teacher.load_chunks):
        with pytest.raises(FileNotFoundError, match="python -m specdec_lite.train.restore"):
            load()
    assert corpus.load_index(tmp_path / "new") == [] == teacher.load_chunks(tmp_path / "new")  # a run writes there
    with pytest.raises(RuntimeError, match="git fetch --unshallow"):
        restore.restore_text(commit="0" * 40)
    assert not any(tmp_path.iterdir())  # refused before any work

