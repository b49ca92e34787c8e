"""The DPO sequence sums through the fused lm_head equal the plain full-logits computation (values and gradients)."""

import pytest
import torch

from replayrl.dpo.sequence_logps import packed_sums, padded_sums
from replayrl.models.lm_head import forward_to_head
from replayrl.models.tiny import build_tiny_model, build_tokenizer

PAD = -100


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)


def batch(vocab):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding
    mask[3, 5:] = 0
    labels = torch.where(mask.bool(), ids, PAD)
    labels[:, :3] = PAD  # prompt tokens
    labels[2, :4] = PAD
    return ids, mask, labels


def plain_sums(model, ids, mask, labels):
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
    targets, completion = labels[:, 1:], labels[:, 1:] != PAD
    logp = torch.log_softmax(logits, -1)
    token = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    count = completion.sum(1)
    wpo = token.detach() - torch.logsumexp(2 * logp, -1)
    return {
        "logps": (token * completion).sum(1),
        "lengths": count,
        "logits": (logits.mean(-1) * completion).sum(1) / count,
        "wpo": (wpo * completion).sum(1) / count,
    }


@pytest.mark.parametrize("layout", [padded_sums, packed_sums])
def test_fused_sums_equal_plain_full_logits(model, layout):
    ids, mask, labels = batch(model.config.vocab_size)
    outputs, head = forward_to_head(model, input_ids=ids, attention_mask=mask)
    assert head.weight is not None and outputs.logits.shape[1] == 0  # the fused path is the one under test
    got = layout(model, ids, mask, labels, PAD, with_logits=True, with_wpo=True)
    want = plain_sums(model, ids, mask, labels)
    assert torch.equal(got["lengths"], want["lengths"])
    for key in ("logps", "logits", "wpo"):
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-5)
    params = list(model.parameters())
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])
    fused_grads = torch.autograd.grad((got["logps"] * weights).sum(), params)
    for a, b in zip(fused_grads, torch.autograd.grad((want["logps"] * weights).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
