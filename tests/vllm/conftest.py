"""vLLM tests run only where vLLM is installed (.venv-vllm, see scripts/setup_vllm.sh); elsewhere they are
skipped, without importing anything heavy."""

import importlib.util
import os

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def pytest_collection_modifyitems(config, items):
    if HAS_VLLM:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed here: run with .venv-vllm (scripts/setup_vllm.sh)")
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """Tiny Qwen2 with tied embeddings; head_dim 32 (vLLM's CPU attention has no kernel for 16)."""
    from replayrl.models.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("vllm-tied"), hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="session")
def vllm_untied_model_dir(tmp_path_factory, vllm_model_dir):
    """The same model with its own lm_head (random, seeded) instead of the tied embedding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, tie_word_embeddings=False, dtype=torch.float32)
    with torch.no_grad():
        torch.manual_seed(1)
        model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.1)
    path = tmp_path_factory.mktemp("vllm-untied")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(vllm_model_dir).save_pretrained(path)
    return str(path)
