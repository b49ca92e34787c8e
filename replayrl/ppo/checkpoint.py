"""PPO checkpoints: ``output_dir/checkpoint-N/`` holds the model (value head under ``v_head.*``, loadable with
`AutoModelForCausalLMWithValueHead.from_pretrained`), the tokenizer, and per process the extra state (optimizer,
LR scheduler, KL controller, score statistics, RNG streams, step) through `replayrl.checkpoints`: no pickle,
atomic files, a completeness marker written last. Resuming from one continues exactly as the uninterrupted run.
Under DeepSpeed the engine writes its own checkpoint of the model and optimizer partitions (``global_step<N>/``,
as transformers' Trainer does) in place of the optimizer entry, and the model folder holds whole weights gathered
from ZeRO-3's partitions. Under FSDP2 the model folder holds the whole weights too (gathered, as accelerate's
``FULL_STATE_DICT``), and each process's state file its shard of the optimizer state (accelerate's sharded optimizer
state, in safetensors): on resume each process slices its shard of the weights from the whole ones and takes its
optimizer shard back (`replayrl.models.sharding.local_optimizer_state`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from replayrl.checkpoints import (
    check_settings,
    load_extra_state,
    mark_complete,
    rng_state,
    save_extra_state,
    set_rng_state,
)
from replayrl.models.sharding import (
    full_state_dict,
    is_sharded,
    load_full_state_dict,
    local_optimizer_state,
    sharded_optimizer_state,
)

STATE_NAME = "ppo_state_rank{rank}"


def settings(trainer) -> dict:
    """What the saved state depends on; a resume with other values is refused."""
    config = trainer.config
    return {
        "trainer": "PPOTrainer",
        "batch_size": config.batch_size,
        "mini_batch_size": config.mini_batch_size,
        "world_size": trainer.accelerator.num_processes,
        "seed": config.seed,
    }


def save_checkpoint(trainer, output_dir: str | Path, step: int) -> Path:
    """Write ``output_dir/checkpoint-{step}`` (all processes call this)."""
    accelerator = trainer.accelerator
    directory = Path(output_dir) / f"checkpoint-{step}"
    save_model(trainer, directory)
    if trainer.is_deepspeed:  # every process writes its partitions of the model and optimizer
        trainer.model.save_checkpoint(str(directory), tag=f"global_step{step}")
    state = {
        "step": step,
        "optimizer": None if trainer.is_deepspeed else local_optimizer_state(trainer.optimizer),
        "lr_scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None,
        "kl_ctl": trainer.kl_ctl.state_dict(),
        "running": trainer.running.state_dict(),
        "shuffle_generator": trainer.shuffle_generator.get_state(),
        "rng": rng_state(),
    }
    save_extra_state(directory, STATE_NAME.format(rank=accelerator.process_index), state)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        mark_complete(directory, settings(trainer))
    accelerator.wait_for_everyone()
    return directory


def save_model(trainer, directory: str | Path) -> None:
    """The policy (with its value head) and the tokenizer into ``directory``. All processes call this: under
    ZeRO-3 and FSDP2 the whole weights are gathered from every process's shards first."""
    accelerator = trainer.accelerator
    model = accelerator.unwrap_model(trainer.model)
    state = full_state_dict(model) if is_sharded(model) else None
    if accelerator.is_main_process:
        model.save_pretrained(directory, state_dict=state)
        trainer.tokenizer.save_pretrained(directory)


def load_checkpoint(trainer, directory: Path) -> int:
    """Restore everything `save_checkpoint` wrote; returns the step to continue from."""
    check_settings(directory, settings(trainer), adaptable=set())
    state = load_extra_state(directory, STATE_NAME.format(rank=trainer.accelerator.process_index))
    if trainer.is_deepspeed:  # the engine's own checkpoint: model and optimizer partitions
        tag = f"global_step{int(state['step'])}"
        trainer.model.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True)
    else:
        _load_model_weights(trainer.accelerator.unwrap_model(trainer.model), directory)
        trainer.optimizer.load_state_dict(sharded_optimizer_state(trainer.optimizer, state["optimizer"]))
    if trainer.lr_scheduler is not None and state["lr_scheduler"] is not None:
        trainer.lr_scheduler.load_state_dict(state["lr_scheduler"])
    trainer.kl_ctl.load_state_dict(state["kl_ctl"])
    trainer.running.load_state_dict(state["running"])
    trainer.shuffle_generator.set_state(state["shuffle_generator"])
    set_rng_state(state["rng"])
    trainer.current_step = int(state["step"])
    return int(state["step"])


@torch.no_grad()
def _load_model_weights(model, directory: Path) -> None:
    """Weights saved by `AutoModelForCausalLMWithValueHead.save_pretrained` back into ``model`` in place (under
    FSDP2 each process keeps its shard of them)."""
    from safetensors.torch import load_file

    from replayrl.models.value_head import HEAD_PREFIX, PEFT_HEAD_FILE

    if model.is_peft_model:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model.pretrained_model, load_file(str(directory / "adapter_model.safetensors")))
        state = load_file(str(directory / PEFT_HEAD_FILE))
    else:
        files = sorted(directory.glob("model*.safetensors"))
        state = {k: v for f in files for k, v in load_file(str(f)).items()}
        base = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIX)}
        missing, unexpected = load_full_state_dict(model.pretrained_model, base, strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise ValueError(f"checkpoint {directory} does not match the model: missing {missing}, extra {unexpected}")
    head = {k.removeprefix(HEAD_PREFIX): v for k, v in state.items() if k.startswith(HEAD_PREFIX)}
    load_full_state_dict(model.v_head, head)
