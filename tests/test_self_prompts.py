"""Requests the target writes itself (specdec_lite.train.self_prompts): what counts as a clean request, the prompt
that makes the target write one, resumable storage, the four families' prompts made from the requests and the
replies, and no leak into the evaluation prompts."""
import json

import numpy as np
import pytest

from specdec_lite.repro import tasks
from specdec_lite.train import corpus, self_prompts, sources


def test_a_clean_request_is_one_plain_paragraph_of_ascii_words():
    assert self_prompts.is_request("Can you recommend a good book about the history of tea?", "dialogue")
    assert not self_prompts.is_request("Tell me more", "dialogue")  # under four words
    assert not self_prompts.is_request("What does the word déjà vu mean in French?", "dialogue")
    assert not self_prompts.is_request("Summarize this:\n\nThe cat sat on the mat all day.", "dialogue")
    assert not self_prompts.is_request("What is <|im_start|> used for in a chat?", "dialogue")
    assert not self_prompts.is_request(" ".join(["word"] * 81), "code")
    code = "Write a Python function `add(a, b)` that adds two numbers:\n```\ndef add(a, b): ...\n```"
    assert self_prompts.is_request(code, "code") and not self_prompts.is_request(code, "dialogue")


def test_the_request_prompt_is_the_chat_template_up_to_the_users_words(embedded):
    _, tokenizer = embedded
    prompt = self_prompts.request_prompt(tokenizer, "Can you recommend")
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "Can you recommend a film?"}], tokenize=False)
    assert whole.startswith(prompt) and prompt.endswith("user\nCan you recommend")
    assert all(not opening.endswith(" ") for kind in self_prompts.OPENINGS.values() for opening in kind)


def test_requests_are_written_clean_and_a_run_resumes_with_the_next_batch(tmp_path, embedded):
    model, tokenizer = embedded
    added = self_prompts.generate_requests(model, tokenizer, 8, tmp_path, batch_size=4, progress=False)
    first = self_prompts.load_requests(tmp_path)
    assert {r["batch"] for r in first} == {0, 1}
    kept = [r for r in first if r["request"]]
    assert added == len(kept) >= 1  # 8 tries of the embedded target: a clean request among them
    for r in kept:
        assert self_prompts.is_request(r["request"], "code" if r["kind"] == "code" else "dialogue")
        assert r["request"].startswith(r["opening"]) and r["kind"] in ("dialogue", "code", "passage")
    assert self_prompts.generate_requests(model, tokenizer, 8, tmp_path, batch_size=4, progress=False) == 0
    self_prompts.generate_requests(model, tokenizer, 12, tmp_path, batch_size=4, progress=False)
    again = self_prompts.load_requests(tmp_path)
    assert again[: len(first)] == first and {r["batch"] for r in again} == {0, 1, 2}
    assert self_prompts.opening_schedule(2, 4) == self_prompts.opening_schedule(2, 4)


def write_requests(folder, requests):
    with open(folder / self_prompts.REQUESTS_FILE, "w") as f:
        for i, (kind, text) in enumerate(requests):
            f.write(json.dumps({"kind": kind, "opening": "", "request": text, "batch": i}) + "\n")


def test_the_four_families_come_from_the_requests_and_the_replies(tmp_path, embedded):
    _, tokenizer = embedded
    news = "Write a short news report about a new park opening in the city."
    leaking = next(p["prompt"] for p in tasks.load_prompts() if p["task"] == "dialogue")
    write_requests(tmp_path, [("dialogue", "How can I keep my kitchen tidy when I cook every day?"),
                              ("dialogue", "I like tea. What should I try next? Something with a smoky taste."),
                              ("code", "Write a Bash script that prints the ten largest files in a folder."),
                              ("passage", news), ("dialogue", leaking), ("none", None)])
    before = self_prompts.self_made_prompts(tokenizer, corpus.load_records(tmp_path), tmp_path)
    assert {p["family"] for p in before} == {"dialogue", "code", "translation"}  # no reply to summarize yet
    reply = ("The city opened a new park on Saturday. Families came to see the gardens, the playground and the "
             "small lake, and the mayor thanked the volunteers who planted more than two hundred trees. The park "
             "will be open every day from seven in the morning until nine in the evening.")
    chat = tokenizer.apply_chat_template([{"role": "user", "content": news}], add_generation_prompt=True,
                                         tokenize=False)
    prompt_ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
    reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    corpus._append(tmp_path, [{"id": f"self-dialogue-{sources.stable_hash(news)}", "family": "dialogue",
                               "prompt": news, "prompt_len": len(prompt_ids), "gen_len": len(reply_ids)}],
                   [np.array(prompt_ids + reply_ids)])
    after = self_prompts.self_made_prompts(tokenizer, corpus.load_records(tmp_path), tmp_path)
    by_family = {f: [p["prompt"] for p in after if p["family"] == f] for f in sources.FAMILIES}
    assert news in by_family["dialogue"] and leaking not in by_family["dialogue"]
    assert by_family["code"] == ["Write a Bash script that prints the ten largest files in a folder."]
    assert len(by_family["summarization"]) == 1 and reply in by_family["summarization"][0]
    translated = " ".join(by_family["translation"])
    assert "How can I keep my kitchen tidy when I cook every day?" in translated  # a one-sentence request
    assert "What should I try next" not in translated  # three sentences: not a translation item
    assert "The city opened a new park on Saturday." in translated  # a sentence of the reply
    assert all(p["id"] == f"self-{p['family']}-{sources.stable_hash(p['prompt'])}" for p in after)


def test_one_kind_of_prompts_a_run(tmp_path, embedded):
    model, tokenizer = embedded
    with pytest.raises(ValueError, match="choose one of sources and self_made"):
        corpus.generate_corpus(model, tokenizer, tmp_path, sources=True, self_made=True, progress=False)
