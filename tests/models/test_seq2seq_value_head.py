"""AutoModelForSeq2SeqLMWithValueHead (TRL v0.7.1's encoder-decoder value head) on a tiny T5 built from a config."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, T5Config, T5ForConditionalGeneration

from replayrl import AutoModelForSeq2SeqLMWithValueHead, PPOConfig, PPOTrainer, create_reference_model

ENC = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 1]])
DEC = torch.tensor([[0, 12, 13], [0, 14, 15]])


def tiny_t5(seed=0):
    config = T5Config(
        vocab_size=64, d_model=32, d_ff=64, d_kv=16, num_layers=1, num_decoder_layers=1, num_heads=2,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    return T5ForConditionalGeneration(config)


def test_forward_values_are_the_head_on_the_decoder_states():
    model = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tiny_t5(), v_head_init_strategy="normal").eval()
    logits, loss, value = model(input_ids=ENC, attention_mask=torch.ones_like(ENC), decoder_input_ids=DEC)
    assert logits.shape == (2, 3, 64) and logits.dtype == torch.float32 and loss is None
    assert value.shape == (2, 3)  # one value per decoder position
    out = model.pretrained_model(input_ids=ENC, decoder_input_ids=DEC, output_hidden_states=True)
    torch.testing.assert_close(value, model.v_head.summary(out.decoder_hidden_states[-1]).squeeze(-1))
    _, loss, _ = model(input_ids=ENC, labels=DEC)
    assert loss is not None and loss.item() > 0


def test_save_load_round_trip_and_plain_seq2seq_loading(tmp_path):
    model = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tiny_t5(), v_head_init_strategy="normal").eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(str(tmp_path)).eval()
    assert isinstance(loaded.pretrained_model, T5ForConditionalGeneration)
    torch.testing.assert_close(loaded.v_head.summary.weight, model.v_head.summary.weight)
    a = model(input_ids=ENC, decoder_input_ids=DEC)
    b = loaded(input_ids=ENC, decoder_input_ids=DEC)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[2], b[2])
    plain = AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path))  # the head is ignored by a plain model
    torch.testing.assert_close(plain(input_ids=ENC, decoder_input_ids=DEC).logits, a[0])


def test_generate_and_reference_model():
    model = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tiny_t5())
    out = model.generate(input_ids=ENC, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= 5 and (out[:, 0] == 0).all()  # starts with decoder_start
    ref = create_reference_model(model)
    assert all(not p.requires_grad for p in ref.parameters())
    torch.testing.assert_close(
        ref.eval()(input_ids=ENC, decoder_input_ids=DEC)[2], model.eval()(input_ids=ENC, decoder_input_ids=DEC)[2]
    )


def _t5_trainer(tokenizer, **config):
    model = AutoModelForSeq2SeqLMWithValueHead(tiny_t5(), summary_dropout_prob=0.0)
    with pytest.warns(UserWarning, match="No dataset is provided"):
        return PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1, **config), model, None, tokenizer)


def test_ppo_step_trains_an_encoder_decoder_on_its_response_tokens(tokenizer):
    """TRL v0.7.1's encoder-decoder PPO: queries to the encoder, responses (decoder start first) to the decoder;
    the log-probs are those of each response token after the start token, read off the decoder's own logits."""
    trainer = _t5_trainer(tokenizer, ppo_epochs=1)
    model = trainer.model
    queries = [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10])]
    responses = [torch.tensor([0, 12, 13, 14]), torch.tensor([15, 16])]  # the second without the start token
    inputs = trainer.prepare_model_inputs(queries, responses)
    assert inputs["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]  # encoder ids right-padded
    assert inputs["decoder_input_ids"].tolist() == [[0, 12, 13, 14], [0, 15, 16, 0]]  # start token prepended
    logprobs, logits, values, mask = trainer.batched_forward_pass(model, queries, responses, inputs, True)
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]] and logits.shape == (2, 3, 64)
    for i, decoder_ids in enumerate([[0, 12, 13, 14], [0, 15, 16]]):
        d = torch.tensor([decoder_ids])
        ref_logits, _, ref_values = model.eval()(input_ids=queries[i][None], decoder_input_ids=d)
        want = torch.log_softmax(ref_logits[0, :-1], -1).gather(-1, d[0, 1:, None]).squeeze(-1)
        n = d.shape[1] - 1
        torch.testing.assert_close(logprobs[i, :n], want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(values[i, :n], ref_values[0, :-1], rtol=1e-4, atol=1e-5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = trainer.step(queries, responses, [torch.tensor(1.0), torch.tensor(-1.0)])
    assert stats["objective/kl"] == 0.0 and stats["ppo/mean_scores"] == 0.0  # first step: policy == reference
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert any("v_head" in n for n in changed) and any("decoder" in n for n in changed)
    assert all(p.grad is None for p in trainer.ref_model.parameters())


def test_ppo_generate_of_an_encoder_decoder_returns_decoder_ids(tokenizer):
    trainer = _t5_trainer(tokenizer)
    queries = [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10])]
    kwargs = dict(max_new_tokens=3, do_sample=False)
    batched = trainer.generate(queries, batch_size=2, **kwargs)
    single = [trainer.generate(q, **kwargs)[0] for q in queries]
    for b, s in zip(batched, single):
        assert b[0] == 0 and torch.equal(b, s[: len(b)])  # start token first; same ids as one by one
    with pytest.raises(ValueError, match="train\\(\\) samples with decoder-only generation"):
        trainer.train(lambda completions, **kw: [0.0] * len(completions))


def test_trl_v071_class_attributes_errors_and_generate_with_decoder_ids(tmp_path):
    """As TRL v0.7.1's value-head tests use them: the parent class reloads the saved folder (sharded), a model
    without an LM head (`T5Model`) is refused, and `generate` takes `decoder_input_ids` and a GenerationConfig."""
    from transformers import GenerationConfig, T5Model

    cls = AutoModelForSeq2SeqLMWithValueHead
    assert cls.transformers_parent_class is AutoModelForSeq2SeqLM and "lm_head" in cls.lm_head_namings
    model = cls.from_pretrained(tiny_t5(), v_head_init_strategy="normal").eval()
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    plain = cls.transformers_parent_class.from_pretrained(tmp_path)
    for key, value in model.pretrained_model.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[key], value)
    torch.testing.assert_close(cls.from_pretrained(str(tmp_path)).v_head.summary.bias, model.v_head.summary.bias)
    with pytest.raises(ValueError, match="T5Model has no language-model head.*AutoModelForSeq2SeqLM"):
        cls.from_pretrained(T5Model(tiny_t5().config))
    out = model.generate(ENC, decoder_input_ids=DEC, generation_config=GenerationConfig(max_new_tokens=3))
    assert out.shape == (2, 6) and torch.equal(out[:, :3], DEC)
