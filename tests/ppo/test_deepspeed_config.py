"""PPOTrainer fills the DeepSpeed config's "auto" values from PPOConfig and refuses contradictions, before any engine
is built (replayrl/ppo/sharding.py; the runs themselves: tests/distributed/test_strategies.py)."""

from types import SimpleNamespace

import pytest

from replayrl.ppo import PPOConfig
from replayrl.ppo.sharding import configure_deepspeed

pytest.importorskip("deepspeed", reason="DeepSpeed runs need `pip install replayrl[deepspeed]`")


def accelerator(stage: int, **settings):
    """An accelerator's state holding accelerate's own DeepSpeed plugin for a config (the only part read)."""
    from accelerate.utils import DeepSpeedPlugin

    auto = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}
    config = {"zero_optimization": {"stage": stage}, **auto, **settings}
    plugin = DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=False)
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin))


@pytest.mark.parametrize("max_grad_norm, clipping", [(None, 0.0), (0.5, 0.5)])
def test_auto_values_come_from_the_ppo_config(max_grad_norm, clipping):
    acc = accelerator(2)
    configure_deepspeed(acc, PPOConfig(batch_size=8, mini_batch_size=4, max_grad_norm=max_grad_norm), None)
    config = acc.state.deepspeed_plugin.deepspeed_config
    assert config["gradient_clipping"] == clipping  # not accelerate's 1.0 (what made ZeRO-2 differ from 1 process)
    assert config["train_micro_batch_size_per_gpu"] == 4


def test_a_contradicting_number_is_refused():
    acc = accelerator(2, gradient_clipping=1.0)
    with pytest.raises(ValueError, match=r"gradient_clipping=1.0 but PPOConfig.max_grad_norm gives 0.0"):
        configure_deepspeed(acc, PPOConfig(batch_size=8, mini_batch_size=4), None)
    configure_deepspeed(acc, PPOConfig(batch_size=8, mini_batch_size=4, max_grad_norm=1.0), None)  # agreeing: fine
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu=2 but PPOConfig.mini_batch_size gives 4"):
        configure_deepspeed(
            accelerator(2, train_micro_batch_size_per_gpu=2), PPOConfig(batch_size=8, mini_batch_size=4), None
        )


def test_shared_layers_are_refused_under_zero3_only():
    config = PPOConfig(batch_size=8, mini_batch_size=4)
    with pytest.raises(ValueError, match=r"num_shared_layers=1 under DeepSpeed ZeRO-3.*num_shared_layers=None"):
        configure_deepspeed(accelerator(3), config, num_shared_layers=1)
    configure_deepspeed(accelerator(2), config, num_shared_layers=1)


def test_without_deepspeed_nothing_changes():
    configure_deepspeed(SimpleNamespace(state=SimpleNamespace()), PPOConfig(batch_size=8, mini_batch_size=4), 1)
