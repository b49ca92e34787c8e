"""TRL v0.7.1's PPOTrainer API as its own tests use it: a torch Dataset of `(query, response)` tuples batched by
`data_collator=None`, `prepare_model_inputs` / `batched_forward_pass`, and v0.7.1's two UserWarnings."""

import warnings

import pytest
import torch

from replayrl.ppo import PPOConfig, PPOTrainer
from replayrl.ppo.batch import build_batch, forward
from tests.ppo.test_trainer import queries_of, value_model


class PairDataset(torch.utils.data.Dataset):
    """Rows are `(query_tensor, response_tensor)` tuples of equal lengths, as in TRL v0.7.1's `DummyDataset`."""

    def __init__(self, queries, responses):
        self.queries, self.responses = queries, responses

    def __len__(self):
        return len(self.queries)

    def __getitem__(self, i):
        return self.queries[i], self.responses[i]


def test_tuple_dataset_with_default_collation_trains_through_step(tokenizer):
    queries = [torch.tensor([5, 6, 7, 8]) + i for i in range(4)]
    responses = [torch.tensor([20, 21, 22]) + i for i in range(4)]
    model = value_model(tokenizer)
    config = PPOConfig(batch_size=2, mini_batch_size=1, ppo_epochs=1)
    trainer = PPOTrainer(config, model, None, tokenizer, dataset=PairDataset(queries, responses))
    assert len(trainer.dataloader) == 2
    query_tensor, response_tensor = next(iter(trainer.dataloader))  # torch's default collation: stacked
    assert query_tensor.shape == (2, 4) and response_tensor.shape == (2, 3)
    pairs = {(tuple(q.tolist()), tuple(r.tolist())) for q, r in zip(queries, responses)}
    assert all((tuple(q.tolist()), tuple(r.tolist())) in pairs for q, r in zip(query_tensor, response_tensor))
    before = [p.detach().clone() for p in model.parameters()]
    stats = trainer.step(list(query_tensor), list(response_tensor), [torch.tensor(1.0), torch.tensor(0.0)])
    assert stats["ppo/mean_scores"] == 0.5 and stats["tokens/responses_len_mean"] == 3
    # TRL v0.7.1's distributions: each mini-batch's advantages and ratios on its response tokens (2 x 3 tokens)
    assert stats["ppo/policy/advantages"].shape == (6,) and stats["ppo/policy/ratio"].shape == (6,)
    assert stats["ppo/policy/advantages"].mean().item() == pytest.approx(stats["ppo/policy/advantages_mean"], abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_dict_rows_keep_the_dict_of_lists_collator(tokenizer):
    rows = [{"input_ids": torch.arange(5 + i), "query": f"q{i}"} for i in range(4)]
    trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), value_model(tokenizer), None, tokenizer, rows)
    batch = next(iter(trainer.dataloader))
    assert isinstance(batch["input_ids"], list) and len(batch["input_ids"]) == 2  # variable lengths kept apart


