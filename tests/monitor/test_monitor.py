"""The training-loop monitor, tested by training organisms with it (framework-free and under TRL).

Every value is checked against the Hugging Face model's own forward at the step it was taken,
and "leaves the model alone" against a second training run without the monitor."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from rewardlens import Pair, lens, wrap
from rewardlens.errors import DataError
from rewardlens.monitor import METRICS, Monitor, Trajectory
from rewardlens.zoo.organisms import ORGANISMS
from rewardlens.zoo.organisms._train import encode, organism_tokenizer, train
from tests.helpers import tiny

STEPS, EVERY = 30, 10
SPEC = ORGANISMS["list"]  # rule: the chosen answer is a bullet list
WATCH = SPEC.pairs(24, seed=11, strength=1.0)


def own_rewards(model, tok, pairs) -> np.ndarray:
    """[2n] rewards from the model's own forward, one unpadded sequence at a time (chosen, rejected)."""
    training = model.training
    model.eval()
    with torch.no_grad():
        out = [float(model(input_ids=torch.tensor([ids])).logits[0, 0]) for p in pairs for ids in encode(tok, p)]
    model.train(training)
    return np.array(out)


def all_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Train the list organism for STEPS steps with a monitor; record, at every snapshot, the model's
    own rewards and whether the snapshot left weights, grads, hooks and train mode as they were."""
    path = tmp_path_factory.mktemp("monitor") / "run" / "snapshots.jsonl"
    mon = Monitor(WATCH, every=EVERY, probes=["formatting", "length"], probe_items=6, path=path)
    seen = {}

    def callback(model, tok, step):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        hooks = all_hooks(model)
        snap = mon(model, tok, step)
        if snap is not None:
            seen[step] = {
                "own": own_rewards(model, tok, WATCH), "training": model.training,
                "unchanged": all(torch.equal(before[k], v) for k, v in model.state_dict().items()),
                "hooks": all_hooks(model) - hooks, "grads": [p.grad for p in model.parameters() if p.grad is not None],
            }

    model, tok, _ = train(SPEC, 1.0, seed=3, steps=STEPS, callback=callback)
    return mon, seen, model, tok, path


def test_one_snapshot_every_n_steps_from_the_initial_model(run):
    mon, seen, *_ = run
    traj = mon.trajectory
    assert list(traj.steps) == list(range(0, STEPS + 1, EVERY)) == sorted(seen)
    assert len(traj) == STEPS // EVERY + 1  # the initial model, then every EVERY steps
    assert traj.values.shape == (len(traj), len(METRICS)) and traj.rewards.shape == (len(traj), 2 * len(WATCH))


def test_lens_final_value_is_the_models_own_reward_at_that_step(run):
    mon, seen, *_ = run
    traj = mon.trajectory
    for i, step in enumerate(traj.steps):
        own = seen[step]["own"]
        np.testing.assert_allclose(traj.rewards[i], own, atol=1e-4 * max(1.0, np.abs(own).max()))
        margin = own[0::2] - own[1::2]
        assert traj["margin"][i] == pytest.approx(margin.mean(), abs=1e-4)
        assert traj["accuracy"][i] == pytest.approx(np.mean(margin > 0))
    # Consecutive snapshots see different models: a stale fp32 head copy would repeat the first.
    assert not np.allclose(traj.rewards[0], traj.rewards[-1])


def test_planted_rule_is_learned_between_the_first_and_last_snapshot(run):
    traj = run[0].trajectory
    assert traj["accuracy"][-1] > traj["accuracy"][0] and traj["accuracy"][-1] >= 0.95
    assert traj["margin"][-1] > traj["margin"][0] + 1.0
    # The formatting probe (same sentences as a list, against prose) is the planted rule itself.
    assert traj["probe/formatting"][-1] > traj["probe/formatting"][0] + 0.5


def test_snapshots_leave_the_model_as_they_found_it(run):
    _, seen, *_ = run
    for record in seen.values():
        assert record["training"] and record["unchanged"] and record["hooks"] == 0 and record["grads"] == []


def test_training_with_the_monitor_gives_the_same_weights_as_without(run):
    model = run[2]
    plain, _, _ = train(SPEC, 1.0, seed=3, steps=STEPS)
    a, b = model.state_dict(), plain.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_attribution_metrics_close_and_split_the_margin(run):
    traj = run[0].trajectory
    assert np.all(traj["closure_error"] < 1e-4)
    # A plain linear head adds the same constant to both sides: the groups sum to the margin.
    groups = traj["margin_embed"] + traj["margin_attn"] + traj["margin_mlp"]
    np.testing.assert_allclose(groups, traj["margin"], atol=1e-4)
    np.testing.assert_allclose(traj.part_margin.sum(1), traj["margin"], atol=1e-4)
    shares = np.abs(traj["share_embed"]) + np.abs(traj["share_attn"]) + np.abs(traj["share_mlp"])
    np.testing.assert_allclose(shares, 1.0, atol=1e-9)
    top = traj.top(3)
    assert [abs(v) for _, v in top] == sorted((abs(v) for v in traj.part_margin[-1]), reverse=True)[:3]


def test_last_snapshot_matches_a_fresh_lens_of_the_trained_model(run):
    mon, _, model, tok, _ = run
    ln = lens(wrap(model, tok), WATCH)
    traj = mon.trajectory
    for kind in ("linear", "normed"):
        depth = ln.crystallization(kind)
        assert traj[f"crystallization_{kind}"][-1] == pytest.approx(np.median(depth[np.isfinite(depth)]))


def test_jsonl_holds_every_snapshot_and_a_cut_last_line_is_skipped(run, tmp_path):
    mon, _, _, _, path = run
    lines = path.read_text().splitlines()
    assert len(lines) == len(mon.snapshots)
    back, traj = Trajectory.from_jsonl(path), mon.trajectory
    np.testing.assert_array_equal(back.steps, traj.steps)
    np.testing.assert_allclose(back.values, traj.values, equal_nan=True)
    np.testing.assert_allclose(back.probe_effect, traj.probe_effect)
    assert back.parts == traj.parts and back.axes == ("formatting", "length")
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert len(Trajectory.from_jsonl(cut)) == len(lines)
    cut.write_text(lines[0] + "\n{not json\n" + lines[1])
    with pytest.raises(DataError, match="line 2"):
        Trajectory.from_jsonl(cut)


def test_frame_and_plot(run):
    traj = run[0].trajectory
    frame = traj.to_frame()
    assert list(frame.index) == list(traj.steps) and frame.index.name == "step"
    assert list(frame.columns) == list(METRICS) + ["probe/formatting", "probe/length"]
    assert traj.parts_frame().shape == (len(traj), len(traj.parts))
    import matplotlib

    matplotlib.use("Agg")
    fig = traj.plot()
    assert len(fig.axes) == 5  # four panels and accuracy's twin axis


# ---- any device and dtype; nothing is perturbed ---------------------------------------------------

@pytest.fixture()
def tiny_llama():
    tok = organism_tokenizer()
    cls, config = tiny.configs(tok)["llama"]
    config.attention_dropout = 0.5  # a snapshot must not draw from the RNG nor leave dropout off
    torch.manual_seed(0)
    model = cls.from_config(config)
    tiny.perturb_(model, 0)
    return model, tok


def test_snapshot_keeps_rng_dtype_and_each_modules_mode(tiny_llama):
    model, tok = tiny_llama
    model.train()
    model.model.layers[1].eval()  # a module the user froze stays frozen, the others stay in training
    modes = [m.training for m in model.modules()]
    torch.manual_seed(1)
    rng = torch.get_rng_state()
    snap = Monitor(WATCH[:4], every=1).snapshot(model, tok, 7)
    assert torch.equal(torch.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == modes and all_hooks(model) == 0
    np.testing.assert_allclose(snap.rewards, own_rewards(model, tok, WATCH[:4]), atol=1e-4)


def test_bf16_model_is_measured_in_its_own_dtype(tiny_llama):
    model, tok = tiny_llama
    model = model.to(torch.bfloat16).train()
    snap = Monitor(WATCH[:4], every=1).snapshot(model, tok, 0)
    assert next(model.parameters()).dtype == torch.bfloat16 and model.training
    own = own_rewards(model, tok, WATCH[:4])
    np.testing.assert_allclose(snap.rewards, own, atol=5e-2 * max(1.0, np.abs(own).max()))
    assert snap.metrics["closure_error"] < 5e-2 * max(1.0, np.abs(own).max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_model(tiny_llama):
    model, tok = tiny_llama
    model = model.to("cuda", torch.bfloat16).train()
    snap = Monitor(WATCH[:4], every=1).snapshot(model, tok, 0)
    assert next(model.parameters()).device.type == "cuda" and model.training
    assert np.isfinite(snap.rewards).all()


def test_bad_options_are_refused():
    with pytest.raises(DataError, match="rewardlens.Pair"):
        Monitor([], every=1)
    with pytest.raises(DataError, match="got str"):
        Monitor(["a text"], every=1)
    with pytest.raises(ValueError, match="every"):
        Monitor(WATCH, every=0)
    with pytest.raises(ValueError, match="unknown probe axes"):
        Monitor(WATCH, probes=["lenght"])
    with pytest.raises(ValueError, match="neuron"):
        Monitor(WATCH, level="neuron")


# ---- a crash loses nothing; the callback costs nothing until asked for ------------------------------

def test_a_sigkilled_run_keeps_its_snapshots_and_the_import_stays_light(tmp_path):
    """One child process (interpreter start-ups are the slow part): `import rewardlens.monitor`
    pulls in neither transformers' trainer machinery nor TRL; then a training run is SIGKILLed
    after step 5 and every snapshot taken before it must be on disk."""
    path = tmp_path / "snaps.jsonl"
    script = textwrap.dedent(f"""
        import os, signal, sys, torch
        torch.set_num_threads(1)
        import rewardlens, rewardlens.monitor
        heavy = [m for m in ("transformers.trainer_callback", "trl") if m in sys.modules]
        if heavy:
            sys.exit(f"importing rewardlens.monitor imported {{heavy}}")
        from rewardlens.monitor import Monitor
        from rewardlens.zoo.organisms import ORGANISMS
        from rewardlens.zoo.organisms._train import train
        spec = ORGANISMS["list"]
        mon = Monitor(spec.pairs(4, seed=11), every=2, path={str(path)!r})
        def callback(model, tok, step):
            mon(model, tok, step)
            if step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
        train(spec, 1.0, seed=3, steps=20, callback=callback)
    """)
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert list(Trajectory.from_jsonl(path).steps) == [0, 2, 4]


def test_callback_is_a_trainer_callback():
    from transformers import TrainerCallback

    import rewardlens.monitor as m

    assert issubclass(m.RewardLensCallback, TrainerCallback) and m.RewardLensCallback.__module__ == m.__name__
    with pytest.raises(AttributeError, match="no attribute"):
        m.NoSuchThing  # noqa: B018


# ---- TRL's RewardTrainer -------------------------------------------------------------------------

TRL_STEPS, TRL_EVERY = 12, 4


def trl_train(tmp_path, callbacks, *, bf16=False, setup=None):
    """A tiny Llama RM (tests/helpers/tiny.py's config) trained by trl.RewardTrainer on list-organism pairs."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    tok = organism_tokenizer()
    rows = [{"chosen": p.conversation("chosen"), "rejected": p.conversation("rejected")}
            for p in SPEC.pairs(96, seed=21, strength=1.0)]
    cls, config = tiny.configs(tok)["llama"]
    torch.manual_seed(0)
    model = cls.from_config(config)
    args = trl.RewardConfig(
        output_dir=str(tmp_path / "trl"), max_steps=TRL_STEPS, per_device_train_batch_size=8, learning_rate=3e-3,
        logging_steps=TRL_EVERY, report_to=[], use_cpu=True, save_strategy="no", seed=0, bf16=bf16,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = trl.RewardTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                processing_class=tok, callbacks=callbacks)
    if setup is not None:
        setup(trainer)
    trainer.train()
    return trainer, model, tok


def test_trl_reward_trainer_callback(tmp_path):
    from rewardlens.monitor import RewardLensCallback

    cb = RewardLensCallback(WATCH, every=TRL_EVERY, probes=["formatting"], probe_items=6)
    trainer, model, tok = trl_train(tmp_path, [cb])
    traj = cb.trajectory
    assert list(traj.steps) == list(range(0, TRL_STEPS + 1, TRL_EVERY))
    logged = [e for e in trainer.state.log_history if "rewardlens/margin" in e]
    assert [e["step"] for e in logged] == list(traj.steps)
    assert [e["rewardlens/margin"] for e in logged] == list(traj["margin"])
    assert all("rewardlens/probe/formatting" in e for e in logged)
    np.testing.assert_allclose(traj.rewards[-1], own_rewards(model, tok, WATCH), atol=1e-4)
    assert traj["margin"][-1] > traj["margin"][0] + 0.5
    assert traj["probe/formatting"][-1] > traj["probe/formatting"][0]
    _, plain, _ = trl_train(tmp_path / "plain", [])
    a, b = model.state_dict(), plain.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_callback_metrics_go_through_trainer_log(tmp_path):
    """Snapshots off the logging grid make the trainer log at their step, and a reporter (W&B,
    TensorBoard: callbacks that read `logs` in on_log) receives them once the callback is attached."""
    from transformers import TrainerCallback

    from rewardlens.monitor import RewardLensCallback

    seen = {}

    class Reporter(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if "loss" in logs:  # a training-step log, not the end-of-training summary at the same step
                seen[state.global_step] = dict(logs)

    cb = RewardLensCallback(WATCH, every=3, at_start=False)
    trainer, _, _ = trl_train(tmp_path, [Reporter(), cb], setup=cb.attach)
    traj = cb.trajectory
    assert list(traj.steps) == [3, 6, 9, 12]
    assert [seen[s]["rewardlens/margin"] for s in traj.steps] == list(traj["margin"])
    assert set(seen) == {3, 4, 6, 8, 9, 12}  # the trainer's own log calls: its grid and the snapshots' steps
    history = {e["step"]: e for e in trainer.state.log_history if "loss" in e}
    assert [history[s]["rewardlens/accuracy"] for s in traj.steps] == list(traj["accuracy"])


def test_trl_mixed_precision_is_measured_without_autocast(tmp_path):
    """TRL defaults to bf16 autocast (accelerate patches model.forward); the monitor measures the
    fp32 weights themselves and puts the patched forward back."""
    from transformers import TrainerCallback

    from rewardlens.monitor import RewardLensCallback

    checks = []

    class After(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            patched = model.__dict__.get("forward")
            checks.append(patched is not None and patched is not model.__dict__.get("_original_forward"))

    cb = RewardLensCallback(WATCH, every=TRL_EVERY)
    _, model, tok = trl_train(tmp_path, [cb, After()], bf16=True)
    assert checks and all(checks)
    fp32 = model.eval().__dict__["_original_forward"]
    with torch.no_grad():
        exact = [float(fp32(input_ids=torch.tensor([ids])).logits[0, 0]) for p in WATCH for ids in encode(tok, p)]
    np.testing.assert_allclose(cb.trajectory.rewards[-1], exact, atol=1e-4)


def test_callback_needs_a_tokenizer():
    from rewardlens.monitor import RewardLensCallback

    cb = RewardLensCallback([Pair("q", "a", "b")], every=1)

    class State:
        is_world_process_zero, global_step, epoch, log_history = True, 1, None, []

    with pytest.raises(ValueError, match="tokenizer"):
        cb.on_step_end(None, State(), None, model=torch.nn.Linear(1, 1), processing_class=None)
