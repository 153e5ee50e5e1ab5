"""Shared fixtures: tiny random Hugging Face Llama models (made here, no download) and the embedded target.

The tests never write into the user's cache folder: unless ``SPECDEC_LITE_CACHE`` names one (``make test`` sets it),
they use the checkout's scratch cache ``out/test-cache`` (the embedded target's conversion is made there once), and
the session fails if the user's cache changed while it ran."""
import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specdec_lite as sd
from specdec_lite import paths

USER_CACHE = Path.home() / ".cache" / "specdec_lite"
os.environ.setdefault(paths.CACHE_ENV, str(Path(__file__).resolve().parents[1] / "out" / "test-cache"))

# SPECDEC_TEST_DEVICE=cuda runs the model tests on a GPU (make gpu-check)
DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")


def snapshot(folder: Path) -> dict:
    """{file: (size, mtime)} of everything under ``folder`` ({} where it does not exist)."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()} \
        if folder.is_dir() else {}


def pytest_sessionstart(session):
    session.config.user_cache_before = snapshot(USER_CACHE)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run where a test wrote into the user's cache folder (unless the run was pointed at it)."""
    if Path(os.environ[paths.CACHE_ENV]).expanduser().resolve() == USER_CACHE.resolve():
        return
    before, after = session.config.user_cache_before, snapshot(USER_CACHE)
    changed = sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))
    if changed:
        print(f"\nthe tests wrote into the user's cache folder {USER_CACHE}: {changed[:5]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def tiny_llama(vocab=64, layers=4, hidden=32, seed=0, max_positions=256):
    """A random Llama with no end-of-sequence token (LlamaConfig's default would make token 2 one): its runs go to
    max_new_tokens unless a test sets ``generation_config.eos_token_id``."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=False, eos_token_id=None)
    model = LlamaForCausalLM(config).to(DEVICE).eval()
    # sharpen the random model's output so greedy paths are not decided by float noise
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_llama(layers=4, seed=0)


@pytest.fixture(scope="session")
def tiny_draft():
    return tiny_llama(layers=1, seed=1)


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, float32."""
    return sd.load_model(sd.EMBEDDED_TARGET, device=DEVICE, dtype=torch.float32)


@pytest.fixture(scope="session")
def local_pairs(tmp_path_factory):
    """Folders saved with save_pretrained, as a user's new pair would be: tiny random Llamas with the embedded
    target's tokenizer (4, 2 and 1 layers), and a 1-layer one with another tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from specdec_lite.names import embedded_target_path

    root = tmp_path_factory.mktemp("pairs")
    tokenizer = AutoTokenizer.from_pretrained(embedded_target_path())
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {f"w{i}": i for i in range(len(tokenizer))}, unk_token="w0")))
    for name, layers, seed, tok in (("tiny-4l", 4, 0, tokenizer), ("tiny-2l", 2, 2, tokenizer),
                                    ("tiny-1l", 1, 1, tokenizer), ("other-tokenizer-1l", 1, 3, other)):
        model = tiny_llama(vocab=len(tokenizer), layers=layers, seed=seed, max_positions=1024).cpu()
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


@pytest.fixture(scope="session")
def restored_text(tmp_path_factory):
    """The shipped training text, restored from the repository's history into a fresh cache folder:
    {"target_text": folder, "teacher_text": folder}. A clone without that history (a shallow one) skips the tests
    that read it, saying so."""
    from specdec_lite import paths
    from specdec_lite.train import restore

    try:
        restore.check_commit(paths.repo_root())
    except RuntimeError as e:
        pytest.skip(f"the training text is in the repository's history, which this clone lacks: {e}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(paths.CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        return restore.restore_text()


class ProposeRecorder:
    """Wraps a drafter's ``propose``; keeps (buffer, lengths, drafts, q) of every round, each copied."""

    def __init__(self, drafter):
        self.drafter, self.rounds = drafter, []
        original = drafter.propose

        def propose(seq, lengths, gamma, sampling, generator):
            drafts, q = original(seq, lengths, gamma, sampling, generator)
            self.rounds.append((seq.clone(), lengths.tolist(), drafts.clone(), None if q is None else q.clone()))
            return drafts, q
        drafter.propose = propose
