"""Every trainer under DeepSpeed ZeRO-2, ZeRO-3 and FSDP2 with two CPU processes (gloo) matches one process on the
same global batch: the trainers' own "2 processes == 1" checks (tests/<trainer>/test_distributed.py, same
tolerances: losses rel 1e-4 / abs 1e-5, parameters rtol 1e-4 / atol 1e-6) applied to runs under each strategy.

One `accelerate launch` per strategy runs all the trainers' workers in turn (tests/distributed/worker.py); the
checks then run the single-process side here. Under ZeRO-3 every parameter is partitioned (each process holds half
of the elements, the reference model's too); under FSDP2 every parameter is a DTensor (accelerate's FSDP2 path
let through on CPU by the test-only patch, docs/distributed.md). Skipped where DeepSpeed is not installed.
Exact resume under each strategy: tests/distributed/test_resume.py (marker `distributed_resume`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.launch import launch_strategy, strategy_flags
from tests.distributed.worker import BY_HAND, RESUMES, WORKERS

WORKER = Path(__file__).with_name("worker.py")
PORTS = {"zero2": 29651, "zero3": 29653, "fsdp2": 29655}
DEEPSPEED = {"zero2", "zero3"}


@pytest.fixture(scope="module", params=["zero2", "zero3", "fsdp2"])
def launched(request, tmp_path_factory) -> tuple[str, dict]:
    strategy = request.param
    if strategy in DEEPSPEED:
        pytest.importorskip("deepspeed", reason="DeepSpeed runs need `pip install replayrl[deepspeed]`")
    skip = {"zero2": {"grpo_no_gather"}, "zero3": set(), "fsdp2": {"grpo_no_gather"}}  # a ZeRO-3 setting
    names = [n for n in WORKERS if n not in skip[strategy] and WORKERS[n] not in (*BY_HAND, *RESUMES)]
    out = tmp_path_factory.mktemp(strategy)
    return strategy, launch_strategy(strategy, WORKER, out, PORTS[strategy], *names)


def assert_sharded(strategy: str, report: dict) -> None:
    """ZeRO-3 / FSDP2: this process holds about half of the elements; ZeRO-2 / DDP: all of them."""
    if strategy in ("zero3", "fsdp2"):
        assert report["local"] <= 0.55 * report["whole"], report
    else:
        assert report["local"] == report["whole"], report


@pytest.mark.slow
def test_grpo(launched, tokenizer, tmp_path):
    from tests.grpo.test_distributed import check_grpo_step

    strategy, results = launched
    assert_sharded(strategy, results["grpo"]["sharding"])
    check_grpo_step(results["grpo"], tokenizer, tmp_path)


@pytest.mark.slow
def test_grpo_zero3_generation_with_and_without_gathering(launched, tokenizer, tmp_path):
    """ds3_gather_for_generation True (weights gathered once per generation batch) and False (synced_gpus,
    weights fetched layer by layer): the same completions for the same seed, and each run matches one process."""
    from tests.grpo.test_distributed import check_grpo_step

    strategy, results = launched
    if strategy != "zero3":
        pytest.skip("ds3_gather_for_generation is a ZeRO-3 setting")
    gathered, fetched = results["grpo"], results["grpo_no_gather"]
    whole = gathered["sharding"]["whole"]
    assert gathered["held_while_generating"] == [whole]  # gathered once for the generation batch
    assert fetched["held_while_generating"] == [0]  # partitioned: ZeRO-3 fetches each layer inside its forward
    assert_sharded(strategy, gathered["ref_sharding"])  # the reference is a partitioned inference engine
    for rank_a, rank_b in zip(gathered["batches"], fetched["batches"], strict=True):
        for a, b in zip(rank_a, rank_b, strict=True):
            torch.testing.assert_close(a["completion_ids"], b["completion_ids"], rtol=0, atol=0)
    check_grpo_step(fetched, tokenizer, tmp_path)


@pytest.mark.slow
def test_dpo(launched, tmp_path):
    from tests.dpo.test_distributed import check_two_equal_one

    strategy, results = launched
    assert_sharded(strategy, results["dpo"]["sharding"])
    check_two_equal_one(results["dpo"], tmp_path)


@pytest.mark.slow
def test_dpo_with_a_moving_reference(launched, tmp_path):
    """TR-DPO (`sync_ref_model`): under ZeRO-3 the reference is a partitioned inference engine whose parameters are
    gathered, moved towards the policy on rank 0 and partitioned again after every step; two steps' losses (abs
    1e-5), the policy and the moved reference (rtol 1e-4, atol 1e-6) equal one process's."""
    from tests.distributed.worker import TR_DPO
    from tests.dpo.distributed_worker import result, run

    strategy, results = launched
    two = results["dpo_sync_ref"]
    assert_sharded(strategy, two["sharding"])
    if strategy == "zero3":
        assert_sharded(strategy, two["ref_sharding"])
    one = result(run(str(tmp_path / "single"), per_device_batch=8, **TR_DPO))
    assert len(two["losses"]) == len(one["losses"]) == 2
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-5)
    for key in ("params", "ref_params"):
        assert len(two[key]) == len(one[key])
        for a, b in zip(two[key], one[key]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_reward(launched, tmp_path):
    from tests.reward.test_distributed import check_two_equal_one

    strategy, results = launched
    assert_sharded(strategy, results["reward"]["sharding"])
    check_two_equal_one(results["reward"], tmp_path)


@pytest.mark.slow
def test_rloo(launched, tokenizer, tmp_path):
    from tests.rloo.test_distributed import check_two_equal_one

    strategy, results = launched
    assert_sharded(strategy, results["rloo"]["sharding"])
    check_two_equal_one(results["rloo"], tokenizer, tmp_path)


@pytest.mark.slow
def test_kto(launched, tokenizer, tmp_path):
    from tests.kto.test_distributed import check_two_equal_one

    strategy, results = launched
    assert_sharded(strategy, results["kto"]["sharding"])
    check_two_equal_one(results["kto"], tokenizer, tmp_path)


@pytest.mark.slow
def test_sft(launched, tmp_path):
    from tests.sft.test_distributed import check_two_equal_one

    strategy, results = launched
    assert_sharded(strategy, results["sft"]["sharding"])
    check_two_equal_one(results["sft"], tmp_path)


@pytest.mark.slow
def test_distillation(launched, tokenizer, tmp_path):
    from tests.distillation.test_distributed import check_two_equal_one

    strategy, results = launched
    assert_sharded(strategy, results["distillation"]["sharding"])
    if strategy == "zero3":  # the teacher is a partitioned inference engine, never trained
        assert_sharded(strategy, results["distillation"]["teacher_sharding"])
    check_two_equal_one(results["distillation"], tokenizer, tmp_path)


@pytest.mark.slow
def test_builtin_grpo_job_under_the_shipped_zero3_yaml(tmp_path):
    """docs/distributed.md's CPU command: the shipped deepspeed_zero3.yaml as is, with the CPU overrides
    (--num_processes 2 --mixed_precision no; --use_cpu false --ddp_backend gloo; DS_ACCELERATOR=cpu)."""
    import subprocess
    import sys

    pytest.importorskip("deepspeed", reason="DeepSpeed runs need `pip install replayrl[deepspeed]`")
    from tests.grpo.test_fsdp import CONFIGS

    out = tmp_path / "run"
    env = strategy_flags("zero3", tmp_path)[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "deepspeed_zero3.yaml")]
    cmd += ["--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "29671", "-m", "replayrl"]
    cmd += ["grpo", "--max_steps", "1", "--save_steps", "1", "--use_cpu", "false", "--ddp_backend", "gloo"]
    proc = subprocess.run([*cmd, "--output_dir", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("replayrl grpo: done") == 1  # one run, summarised by the main process
    checkpoint = out / "checkpoint-1"
    assert (checkpoint / "replayrl_complete.json").exists() and (checkpoint / "model.safetensors").exists()
    assert len(list(checkpoint.glob("global_step1/zero_pp_rank_*_optim_states.pt"))) == 2  # ZeRO's partitions
    assert len(list(checkpoint.glob("replayrl_state_rank*.json"))) == 2


@pytest.mark.slow
def test_grpo_with_a_lora_adapter(launched, tokenizer, tmp_path):
    """PEFT under each strategy: the adapter's update equals one process's on the same global batch (rtol 1e-4,
    atol 1e-6), the frozen base weights stay as they were, the loss matches (rel 1e-4)."""
    from peft import LoraConfig

    from replayrl import GRPOConfig, GRPOTrainer
    from replayrl.grpo.rollout import Rollout
    from replayrl.models.tiny import build_tiny_model, prompt_dataset
    from tests.conftest import tiny_args

    strategy, results = launched
    result = results["grpo_peft"]
    rows = [Rollout.from_state_dict(mb) for rank in result["batches"] for mb in rank]
    batch = Rollout.concat(rows).with_(old_logps=None, loss_weights=None)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = tiny_args(GRPOConfig, tmp_path, per_device_train_batch_size=8, beta=0.1)
    torch.manual_seed(0)  # as the worker: the same LoRA A matrices
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=prompt_dataset(8), processing_class=tokenizer,
                          peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    params = list(trainer.model.parameters())
    init = [p.detach().clone() for p in params]
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, trainer._finalize_rollout(batch))
    loss.backward()
    assert loss.item() == pytest.approx(result["loss"], rel=1e-4, abs=1e-6)
    assert len(result["params"]) == len(params) and sum(p.requires_grad for p in params) == 4
    for p0, p, after in zip(init, params, result["params"]):
        torch.testing.assert_close(p0 - p.grad if p.requires_grad else p0, after, rtol=1e-4, atol=1e-6)
    assert any(p.requires_grad and not torch.equal(p0, after) for p0, p, after in zip(init, params, result["params"]))


def check_ppo_step(two: dict, one: dict) -> None:
    """PPO's "2 processes == 1" check (tests/ppo/test_distributed.py's tolerances): losses abs 1e-5, parameters
    after the step's 2 Adam steps rtol 1e-4 / atol 1e-5."""
    for key, value in one["stats"].items():
        assert two["stats"][key] == pytest.approx(value, abs=1e-5), key
    assert two["params"].keys() == one["params"].keys()
    for name, tensor in one["params"].items():
        torch.testing.assert_close(two["params"][name], tensor, atol=1e-5, rtol=1e-4, msg=name)
    moved = [name for name, t in one["params"].items() if not torch.equal(t, two["params"][name])]
    assert moved  # trained (vs a start both runs would share)


@pytest.mark.slow
def test_ppo(launched, tmp_path):
    """PPOTrainer.step (its own Accelerator and loop): under ZeRO-2/3 the engine accumulates, clips and steps,
    under ZeRO-3 the reference is a partitioned inference engine; the update equals one process's. Sampling with
    the policy's weights gathered (ds3_gather_for_generation=True) and partitioned gives the same completions."""
    from tests.ppo.dist_step import run

    strategy, results = launched
    two = results["ppo"]
    assert_sharded(strategy, two["sharding"])
    if strategy == "zero3":
        assert_sharded(strategy, two["ref_sharding"])
    if strategy in DEEPSPEED:
        assert two["optimizer_steps"] == 2  # ppo_epochs=2, one optimizer step per epoch
    check_ppo_step(two, run(str(tmp_path)))
    for name, tensor in two["params"].items():  # the saved model: whole weights (gathered under ZeRO-3 / FSDP2)
        assert torch.equal(two["saved"][name.removeprefix("pretrained_model.")], tensor), name
    gathered, partitioned = two["completions"][True], two["completions"][False]
    assert len(gathered) == 2 and all(len(c) > 0 for c in gathered)
    for a, b in zip(gathered, partitioned, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_ppo_gradient_accumulation(launched, tmp_path):
    """gradient_accumulation_steps=2 (2-row mini-batches of equal length on each process): one optimizer step per
    2 mini-batches, at PPO's boundary (DeepSpeed's engine told by `set_gradient_accumulation_boundary`), so the
    update equals one process taking all 8 rows at once. SGD (lr 1): Adam would turn the rounding noise of
    near-zero gradients (summed in another order) into lr-sized moves."""
    from tests.ppo.dist_step import run

    strategy, results = launched
    two = results["ppo_accumulate"]
    if strategy in DEEPSPEED:
        assert two["optimizer_steps"] == 2  # not 4: the first mini-batch of each epoch only accumulates
    check_ppo_step(two, run(str(tmp_path), equal_lengths=True, sgd=True))


@pytest.mark.slow
def test_grpo_with_a_reward_model(launched, tokenizer, tmp_path):
    """A reward model in reward_funcs: under ZeRO-3 a partitioned inference engine as in TRL (each process holds at
    most 0.55 of its elements); on every strategy its scores on each process's completions equal one process's
    (rel 1e-5), and the step matches one process."""
    from replayrl.models.tiny import build_tiny_sequence_classifier
    from replayrl.rewards.functions import RewardFunctions
    from tests.distributed.worker import REWARD_MODEL
    from tests.grpo.test_distributed import check_grpo_step

    strategy, results = launched
    result = results["grpo_reward_model"]
    (report,) = result["reward_model_sharding"]
    if strategy == "zero3":
        assert report["local"] <= 0.55 * report["whole"], report
    classifier = build_tiny_sequence_classifier(tokenizer, seed=3, **REWARD_MODEL).eval()
    funcs = RewardFunctions([classifier], [tokenizer])
    assert result["reward_model_scores"]  # scored on rank 0
    for prompts, completions, scores in result["reward_model_scores"]:
        assert scores == pytest.approx(funcs._score_with_model(classifier, tokenizer, prompts, completions), rel=1e-5)
    check_grpo_step(result, tokenizer, tmp_path)
