"""GRPO's (and so RLOO's) prompt ids are TRL 1.16's with a Llama-style tokenizer (a BOS): plain-text prompts are
tokenized with the tokenizer's special tokens (BOS first, TRL 1.16's `processing_class(text=prompts)`);
conversational prompts carry the chat template's own BOS, once. The tiny BOS tokenizer: `<s>` = 101."""

from replayrl.models.tiny import build_tiny_model
from tests.grpo.test_trainer import make_trainer, varied_reward

BOS = 101


def real_prompts(trainer) -> list[list[int]]:
    mb = trainer._micro_batches[0]
    return [ids[mask.bool()].tolist() for ids, mask in zip(mb.prompt_ids, mb.prompt_mask)]


def test_text_prompts_start_with_bos(bos_tokenizer, dataset, tmp_path):
    model = build_tiny_model(bos_tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    trainer = make_trainer(model, bos_tokenizer, dataset, tmp_path, max_steps=1, max_prompt_length=None)
    trainer.train()
    texts = {tuple(bos_tokenizer(p, add_special_tokens=False).input_ids) for p in dataset["prompt"]}
    for ids in real_prompts(trainer):
        assert ids[0] == BOS and ids.count(BOS) == 1
        assert tuple(ids[1:]) in texts  # the prompt's own ids after the BOS


def test_conversational_prompts_carry_the_templates_bos_once(bos_tokenizer, chat_dataset, tmp_path):
    model = build_tiny_model(bos_tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)

    def reward(completions, **kwargs):
        return varied_reward([c[0]["content"] for c in completions])

    trainer = make_trainer(model, bos_tokenizer, chat_dataset, tmp_path, reward=reward, max_steps=1,
                           max_prompt_length=None)  # fmt: skip
    trainer.train()
    for ids in real_prompts(trainer):
        assert ids[0] == BOS and ids.count(BOS) == 1
