import math

import pytest
import torch

from replayrl.algos.sft import dft_token_loss, nll_token_loss, sft_token_loss, token_sum_loss, trained_token_stats


def test_nll_and_dft_by_hand():
    logps = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    assert torch.allclose(nll_token_loss(logps), torch.tensor([[0.693147, 1.386294]]), atol=1e-6)
    dft = dft_token_loss(logps)
    # -p log p: 0.5 * ln 2 = 0.346574 and 0.25 * ln 4 = 0.346574
    assert torch.allclose(dft, torch.tensor([[0.346574, 0.346574]]), atol=1e-6)
    dft.sum().backward()
    # the probability weight is a constant (stop-gradient): d/dlogp = -p, not -(p + p log p)
    assert torch.allclose(logps.grad, torch.tensor([[-0.5, -0.25]]))


def test_sft_token_loss_dispatch():
    logps = torch.tensor([[-1.0]])
    assert sft_token_loss(logps, "nll").item() == 1.0
    assert sft_token_loss(logps, "dft").item() == pytest.approx(math.exp(-1.0))
    with pytest.raises(ValueError, match="loss_type='mse'"):
        sft_token_loss(logps, "mse")


def test_token_sum_loss_divides_by_the_whole_batch_count():
    per_token = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 0], [1, 1]])
    assert token_sum_loss(per_token, mask).item() == pytest.approx(8 / 3)
    assert token_sum_loss(per_token, mask, num_items=4).item() == 2.0  # 3 tokens here, 4 in the whole batch
    assert token_sum_loss(per_token, torch.zeros_like(mask)).item() == 0.0


def test_trained_token_stats_by_hand():
    # position 0: uniform over 2 -> entropy ln 2, argmax 0 (ties: first) vs label 1 -> wrong
    # position 1: logits (ln 3, 0) -> p = (0.75, 0.25), entropy 0.562335, argmax 0 == label 0 -> right
    # position 2: not trained
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 5.0]]])
    labels = torch.tensor([[1, 0, 1]])
    mask = torch.tensor([[True, True, False]])
    for chunk_size in (1, 1024):
        correct, entropy, n = trained_token_stats(logits, labels, mask, chunk_size=chunk_size)
        assert (correct.item(), n.item()) == (1, 2)
        assert entropy.item() == pytest.approx(math.log(2) + 0.562335, abs=1e-6)
