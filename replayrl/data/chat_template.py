"""Chat templates from `chat_template_path`: a template file, or another tokenizer cloned onto the model (TRL 1.16).

- A file (`template.jinja`, `.j2`, any text file) replaces `tokenizer.chat_template`; nothing else changes.
- A tokenizer folder (or hub id) goes through `clone_chat_template`, as TRL 1.16's SFT and reward trainers do:
  its template, its added tokens the target lacks, and its EOS token are copied, and the model's embeddings are
  resized to the new vocabulary, rounded up to a multiple of 64 (the tokenizer is filled with `<extra_id_N>`
  dummy tokens so both sizes agree). The ids of every token added come back, so PEFT can train their rows
  (`replayrl.models.loading.apply_peft`).
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)
TEMPLATE_SUFFIXES = (".jinja", ".j2")


def load_chat_template(tokenizer, chat_template_path: str) -> None:
    """Set `tokenizer.chat_template` from a template file (e.g. `template.jinja`)."""
    path = Path(chat_template_path).expanduser()
    if not path.is_file():
        raise ValueError(
            f"chat_template_path={chat_template_path!r} is neither a template file nor a tokenizer folder; "
            "pass the path of a .jinja file or of a folder written by save_pretrained."
        )
    tokenizer.chat_template = path.read_text(encoding="utf-8")


def _embedding_rows(model) -> int:
    # Not `model.vocab_size` (TRL's): a sequence classifier has that attribute only once resized.
    return model.get_input_embeddings().weight.shape[0]


def clone_chat_template(model, tokenizer, source_tokenizer_path: str, resize_to_multiple_of: int | None = 64):
    """TRL 1.16's `clone_chat_template`: copy the chat template, the missing added tokens and the EOS token of the
    tokenizer at `source_tokenizer_path` onto `tokenizer`, and resize `model`'s embeddings to match.

    The EOS id is mirrored onto the model's (text) config and, for a model that can generate, its generation
    config. The embedding rows become `len(tokenizer.vocab)` rounded up to `resize_to_multiple_of` (None: not
    rounded); dummy `<extra_id_N>` tokens fill the tokenizer up to that size.

    Returns (model, tokenizer, added_tokens): `added_tokens` are the ids of every token added to `tokenizer`
    (the source's and the dummies)."""
    from transformers import AddedToken, AutoTokenizer

    try:
        source = AutoTokenizer.from_pretrained(source_tokenizer_path)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"chat_template_path={source_tokenizer_path!r} is neither a template file nor a tokenizer folder "
            f"({err}); pass the path of a .jinja file or of a folder written by save_pretrained."
        ) from err
    if not source.chat_template:
        raise ValueError(f"chat_template_path={source_tokenizer_path!r}: the tokenizer there has no chat template.")
    tokenizer.chat_template = source.get_chat_template()

    vocab = tokenizer.get_vocab()
    added = [token for token in source.added_tokens_decoder.values() if token.content not in vocab]
    tokenizer.add_tokens(added)

    tokenizer.eos_token = source.eos_token
    model.config.get_text_config().eos_token_id = tokenizer.eos_token_id
    if model.can_generate():  # a sequence classifier has no generation config to update
        model.generation_config.eos_token_id = tokenizer.eos_token_id

    # len(tokenizer.vocab), as TRL: the most reliable size across tokenizers' handling of special/added tokens.
    model.resize_token_embeddings(new_num_tokens=len(tokenizer.get_vocab()), pad_to_multiple_of=resize_to_multiple_of)
    index = 0
    while _embedding_rows(model) > len(tokenizer.get_vocab()):
        dummy = AddedToken(f"<extra_id_{index}>")
        index += 1
        if tokenizer.add_tokens(dummy) == 1:
            added.append(dummy)
    if len(tokenizer.get_vocab()) != _embedding_rows(model):
        raise RuntimeError(
            f"clone_chat_template: the tokenizer has {len(tokenizer.get_vocab())} tokens but the model "
            f"{_embedding_rows(model)} embedding rows after resizing (an internal error)."
        )
    return model, tokenizer, tokenizer.convert_tokens_to_ids([token.content for token in added])


def apply_chat_template_path(model, tokenizer, chat_template_path: str | None):
    """The trainers' `chat_template_path`, as TRL 1.16: a template file sets the template (no token added);
    anything else is a tokenizer to clone. Returns (model, tokenizer, added token ids)."""
    if chat_template_path is None:
        return model, tokenizer, []
    if tokenizer is None:
        raise ValueError("chat_template_path needs a tokenizer: pass processing_class.")
    path = Path(chat_template_path).expanduser()
    if path.is_file() or path.suffix in TEMPLATE_SUFFIXES:
        load_chat_template(tokenizer, chat_template_path)
        return model, tokenizer, []
    model, tokenizer, added = clone_chat_template(model, tokenizer, str(path) if path.is_dir() else chat_template_path)
    logger.info("chat_template_path=%r: cloned its chat template; %d tokens added.", chat_template_path, len(added))
    return model, tokenizer, added
