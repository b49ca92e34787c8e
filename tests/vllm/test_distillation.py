"""DistillationTrainer through `train()` with vLLM colocate on CPU: the student's completions come from the engine,
whose weights follow the student (each step's engine log-probs equal the student's own at that step)."""

import torch

from replayrl import DistillationConfig, DistillationTrainer
from replayrl.models.tiny import prompt_dataset, save_tiny


def _student_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """log pi_student(completion token) at every completion position, (N, C); the engine's are processed with
    temperature 1, so these are comparable."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt_ids.shape[1] - 1 : -1]
    return logits.float().log_softmax(-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def test_distillation_colocate_generates_with_the_current_student(tmp_path, vllm_model_dir):
    teacher = save_tiny(tmp_path / "teacher", hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, seed=1)
    args = DistillationConfig(output_dir=str(tmp_path / "out"), use_vllm=True, vllm_mode="colocate",
                              per_device_train_batch_size=8, max_completion_length=6, max_steps=4, learning_rate=5e-2,
                              logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
                              gradient_checkpointing=False, disable_tqdm=True, seed=0)  # fmt: skip
    trainer = DistillationTrainer(vllm_model_dir, teacher_model=teacher, args=args, train_dataset=prompt_dataset(32))
    generate, gaps = trainer.generator.generate, []

    def checked_generate(prompt_ids, prompt_mask):
        out = generate(prompt_ids, prompt_mask)
        ours = _student_logps(trainer.model, prompt_ids, prompt_mask, out.completion_ids, out.completion_mask)
        real = out.completion_mask.bool()
        gaps.append((ours[real] - out.logps[real]).abs().max().item())
        return out

    trainer.generator.generate = checked_generate
    try:
        start = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train()
    finally:
        trainer.generator.close()
    assert len(gaps) == 4  # one generation call per optimizer step
    assert max(gaps) < 1e-3, gaps  # a stale engine (weights of an earlier step) would be far off at lr 5e-2
    assert any(not torch.equal(a, b) for a, b in zip(start, trainer.model.parameters()))
    divergences = [log["divergence"] for log in trainer.state.log_history if "divergence" in log]
    assert len(divergences) == 4 and all(d >= 0 for d in divergences)
