"""Run TRL's own test files against replayrl, offline, and print how many pass.

    python scripts/trl_tests.py DIR [FILE ...] [--keep WORKDIR] [-- PYTEST_ARGS]

DIR holds TRL test files as fetched from TRL's repository (v1.16), with their layout (`test_grpo_trainer.py`,
`experimental/test_grpo_with_replay_buffer_trainer.py`, ...); FILE (default: every `test_*.py` under DIR) picks some.
Nothing of TRL is part of replayrl: the files are read from DIR, rewritten into a temporary package and run there.

The rewrite changes only what ties a file to TRL's repository and the hub, never an assertion:
  - imports: `trl` -> `replayrl` (same public names); `trl.import_utils`, `trl.trainer.utils` and `.testing_utils`
    -> a local stand-in (`scripts/trl_tests_shim.py`: `TrlTestCase` with pytest's tmp dir, the `require_*` skips,
    `get_kbit_device_map`, `local_dataset`);
  - TRL's hub test models `trl-internal-testing/tiny-...` -> tiny models built here from configs (random weights,
    replayrl's character tokenizer, `replayrl.models.tiny`; the Qwen2 / Qwen3-MoE causal LMs with `qwen_tokenizer`,
    which keeps the ids of the hub Qwen tokenizer that TRL's tests hard-code), saved under the work dir; names with
    no local stand-in (vision-language models) are left as they are, and their tests fail offline;
  - `load_dataset("trl-internal-testing/zen", ...)` -> local rows with the same columns (PEP 20 prompts).
TRL v0.7.1's PPO / value-head / DDPO files (2023) also get the stand-ins and rules of `scripts/trl_tests_v071.py`.
The counts are pytest's, read from its JUnit report: passed / failed (+ errors) / skipped (xfail counted apart).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import trl_tests_v071 as v071  # TRL v0.7.1's files: their 2023 hub names and imports (scripts/trl_tests_v071.py)

REPO = Path(__file__).resolve().parent.parent
SHIM = Path(__file__).resolve().parent / "trl_tests_shim.py"
PACKAGE = "trl_tests"  # the temporary package the rewritten files live in (relative imports keep working)
HUB_MODEL = re.compile(r"""(["'])trl-internal-testing/(tiny-[A-Za-z0-9_.\-]+)\1""")
SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
MOE = dict(num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
NEMOTRON_H = dict(head_dim=8, mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=1, n_routed_experts=4)
NEMOTRON_H.update(moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, use_mamba_kernels=False)
# Hub name -> (model_type, head, extra config). Qwen2 goes through replayrl.models.tiny; the others from configs.
LOCAL_MODELS = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", "causal", {}),
    "tiny-Qwen2ForSequenceClassification-2.5": ("qwen2", "classifier", {}),
    "tiny-Qwen3ForCausalLM": ("qwen3", "causal", {"tie_word_embeddings": False, "head_dim": 8}),
    "tiny-Qwen3ForSequenceClassification": ("qwen3", "classifier", {"head_dim": 8}),
    "tiny-Qwen3MoeForCausalLM": ("qwen3_moe", "causal", {"head_dim": 8, **MOE}),
    "tiny-Gemma2ForCausalLM": ("gemma2", "causal", {"tie_word_embeddings": True, "head_dim": 8}),
    "tiny-LlamaForCausalLM-3.2": ("llama", "causal", {}),
    "tiny-LlamaForSequenceClassification-3.2": ("llama", "classifier", {}),
    "tiny-MistralForCausalLM-0.2": ("mistral", "causal", {}),
    "tiny-Cohere2ForCausalLM": ("cohere2", "causal", {}),
    "tiny-GptOssForCausalLM": ("gpt_oss", "causal", {"head_dim": 8, **MOE}),
    "tiny-Glm4MoeForCausalLM": ("glm4_moe", "causal", {"head_dim": 8, "first_k_dense_replace": 1, **MOE}),
    "tiny-NemotronHForCausalLM-nano": ("nemotron_h", "causal", NEMOTRON_H),
    "tiny-RemoteForCausalLM": ("remote", "causal", {}),
    "tiny-GPTNeoXForCausalLM": ("gpt_neox", "causal", {}),
    "tiny-Olmo3ForCausalLM": ("olmo3", "causal", {}),
    "tiny-Lfm2ForCausalLM": ("lfm2", "causal", {"block_ff_dim": 64}),
    "tiny-Lfm2ForCausalLM-2.5": ("lfm2", "causal", {"block_ff_dim": 64}),
}
NO_CHAT_TEMPLATE = {"gpt_neox"}  # hub tokenizers without a chat template (tests set one with chat_template_path)
EXTRA_TOKENS = {"llama": ["<|finetune_right_pad_id|>"]}  # pad token TRL's Llama reward-model test sets by name
# Stand-ins whose tokenizer keeps the hub Qwen tokenizer's ids (`qwen_tokenizer`): TRL's tests feed these models
# fixed Qwen token ids through a mocked `generate` (EOS 151645, pad 151643, tool calls), and rely on a vocabulary of
# 151k ids (random weights: EOS within 8 tokens is unlikely).
# TRL's vision-language test models -> `replayrl.models.tiny_vlm` stand-ins (model + processor). Without torchvision
# the Qwen-VL processors load without their video processor (`replayrl.models.processors.load_processor`; the shim
# routes TRL's own `AutoProcessor.from_pretrained` calls there).
VLM_MODELS = {
    "tiny-Qwen2VLForConditionalGeneration": "qwen2_vl",
    "tiny-Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "tiny-Qwen3VLForConditionalGeneration": "qwen3_vl",
    "tiny-Qwen3_5ForConditionalGeneration-NoThink": "qwen3_5",
    "tiny-Qwen3_5MoeForConditionalGeneration-3.6": "qwen3_5_moe",
    "tiny-LlavaForConditionalGeneration": "llava",
    "tiny-LlavaNextForConditionalGeneration": "llava_next",
    "tiny-Gemma3ForConditionalGeneration": "gemma3",
    "tiny-Idefics2ForConditionalGeneration": "idefics2",
    "tiny-Idefics3ForConditionalGeneration": "idefics3",
    "tiny-Gemma4ForConditionalGeneration": "gemma4",
}
QWEN_IDS = {"tiny-Qwen2ForCausalLM-2.5", "tiny-Qwen3MoeForCausalLM"}
# The hub Qwen vocabulary's entries that TRL's tests hard-code, at their ids (each test spells out the text it means).
QWEN_WORDS = {
    4913: '{"',
    606: "name",
    788: '":',
    330: ' "',
    64648: "multiply",
    22785: "_tool",
    497: '",',
    16370: "arguments",
    5212: ' {"',
    11248: "}}\n",
    1513: " don",
    944: "'t",
    1414: " know",
    894: " any",
    5392: " tool",
    17453: "Done",
    7692: "async",
    93054: "_multiply",
}
QWEN_BASE = 151643  # ids below are the byte-level BPE vocabulary; from here on, added tokens
QWEN_ADDED = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151657: "<tool_call>"}
QWEN_ADDED.update({151658: "</tool_call>", 151665: "<tool_response>", 151666: "</tool_response>"})
QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML with Qwen's tool format (tools in the system turn, <tool_call> JSON, results as <tool_response>).
QWEN_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}<|im_start|>assistant\n{{ m['content'] }}"
    "{% for c in m['tool_calls'] %}\n<tool_call>\n{{ c['function'] | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_symbols() -> dict[int, str]:
    """Byte -> its byte-level BPE symbol, in vocabulary order (GPT-2's, which Qwen's vocabulary starts with):
    printable bytes as themselves first, then the others as the characters from 256 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def qwen_tokenizer():
    """A tokenizer with the hub Qwen tokenizer's ids for the byte alphabet, `QWEN_WORDS` and the added tokens
    (the rest of its 151k ids are placeholders): text encodes one byte per token, fixed Qwen ids decode as on the hub.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from replayrl.models.tiny import QWEN2_SPLIT_REGEX

    symbols = _byte_symbols()
    alphabet = list(symbols.values())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    words = {i: "".join(symbols[b] for b in text.encode()) for i, text in QWEN_WORDS.items()}
    vocab.update({words[i] if i in words else f"<|qwen_{i}|>": i for i in range(len(alphabet), QWEN_BASE)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    for i in range(QWEN_BASE, max(QWEN_ADDED) + 1):
        text = QWEN_ADDED.get(i, f"<|qwen_added_{i}|>")
        backend.add_tokens([AddedToken(text, special=text in QWEN_SPECIAL or i not in QWEN_ADDED, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        padding_side="left",
        chat_template=QWEN_CHAT_TEMPLATE,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def build_local_model(name: str, out: Path) -> str | None:
    """Save the local stand-in for hub model `name` under `out`; its path, or None when there is none."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from replayrl.models import tiny

    if name in VLM_MODELS:
        from replayrl.models.tiny_vlm import build_tiny_processor, build_tiny_vlm

        build_tiny_vlm(VLM_MODELS[name]).save_pretrained(out / name)
        build_tiny_processor(VLM_MODELS[name]).save_pretrained(out / name)
        return str(out / name)
    if name not in LOCAL_MODELS:
        return v071.build(name, out)
    model_type, head, extra = LOCAL_MODELS[name]
    path = out / name
    tokenizer = qwen_tokenizer() if name in QWEN_IDS else tiny.build_tokenizer()
    if model_type in NO_CHAT_TEMPLATE:
        tokenizer.chat_template = None
    if EXTRA_TOKENS.get(model_type):
        tokenizer.add_special_tokens({"additional_special_tokens": EXTRA_TOKENS[model_type]})
    if model_type == "remote":
        return _build_remote_model(path, tokenizer)
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    ids["bos_token_id"] = tokenizer.eos_token_id
    sizes = {**SIZES, **extra}
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), max_position_embeddings=512, **sizes)
    for key, value in ids.items():
        setattr(config, key, value)
    if head == "classifier":
        config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cls = AutoModelForSequenceClassification if head == "classifier" else AutoModelForCausalLM
        model = cls.from_config(config)
    if head == "causal":
        model.generation_config.update(**ids)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


REMOTE_CONFIG = """from transformers import Qwen2Config


class RemoteConfig(Qwen2Config):
    model_type = "remote"
"""
REMOTE_MODEL = """from transformers import Qwen2ForCausalLM

from .configuration_remote import RemoteConfig


class RemoteForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteConfig
"""


def _build_remote_model(path: Path, tokenizer) -> str:
    """A model whose code ships with the checkpoint (`auto_map`): loadable only with trust_remote_code=True."""
    from replayrl.models import tiny

    tiny.build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "configuration_remote.py").write_text(REMOTE_CONFIG)
    (path / "modeling_remote.py").write_text(REMOTE_MODEL)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="remote", architectures=["RemoteForCausalLM"])
    config["auto_map"] = {
        "AutoConfig": "configuration_remote.RemoteConfig",
        "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return str(path)


TRAINER_MODULE_IMPORT = re.compile(r"^from trl\.trainer\.(reward|dpo|sft)_trainer import (\([^)]*\)|.+)$", re.M)


def _names_from_trainer_module(match: re.Match) -> str:
    module, listed = f"replayrl.{match.group(1)}", match.group(2).strip("()").split(",")
    names = [n.strip() for n in listed if n.strip()]
    lines = [f"from {PACKAGE}.testing_utils import replayrl_name"]
    return "\n".join(lines + [f"{n} = replayrl_name({module!r}, {n!r})" for n in names])


IMPORT_RULES = [
    (re.compile(r"^from trl\.import_utils import", re.M), f"from {PACKAGE}.testing_utils import"),
    (re.compile(r"^from trl\.trainer\.utils import", re.M), f"from {PACKAGE}.testing_utils import"),
    (re.compile(r"^from trl\.experimental\.", re.M), "from replayrl.experimental."),
    # TRL's trainer modules (`trl.trainer.dpo_trainer`, ...) -> replayrl's trainer packages (`replayrl.dpo`), one
    # name at a time: a name replayrl lacks fails the tests that use it, not the whole file's collection.
    (TRAINER_MODULE_IMPORT, _names_from_trainer_module),
    (re.compile(r"^from trl import", re.M), "from replayrl import"),
    (re.compile(r"^import trl$", re.M), "import replayrl as trl"),
    (re.compile(r"\bload_dataset\("), "local_dataset("),
]


def rewrite(source: str, models: dict[str, str]) -> str:
    """TRL's test file `source` with replayrl's imports, local models and local datasets (see the module doc)."""
    for pattern, replacement in IMPORT_RULES:
        source = pattern.sub(replacement, source)
    source = HUB_MODEL.sub(lambda m: repr(models[m.group(2)]) if m.group(2) in models else m.group(0), source)
    source = v071.rewrite(source, models)
    # `local_dataset` comes from the shim; the import goes after the module's first import statement.
    first_import = re.search(r"^(import|from) ", source, re.M)
    at = first_import.start() if first_import else 0
    return source[:at] + f"from {PACKAGE}.testing_utils import local_dataset\n" + source[at:]


def prepare(source_dir: Path, files: list[Path], work: Path) -> Path:
    """Build the local models the files name and write the rewritten package; returns the package dir."""
    package = work / PACKAGE
    package.mkdir(parents=True)
    shutil.copy(SHIM, package / "testing_utils.py")
    (package / "conftest.py").write_text("from .testing_utils import lazy_shared_datadir  # noqa: F401\n")
    texts = {f: (source_dir / f).read_text() for f in files}
    names = sorted({m.group(2) for text in texts.values() for m in HUB_MODEL.finditer(text)})
    names += sorted(set().union(*(v071.extra_names(text) for text in texts.values())))
    models = {}
    for name in names:
        path = _try_build(name, work / "models")
        if path:
            models[name] = path
    print(f"local models: {len(models)} built, missing: {sorted(set(names) - set(models))}", flush=True)
    for f, text in texts.items():
        target = package / f
        target.parent.mkdir(parents=True, exist_ok=True)
        for parent in [target.parent, *target.parent.parents]:
            if parent == work:
                break
            (parent / "__init__.py").touch()
        target.write_text(rewrite(text, models))
    (work / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow\n    low_priority\n    peft_test\n")
    return package


def _try_build(name: str, out: Path) -> str | None:
    try:
        return build_local_model(name, out)
    except Exception as exc:  # a config this transformers version cannot build: its tests fail, reported below
        print(f"cannot build a local {name}: {type(exc).__name__}: {exc}", flush=True)
        return None


def run_pytest(work: Path, package: Path, pytest_args: list[str]) -> Path:
    report = work / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(work)]), "HF_HUB_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = [sys.executable, "-m", "pytest", str(package), "-c", str(work / "pytest.ini"), "--rootdir", str(work)]
    cmd += ["-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={report}", *pytest_args]
    subprocess.run(cmd, cwd=work, env=env, check=False)
    return report


def summarize(report: Path) -> dict[str, dict[str, int]]:
    """Per test file: passed / failed / errors / skipped / xfailed / xpassed, from pytest's JUnit report."""
    counts: dict[str, Counter] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((part for part in module if part.startswith("test_")), "?")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "errors"
            elif child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        if outcome == "passed" and any(p.get("name") == "xfail" for p in case.iter("property")):
            outcome = "xpassed"
        counts.setdefault(name, Counter())[outcome] += 1
    return {name: dict(c) for name, c in counts.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="directory holding TRL's test files (TRL's tests/ layout)")
    parser.add_argument("files", nargs="*", type=Path, help="test files relative to DIR (default: all test_*.py)")
    parser.add_argument("--keep", type=Path, help="write the rewritten package here and keep it")
    args = parser.parse_args(argv)
    source_dir = args.dir.resolve()
    if not source_dir.is_dir():
        raise SystemExit(f"{source_dir} is not a directory: pass the folder holding TRL's test files")
    files = args.files or sorted(p.relative_to(source_dir) for p in source_dir.rglob("test_*.py"))
    if not files:
        raise SystemExit(f"no test_*.py files under {source_dir}")
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="replayrl-trl-tests-"))
    if args.keep and work.exists():
        shutil.rmtree(work)
    package = prepare(source_dir, files, work)
    summary = summarize(run_pytest(work, package, pytest_args))
    for name, counts in sorted(summary.items()):
        total = sum(counts.values())
        print(f"{name}: {total} tests: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in _OUTCOMES))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


_OUTCOMES = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")

if __name__ == "__main__":
    sys.exit(main())
