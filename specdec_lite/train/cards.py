"""Model cards: the README.md written beside each trained draft (the standalone draft and both heads).

Every card has the same parts: a title and a paragraph on how to load the model, its architecture and size,
its training data, its training (settings, then the loss curve from ``training_log.jsonl``) and, when given,
the held-out acceptance on the evaluation prompts. ``write_card`` lays them out; ``draft_card`` and
``head_card`` fill them in for each kind of draft. Each card also records, in ``training_data.json`` beside it,
which corpus records the checkpoint was trained on (the first N, with their reply tokens per family and
temperature); ``trained_on`` reads that back, for rewriting the card of a checkpoint without retraining it and
without the training text.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..names import EMBEDDED_DRAFT, EMBEDDED_EAGLE_DEEP_TTT, EMBEDDED_MEDUSA, EMBEDDED_TARGET
from ..drafts.heads import parameter_count
from ..paths import drafts_dir
from ..show import to_markdown
from .draft import directory_megabytes
from .heads import STEP_WEIGHT


def _cell(key: str, value) -> str:
    if key == "step":
        return str(value)
    return f"{value:.1f}" if key == "minutes" else f"{value:.3f}"


def refuse_shipped_names(out_dirs, target_name: str) -> None:
    """Training for another target under a shipped checkpoint's name would overwrite that checkpoint: refuse,
    before any work, saying which parameter gives the new one its own name."""
    for out_dir in map(Path, out_dirs):
        shipped = out_dir.parent == drafts_dir() and out_dir.name in (EMBEDDED_DRAFT, EMBEDDED_EAGLE_DEEP_TTT,
                                                                      EMBEDDED_MEDUSA)
        if shipped and target_name != EMBEDDED_TARGET:
            raise ValueError(f"{out_dir.name} is the checkpoint shipped for {EMBEDDED_TARGET}; training one for "
                             f"{target_name} would overwrite it. Give yours another name (-p draft <name> in "
                             "00_train_draft, -p name_prefix <name> in 00_train_heads)")


def write_card(out_dir: Path, title: str, intro: str, architecture: str, data: str, training: str,
               log: list[dict], columns: dict[str, str], evaluation=None) -> str:
    """Write ``out_dir/README.md`` and return its text. ``columns``: log key -> table header, in order."""
    lines = [f"# {title}", "", intro, "", "## Architecture", architecture, "", "## Training data", data, "",
             "## Training", training, "",
             "| " + " | ".join(columns.values()) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    lines += ["| " + " | ".join(_cell(k, e.get(k, float("nan"))) for k in columns) + " |" for e in log]
    if evaluation is not None:
        lines += ["", "## Held-out acceptance (evaluation prompts, chat template, gamma 4)", "", to_markdown(evaluation)]
    text = "\n".join(lines) + "\n"
    (Path(out_dir) / "README.md").write_text(text)
    return text


TRAINING_DATA = "training_data.json"  # the corpus records a checkpoint was trained on (the first N), summarized


def training_data(corpus_index: list[dict]) -> dict:
    """What a checkpoint was trained on, from the index entries of its records (the first N of the corpus index,
    which only grows): their number, their reply tokens, and both per family and temperature (``groups``)."""
    records, tokens = Counter(), Counter()
    for e in corpus_index:
        records[e["family"], e["temperature"]] += 1
        tokens[e["family"], e["temperature"]] += e["gen_len"]
    groups = [{"family": family, "temperature": temperature, "records": records[family, temperature],
               "reply_tokens": tokens[family, temperature]} for family, temperature in sorted(records)]
    return {"records": len(corpus_index), "reply_tokens": sum(tokens.values()), "groups": groups}


def record_training_data(out_dir: Path, used: dict) -> None:
    """Write ``used`` (``training_data``) beside the checkpoint, so that its card can be rewritten without the
    training text."""
    (Path(out_dir) / TRAINING_DATA).write_text(json.dumps(used, indent=1) + "\n")


def trained_on(out_dir: Path) -> dict:
    """What the checkpoint in ``out_dir`` was trained on (``training_data``), as recorded beside it."""
    path = Path(out_dir) / TRAINING_DATA
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing, so it is not known which records the checkpoint was trained "
                                "on: restore it (git checkout -- data/drafts/<name>) or retrain (retrain = True)")
    used = json.loads(path.read_text())
    if "groups" not in used:
        raise ValueError(f"{path} names only how many records the checkpoint was trained on, not their families: "
                         "retrain it (retrain = True), which writes the whole summary")
    return used


def families_and_temperatures(used: dict) -> tuple[list, list]:
    """The families and the temperatures of the records ``used`` summarizes, each sorted."""
    return (sorted({g["family"] for g in used["groups"]}), sorted({g["temperature"] for g in used["groups"]}))


def draft_card(out_dir: Path, draft, target_name: str, used: dict, log: list, cfg, evaluation=None) -> str:
    """The standalone draft's card; ``used`` is what it was trained on (``training_data``), ``cfg`` its
    ``train.draft.TrainConfig``."""
    out_dir, c = Path(out_dir), draft.config
    params = sum(p.numel() for p in draft.parameters())
    families, temps = families_and_temperatures(used)
    record_training_data(out_dir, used)
    return write_card(
        out_dir, f"{out_dir.name}: a draft model for {target_name}",
        "Trained by specdec_lite (`notebooks/00_train_draft.ipynb`) from the target alone. A plain transformers "
        "Llama with the target's tokenizer: `AutoModelForCausalLM.from_pretrained(this_folder)` works anywhere.",
        f"Llama, {c.num_hidden_layers} layers, width {c.hidden_size}, {c.num_attention_heads} heads "
        f"({c.num_key_value_heads} key/value), MLP {c.intermediate_size}, vocabulary {c.vocab_size} (tied input/"
        f"output embeddings, initialised by PCA of the target's). {params / 1e6:.2f} M parameters, stored in float16: "
        f"{directory_megabytes(out_dir):.1f} MB for the whole folder.",
        f"{used['records']} replies written by the target ({used['reply_tokens']} reply tokens) to template-made "
        f"instructions ({', '.join(families)}; `specdec_lite/train/corpus.py`), sampled at temperatures {temps} "
        "(0 = greedy). None of those instructions overlaps the evaluation prompts in `data/prompts/` (a test "
        f"checks it). Labels: the target's own tokens and its top-{cfg.topk} next-token probabilities by "
        f"teacher forcing; loss = {1 - cfg.soft_weight:.1f} x cross-entropy on the tokens + {cfg.soft_weight:.1f} x "
        "cross-entropy against the renormalised top-k.",
        f"{log[-1]['step'] if log else 0} AdamW steps of {cfg.batch_size} records (peak lr {cfg.lr}, warm-up "
        f"{cfg.warmup}, cosine), {cfg.heldout_fraction:.0%} of the records held out. Loss curve "
        "(`training_log.jsonl`):",
        log, {"step": "step", "train_loss": "train loss", "heldout_hard_ce": "held-out CE (tokens)",
              "heldout_soft_ce": "held-out CE (top-k)", "heldout_agreement": "held-out greedy agreement"},
        evaluation)


def decoder_layers(hc) -> str:
    """The head's decoder layers in words: one, or how many and that the later ones began as the identity
    (``drafts.heads.EagleHead``)."""
    if hc.num_layers == 1:
        return "one decoder layer"
    return f"{hc.num_layers} decoder layers (each after the first began as the identity)"


def head_card(out_dir: Path, trainer, used: dict, evaluation=None,
              trained_by: str = "`notebooks/00_train_heads.ipynb`") -> str:
    """A head's card (EAGLE-style or Medusa); ``trainer`` is the ``train.heads.HeadTrainer`` that trained it,
    ``used`` what it was trained on (``training_data``)."""
    out_dir, cfg, hc = Path(out_dir), trainer.cfg, trainer.head_cfg
    params = parameter_count(trainer.head)
    size = (out_dir / "head.safetensors").stat().st_size / 1e6
    families, _ = families_and_temperatures(used)
    vocab = f"the {hc.sub_vocab_size} most frequent reply tokens" if hc.sub_vocab_size else "the full vocabulary"
    if hc.kind == "eagle":
        what = (f"EAGLE-style head (Li et al. 2024): a linear fusion of (target feature, token embedding) into "
                f"width {hc.hidden_size}, then {decoder_layers(hc)} ({hc.num_attention_heads} heads, MLP "
                f"{hc.intermediate_size}, RoPE base {hc.rope_theta:g}); it predicts the target's next feature, "
                "which the target's own output layer reads.")
        loss = (f"{cfg.regression_weight} x smooth-L1 on the predicted feature + {cfg.ce_weight} x cross-entropy "
                f"against the target's distribution; input features with uniform noise +-{cfg.feature_noise}")
        if cfg.unroll > 1:
            loss += (f"; training-time test: the same loss after each of {cfg.unroll} drafting steps on the head's "
                     f"own predictions, step k weighted {STEP_WEIGHT}^(k-1)")
    else:
        what = (f"{hc.num_heads} Medusa heads (Cai et al. 2024): residual blocks f + SiLU(W f + b) on the target's "
                "last feature; head k predicts the token k places after the target's next token, through the "
                "target's own output layer.")
        loss = "mean over heads of the cross-entropy against the target's distribution of that token"
    heldout = [k for k in (trainer.log[-1] if trainer.log else {}) if k.startswith("heldout_")]
    held = (f"{len(cfg.heldout)} records held out (replies to prompts of the four tasks)" if cfg.heldout
            else f"{cfg.heldout_fraction:.0%} of the records held out")
    if cfg.heldout and cfg.first_record:
        within = sum(i >= cfg.first_record for i in cfg.heldout)
        held += f", {within} of them among its records (corpus records {cfg.first_record} on: the table's held-out)"
    start = f"Started from the weights of `{cfg.start_from}`. " if cfg.start_from else ""
    record_training_data(out_dir, used)
    return write_card(
        out_dir, f"{out_dir.name}: {'an EAGLE-style head' if hc.kind == 'eagle' else 'Medusa heads'} for {hc.target}",
        f"Trained by specdec_lite ({trained_by}) from the target alone. Load it with "
        f"`specdec_lite.load_pair(target, draft=\"{out_dir.name}\")` or `specdec_lite.drafts.heads.load_head(folder, "
        "target)`; it refuses any other target (hidden size, vocabulary, weights fingerprint "
        f"`{hc.target_fingerprint}`).",
        f"{what}\nOutput over {vocab} (q is zero elsewhere; exact, since the verifier gets that q). "
        f"{params / 1e6:.2f} M trained parameters; `head.safetensors` (float16) {size:.1f} MB. The target's "
        "embedding and output layer are used, not copied.",
        f"{used['records']} records written by the target ({used['reply_tokens']} reply tokens; families "
        f"{', '.join(families)}; `specdec_lite/train/corpus.py`) and the target's last hidden state at every token "
        "by teacher forcing (`specdec_lite/train/features.py`). None of the instructions overlaps the evaluation "
        "prompts.",
        f"{start}{trainer.step} AdamW steps of {cfg.batch_size} records (peak lr {cfg.lr}, warm-up {cfg.warmup}, "
        f"cosine); loss: {loss}. {held}; agreement = the head's argmax equals the target's (over the "
        "sub-vocabulary), teacher-forced.",
        trainer.log, {"step": "step", "minutes": "minutes", "train_loss": "train loss",
                      **{k: k.replace("heldout_", "held-out ") for k in heldout}},
        evaluation)


def eagle3_card(out_dir: Path, trainer, comparison) -> str:
    """The EAGLE-3-style head's card; ``trainer`` is the ``train.eagle3.Eagle3Trainer`` that trained it and
    ``comparison`` its held-out figures beside the shipped EAGLE head's (``eagle3.compare_heads``)."""
    out_dir, cfg, hc = Path(out_dir), trainer.cfg, trainer.head_cfg
    size = (out_dir / "head.safetensors").stat().st_size / 1e6
    replies = sum(len(t) - start for t, start in trainer.data.replies)
    teacher = sum(len(c) for c in trainer.data.chunks)
    minutes = trainer.loop.log[-1]["minutes"] if trainer.loop.log else 0.0
    heldout = [k for k in (trainer.loop.log[-1] if trainer.loop.log else {}) if k.startswith("heldout_")]
    return write_card(
        out_dir, f"{out_dir.name}: an EAGLE-3-style head for {hc.target}",
        "Trained by specdec_lite (`python -m specdec_lite.train.eagle3`) from the target alone, and shipped because "
        "it beats the shipped EAGLE head on the same held-out replies (table at the end). Tree drafts use it "
        f"when it is named (`tree_draft(name, target, head=\"{out_dir.name}\")`; `load_draft(\"auto\")` uses "
        "the head `loading.recommended_eagle` names); load it alone with `specdec_lite.load_pair(target, "
        f"draft=\"{out_dir.name}\")`. It refuses any other target (weights fingerprint `{hc.target_fingerprint}`).",
        f"EAGLE-3 (Li et al. 2025): the target's hidden states at layers {list(hc.feature_layers)} (low, middle, "
        f"high) fused by a linear layer into width {hc.hidden_size}, then with the token embedding into "
        f"{decoder_layers(hc)} ({hc.num_attention_heads} heads, MLP {hc.intermediate_size}); it predicts the next "
        f"feature, read by an output layer over the {hc.sub_vocab_size} most frequent reply tokens (q is zero "
        f"elsewhere; exact, since the verifier gets that q). {parameter_count(trainer.head) / 1e6:.2f} M trained "
        f"parameters; `head.safetensors` (float16) {size:.1f} MB.",
        f"{len(trainer.data.replies)} replies written by the target to offline prompts of the four tasks "
        f"({replies} reply tokens within {cfg.max_len} tokens a row; `specdec_lite/train/corpus.py`) and "
        f"{len(trainer.data.chunks)} chunks of teacher-forced text ({teacher} tokens: code, documentation and "
        "translation catalogs shipped inside installed packages; `specdec_lite/train/teacher.py`). None of it "
        f"overlaps the evaluation prompts. {len(cfg.heldout)} target-made replies are held out.",
        f"{trainer.loop.step} AdamW steps of {cfg.batch_size} rows of {cfg.max_len} tokens ({cfg.teacher_share:.0%} "
        f"teacher-forced text), peak lr {cfg.lr}, warm-up {cfg.warmup}, cosine over {cfg.steps} steps, "
        f"{minutes:.0f} minutes of 2-core CPU in all. Training-time test: the head is unrolled {cfg.unroll} steps on "
        "its own predictions; the loss is the mean over steps of the cross-entropy against the target's "
        "distribution. Agreement: the head's most likely token is the target's; acceptance: the expected "
        "acceptance of a token drawn from q at T = 1, sum_x min(p, q). Log (`training_log.jsonl`):",
        trainer.loop.log, {"step": "step", "minutes": "minutes", "train_loss": "train loss",
                           **{k: k.replace("heldout_", "held-out ") for k in heldout}},
        evaluation=None) + append_comparison(out_dir, comparison, "`specdec_lite.train.eagle3.compare_heads`",
                                          "the shipped EAGLE head")


def append_comparison(out_dir: Path, comparison, made_by: str, other: str) -> str:
    """Append the held-out comparison with ``other`` (made by the function ``made_by`` names) to the card in
    ``out_dir``; returns the added text."""
    text = (f"\n## Held-out: {other} beside this one\n\nThe same held-out replies, the same function "
            f"({made_by}).\n\n" + to_markdown(comparison.reset_index()) + "\n")
    with open(Path(out_dir) / "README.md", "a") as f:
        f.write(text)
    return text
