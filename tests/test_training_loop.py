"""The shared training loop (specdec_lite.train.loop) on a tiny regression: exact resume after an interruption,
the time budget, the evaluation and checkpoint intervals, the log, the schedule."""
import json
import math

import pytest
import torch

from specdec_lite.train.loop import LOG_FILE, STATE_FILE, LoopConfig, TrainingLoop, warmup_cosine


class Interrupted(Exception):
    pass


class Task:
    """y = x @ w_true + noise; the noise comes from torch's global generator, the batches from the loop's."""

    def __init__(self, seed=0, interrupt_at=None):
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(4, 1)
        self.w_true = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        self.heldout = torch.randn(16, 4, generator=torch.Generator().manual_seed(99))
        self.calls, self.losses, self.lrs, self.evals, self.saves = 0, [], [], [], []
        self.interrupt_at, self.loop = interrupt_at, None

    def sample(self, generator):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise Interrupted
        return torch.randn(8, 4, generator=generator)

    def loss(self, x):
        y = x @ self.w_true + 0.1 * torch.randn(len(x), 1)
        loss = ((self.model(x) - y) ** 2).mean()
        self.losses.append(loss.item())
        self.lrs.append(self.loop.opt.param_groups[0]["lr"])
        return loss

    def evaluate(self):
        self.evals.append((self.loop.step, self.model.training, torch.is_grad_enabled()))
        return {"heldout_mse": ((self.model(self.heldout) - self.heldout @ self.w_true) ** 2).mean().item()}

    def save(self):
        self.saves.append(self.loop.step)

    def make_loop(self, out_dir, keep_state=True, **cfg):
        cfg = LoopConfig(**{"steps": 12, "lr": 0.1, "warmup": 3, "eval_every": 4, **cfg})
        self.loop = TrainingLoop(self.model, self.loss, self.sample, self.evaluate, cfg, self.save, out_dir,
                                 keep_state=keep_state)
        return self.loop


def without_minutes(log):
    return [{k: v for k, v in e.items() if k != "minutes"} for e in log]


def test_resume_after_an_interruption_reaches_the_uninterrupted_weights(tmp_path):
    whole = Task(seed=0)
    whole.make_loop(tmp_path / "whole", checkpoint_every=2).run(progress=False)

    broken = Task(seed=0, interrupt_at=8)  # stops while drawing the 8th batch; the last checkpoint is at step 6
    with pytest.raises(Interrupted):
        broken.make_loop(tmp_path / "broken", checkpoint_every=2).run(progress=False)
    torch.manual_seed(123)  # the global generator moved on meanwhile; the state file brings it back
    again = Task(seed=5)  # other initial weights, overwritten by the checkpoint
    loop = again.make_loop(tmp_path / "broken", checkpoint_every=2)
    assert loop.resume() and loop.step == 6 and [e["step"] for e in loop.log] == [4]
    loop.run(progress=False)

    assert torch.equal(again.model.weight, whole.model.weight) and torch.equal(again.model.bias, whole.model.bias)
    assert again.losses == whole.losses[6:]
    assert without_minutes(loop.log) == without_minutes(whole.loop.log)
    assert whole.losses[-1] < 0.2 * whole.losses[0]  # and it does learn


def test_no_state_file_without_keep_state_and_nothing_to_resume(tmp_path):
    task = Task()
    loop = task.make_loop(tmp_path, keep_state=False, steps=4)
    assert not loop.resume()
    loop.run(progress=False)
    assert not (tmp_path / STATE_FILE).exists() and (tmp_path / LOG_FILE).exists()


def test_time_budget_stops_training_and_writes_a_checkpoint(tmp_path):
    task = Task()
    log = task.make_loop(tmp_path, steps=1000, max_minutes=0.0).run(progress=False)
    assert task.loop.step == 1 and [e["step"] for e in log] == [1]  # evaluated at the stop
    assert task.saves == [1] and (tmp_path / STATE_FILE).exists()
    assert torch.load(tmp_path / STATE_FILE, weights_only=False)["step"] == 1
    assert not task.model.training


def test_evaluation_and_checkpoints_at_their_intervals(tmp_path):
    task = Task()
    task.make_loop(tmp_path, steps=10, eval_every=3, checkpoint_every=5).run(progress=False)
    assert [step for step, *_ in task.evals] == [3, 6, 9, 10]  # and at the last step
    assert all(not training and not grad for _, training, grad in task.evals)  # eval mode, no gradients
    assert task.saves == [5, 10]
    assert task.calls == 10


def test_the_log_records_what_it_says(tmp_path):
    task = Task()
    log = task.make_loop(tmp_path, steps=8, eval_every=2).run(progress=False)
    assert [e["step"] for e in log] == [2, 4, 6, 8]
    for e in log:
        assert set(e) == {"step", "train_loss", "heldout_mse", "minutes"}
        assert e["train_loss"] == task.losses[e["step"] - 1]  # the loss of that very step
    assert [e["heldout_mse"] for e in log] == pytest.approx(sorted((e["heldout_mse"] for e in log), reverse=True))
    assert all(a["minutes"] <= b["minutes"] for a, b in zip(log, log[1:]))
    on_disk = [json.loads(x) for x in (tmp_path / LOG_FILE).read_text().splitlines()]
    assert on_disk == log


def test_learning_rate_follows_warmup_then_cosine(tmp_path):
    task = Task()
    task.make_loop(tmp_path, steps=12, warmup=3, lr=0.05).run(progress=False)
    assert task.lrs == pytest.approx([0.05 * warmup_cosine(s, 3, 12) for s in range(12)])
    assert task.lrs[0] == pytest.approx(0.05 / 3 * 0.5 * (1 + math.cos(0)))
    assert max(task.lrs) == task.lrs[2] and task.lrs[-1] < 0.02 * 0.05


def test_heldout_split_and_mean_over_chunks():
    from specdec_lite.train.loop import heldout_split, mean_over_chunks

    g = torch.Generator().manual_seed(0)
    held, train = heldout_split(10, 0.2, g)
    assert len(held) == 2 and sorted(held + train) == list(range(10))
    assert heldout_split(10, 0.2, torch.Generator().manual_seed(0)) == (held, train)  # the seed decides the split
    assert len(heldout_split(3, 0.01, g)[0]) == 1  # at least one record is held out
    # chunks [0, 1], [2, 3], [4] weigh the same: mean of (0.5, 2.5, 4) and of (1, 1, 1)
    means = mean_over_chunks([0, 1, 2, 3, 4], 2, lambda rows: {"x": sum(rows) / len(rows), "n": 1})
    assert means == {"x": pytest.approx(7 / 3), "n": 1.0}
