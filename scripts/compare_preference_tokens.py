"""Do replayrl's preference trainers prepare the same token ids as TRL 1.16's for the same rows?

Builds each trainer (DPO, reward, KTO) with replayrl and with TRL 1.16 (in benchmarks/.venv-trl, a subprocess
printing JSON) on the same rows and tokenizer, and compares the prepared datasets' id columns row by row; also GRPO's
prompt ids (TRL 1.16's `GRPOTrainer._tokenize_prompts` against the tokenization replayrl's GRPO generation step uses).
Tokenizers: the tiny character tokenizer without a BOS (Qwen-style) and with one (Llama-style: `tokenizer(text)`
puts `<s>` first, the chat template starts with it); with `--tokenizer PATH` (a local tokenizer folder, e.g. a Qwen2.5
one with real merges), that tokenizer and a BOS variant of it too. Rows: text and conversational, explicit and
implicit prompts, a prompt ending in a space, a completion already ending in EOS, completions whose first token
merges with the prompt's end.

    PYTHONPATH=$PWD .venv/bin/python scripts/compare_preference_tokens.py [--tokenizer DIR] [--trl_python PY]

Not a CI test: TRL is not installed there. Exit status 1 when any prepared row differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / "benchmarks" / ".venv-trl" / "bin" / "python"


def chat(role: str, text: str) -> dict:
    return {"role": role, "content": text}


def datasets() -> dict[str, dict[str, list]]:
    """Named column dicts, each one dataset (a dataset is all text or all conversations, as TRL detects it)."""
    eos = "<|endoftext|>"
    return {
        "text_explicit": {
            "prompt": ["The sky is", "Q: 2+2=\n", "Say hi ", "x"],
            "chosen": [" blue.", "\nA: 4", "hi", "yes" + eos],
            "rejected": [" green.", "5", " no", "no"],
        },
        "text_implicit": {
            "chosen": ["The sky is blue.", "3+4=7", "Hello\n\nworld"],
            "rejected": ["The sky is green.", "3+4=8", "Hello\n\nthere"],
        },
        "chat_explicit": {
            "prompt": [[chat("user", "What colour is the sky?")], [chat("system", "Be brief."), chat("user", "2+2?")]],
            "chosen": [[chat("assistant", "Blue.")], [chat("assistant", "4")]],
            "rejected": [[chat("assistant", "Green.")], [chat("assistant", "5, or maybe 6")]],
        },
        "chat_implicit": {
            "chosen": [[chat("user", "hi"), chat("assistant", "hello")], [chat("user", "a"), chat("assistant", "b")]],
            "rejected": [[chat("user", "hi"), chat("assistant", "go")], [chat("user", "a"), chat("assistant", "c")]],
        },
    }


def tokenizers(path: str | None) -> dict:
    """Named tokenizers, built the same way in both processes."""
    from tokenizers import processors

    from replayrl.models.tiny import build_tokenizer

    out = {"tiny_no_bos": build_tokenizer(), "tiny_bos": build_tokenizer(bos=True), "bpe_bos": merging_tokenizer()}
    if path:
        from transformers import AutoTokenizer

        out["local"] = AutoTokenizer.from_pretrained(path)
        with_bos = AutoTokenizer.from_pretrained(path)
        with_bos.add_special_tokens({"bos_token": "<s>"})
        bos_id = with_bos.convert_tokens_to_ids("<s>")
        with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
        with_bos.chat_template = "{{ bos_token }}" + with_bos.chat_template
        out["local_bos"] = with_bos
    return out


def merging_tokenizer():
    """A Llama-style byte-level BPE with real merges (trained here, deterministically, on the rows' own text), so
    tokens merge across the prompt/completion boundary ("\n" + "\n" -> "\n\n", " h" + "i" ...): BOS `<s>` first,
    EOS `</s>`, a chat template starting with the BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from replayrl.models.tiny import CHAT_TEMPLATE

    corpus = [json.dumps(rows) for rows in datasets().values()] * 20 + ["Hello\n\nthere hi hi\n\nA: 4"] * 50
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", backend.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                                   chat_template="{{ bos_token }}" + CHAT_TEMPLATE)  # fmt: skip


def _ids(dataset, columns) -> list[dict]:
    return [{c: list(row[c]) for c in columns} for row in dataset]


def prepare_replayrl(tokenizer, rows: dict, out_dir: str) -> dict:
    from datasets import Dataset

    from replayrl.dpo import DPOConfig, DPOTrainer
    from replayrl.kto import KTOConfig, KTOTrainer
    from replayrl.models.tiny import build_tiny_model, build_tiny_sequence_classifier
    from replayrl.reward import RewardConfig, RewardTrainer

    common = {"output_dir": out_dir, "report_to": [], "max_length": None}
    model = build_tiny_model(tokenizer)
    dpo = DPOTrainer(model, args=DPOConfig(**common), train_dataset=Dataset.from_dict(rows), processing_class=tokenizer)
    kto = KTOTrainer(model, args=KTOConfig(**common), train_dataset=Dataset.from_dict(rows), processing_class=tokenizer)
    reward_model = build_tiny_sequence_classifier(tokenizer)
    reward = RewardTrainer(reward_model, args=RewardConfig(append_eos=True, **common),
                           train_dataset=Dataset.from_dict(rows), processing_class=tokenizer)  # fmt: skip
    kto_rows = _ids(kto.train_dataset, ["prompt_ids", "completion_ids"])
    out = {
        "dpo": _ids(dpo.train_dataset, ["prompt_ids", "chosen_ids", "rejected_ids"]),
        "reward": _ids(reward.train_dataset, ["chosen_ids", "rejected_ids"]),
        "kto": sorted(kto_rows, key=json.dumps),  # the unpaired rows' order differs (TRL: all chosen, then rejected)
    }
    if "prompt" in rows:  # GRPO's prompt ids, as its generation step tokenizes them (grpo/trainer.py)
        from replayrl.data.prompts import is_conversational, prompts_to_text, tokenize_prompts

        prompts = rows["prompt"]
        ids, mask = tokenize_prompts(
            tokenizer, prompts_to_text(tokenizer, prompts), None, not is_conversational(prompts[0])
        )
        out["grpo"] = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    return out


def prepare_trl(tokenizer, rows: dict, out_dir: str) -> dict:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, RewardConfig, RewardTrainer

    from replayrl.models.tiny import build_tiny_model, build_tiny_sequence_classifier

    common = {"output_dir": out_dir, "report_to": [], "max_length": None, "bf16": False, "use_cpu": True}
    model = build_tiny_model(tokenizer)
    data = {"train_dataset": Dataset.from_dict(rows), "processing_class": tokenizer}
    ref = build_tiny_model(tokenizer)  # TRL would reload a model given as an object from its config's path
    dpo = DPOTrainer(model, ref_model=ref, args=DPOConfig(**common), **data)
    kto = KTOTrainer(model, ref_model=ref, args=KTOConfig(**common), **data)
    reward_model = build_tiny_sequence_classifier(tokenizer)
    reward = RewardTrainer(reward_model, args=RewardConfig(**common), train_dataset=Dataset.from_dict(rows),
                           processing_class=tokenizer)  # fmt: skip
    out = {
        "dpo": _ids(dpo.train_dataset, ["prompt_ids", "chosen_ids", "rejected_ids"]),
        "reward": _ids(reward.train_dataset, ["chosen_ids", "rejected_ids"]),
        "kto": sorted(_ids(kto.train_dataset, ["prompt_ids", "completion_ids"]), key=json.dumps),
    }
    if "prompt" in rows:  # GRPO's prompt ids: TRL 1.16's GRPOTrainer._tokenize_prompts
        from trl import GRPOConfig, GRPOTrainer

        settings = {k: v for k, v in common.items() if k != "max_length"}
        grpo_args = GRPOConfig(per_device_train_batch_size=2, num_generations=2, **settings)
        prompts = Dataset.from_dict({"prompt": rows["prompt"]})
        grpo = GRPOTrainer(model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=grpo_args,
                           train_dataset=prompts, processing_class=tokenizer)  # fmt: skip
        out["grpo"] = [list(ids) for ids in grpo._tokenize_prompts(rows["prompt"])[0]]
    return out


def prepare_all(side: str, path: str | None) -> dict:
    prepare = prepare_trl if side == "trl" else prepare_replayrl
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tok_name, tokenizer in tokenizers(path).items():
            for data_name, rows in datasets().items():
                out[f"{tok_name}/{data_name}"] = prepare(tokenizer, rows, tmp)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", help="a local tokenizer folder to compare too (with and without a BOS)")
    parser.add_argument("--trl_python", default=str(TRL_PYTHON), help="TRL 1.16's interpreter (benchmarks/.venv-trl)")
    parser.add_argument("--side", choices=["replayrl", "trl"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # a worker: print this side's prepared ids
        print(json.dumps(prepare_all(args.side, args.tokenizer)))
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    extra = ["--tokenizer", args.tokenizer] if args.tokenizer else []
    trl = json.loads(
        subprocess.run([args.trl_python, __file__, "--side", "trl", *extra], env=env, check=True,
                       capture_output=True, text=True).stdout.splitlines()[-1]
    )  # fmt: skip
    ours = prepare_all("replayrl", args.tokenizer)
    n_diff = 0
    for case, trainers in ours.items():
        for trainer, rows in trainers.items():
            theirs = trl[case][trainer]
            same = rows == theirs
            n_diff += not same
            print(f"{case:32s} {trainer:7s} {len(rows):2d} rows  {'equal' if same else 'DIFFERENT'}")
            if not same:
                for mine, peer in zip(rows, theirs):
                    if mine != peer:
                        print(f"    replayrl {mine}\n    trl      {peer}")
                        break
    print(f"{n_diff} of {sum(len(t) for t in ours.values())} prepared datasets differ")
    return int(n_diff > 0)


if __name__ == "__main__":
    sys.exit(main())