def test_trl_v071_warnings_no_dataset_and_num_shared_layers_with_a_ref_model(tokenizer):
    model, ref = value_model(tokenizer), value_model(tokenizer, seed=1)
    with pytest.warns(UserWarning, match="No dataset is provided. Make sure to set config.batch_size"):
        PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), model, ref, tokenizer)
    with pytest.warns(UserWarning, match="num_shared_layers is ignored when ref_model is provided"):
        trainer = PPOTrainer(PPOConfig(batch_size=2), model, ref, tokenizer, dataset=[1, 2], num_shared_layers=1)
    assert trainer.ref_model is ref  # the given reference, nothing shared with the policy
    assert all(p.requires_grad for p in model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPOTrainer(PPOConfig(batch_size=2), model, ref, tokenizer, dataset=[1, 2])  # neither: no warning


def test_prepare_model_inputs_and_batched_forward_pass_match_the_step_forward(tokenizer):
    """Per-response-token log-probs and values of `batched_forward_pass` are those of the step's own forward pass,
    whatever `mini_batch_size` chunks them; `model_inputs` of other tensors are refused."""
    queries, responses = (
        queries_of(tokenizer, 3),
        [torch.tensor([10, 11, 12]), torch.tensor([13]), torch.tensor([14, 15])],
    )
    with pytest.warns(UserWarning, match="No dataset"):
        trainer = PPOTrainer(PPOConfig(batch_size=3, mini_batch_size=1), value_model(tokenizer), None, tokenizer)
    model = trainer.model
    inputs = trainer.prepare_model_inputs(queries, responses)
    batch = build_batch(queries, responses, tokenizer.pad_token_id)
    assert torch.equal(inputs["input_ids"], batch.input_ids) and torch.equal(
        inputs["attention_mask"], batch.attention_mask
    )
    one = trainer.batched_forward_pass(model, queries, responses, inputs)
    trainer.config.mini_batch_size = 3
    whole = trainer.batched_forward_pass(model, queries, responses, inputs, return_logits=True)
    want = forward(model.eval(), batch)
    assert one[1] is None and whole[1].shape == (3, 3, len(tokenizer))
    assert torch.equal(one[3], batch.response_mask) and torch.equal(whole[3], batch.response_mask)
    m = batch.response_mask.bool()
    for logprobs, values in [(one[0], one[2]), (whole[0], whole[2])]:
        torch.testing.assert_close(logprobs[m], want.logprobs[m], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values[m], want.values[m], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="model_inputs are not prepare_model_inputs"):
        trainer.batched_forward_pass(model, queries, responses[::-1], inputs)


def test_core_respond_to_batch_samples_txt_len_tokens_with_top_k(tokenizer):
    """`replayrl.core.respond_to_batch` (TRL v0.7.1's `trl.core`): exactly txt_len sampled tokens, reproducible
    under a seed; top_k=1 is greedy."""
    from replayrl.core import LengthSampler as CoreLengthSampler
    from replayrl.core import respond_to_batch, set_seed
    from replayrl.ppo import LengthSampler

    model = value_model(tokenizer).eval()
    query = torch.tensor([[5, 6, 7, 8]])
    set_seed(3)
    a = respond_to_batch(model, query, txt_len=6)
    set_seed(3)
    assert a.shape == (1, 6) and torch.equal(a, respond_to_batch(model, query, txt_len=6))
    greedy, ids = respond_to_batch(model, query, txt_len=3, top_k=1), query
    for _ in range(3):
        ids = torch.cat([ids, model(ids)[0][:, -1].argmax(-1, keepdim=True)], dim=-1)
    assert torch.equal(greedy, ids[:, -3:])
    assert respond_to_batch(model, query, txt_len=3, top_p=1e-6).equal(greedy)  # nucleus of one token
    assert CoreLengthSampler is LengthSampler


def test_step_safety_checker_and_two_dimensional_scores(tokenizer):
    """TRL v0.7.1's `_step_safety_checker(batch_size, queries, responses, scores)` returns the checked lists (a
    1-element score squeezed to 0-d); a (1, 1) score is refused, before any forward pass."""
    with pytest.warns(UserWarning, match="No dataset"):
        trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), value_model(tokenizer), None, tokenizer)
    queries, responses = [torch.tensor([5, 6, 7])] * 2, [torch.tensor([8, 9])] * 2
    q, r, scores, masks = trainer._step_safety_checker(2, queries, responses, [torch.tensor([1.0]), torch.tensor(0.5)])
    assert [t.tolist() for t in q] == [[5, 6, 7]] * 2 and [t.tolist() for t in r] == [[8, 9]] * 2 and masks is None
    assert [s.shape for s in scores] == [torch.Size([])] * 2 and [s.item() for s in scores] == [1.0, 0.5]
    with pytest.raises(ValueError, match="queries has 2 entries but config.batch_size is 3"):
        trainer._step_safety_checker(3, queries, responses, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"scores\[0\] has shape \(1, 1\): scores must be 1-dimensional"):
        trainer.step(queries, responses, [torch.tensor([[1.0]]), torch.tensor([[0.0]])])
    assert trainer.current_step == 0
