"""A ChatML template with {% generation %} marks around the assistant's text, for the char tokenizer."""

from replayrl.models.tiny import build_tokenizer

GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def chat_tokenizer(template: str | None = GENERATION_TEMPLATE):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def conversation(user: str, assistant: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


# A second tokenizer to clone from: two special tokens the char tokenizer lacks, one of them its EOS.
THINK, END_OF_TURN = "<|think|>", "<|end_of_turn|>"
SOURCE_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '[a]" + THINK + "' + message['content'] + '" + END_OF_TURN + "' }}"
    "{% else %}{{ '[u]' + message['content'] + '" + END_OF_TURN + "' }}{% endif %}"
    "{% endfor %}"
)


def save_source_tokenizer(folder) -> str:
    """A tokenizer folder whose template ends turns with a new EOS token and opens answers with a new token."""
    source = build_tokenizer()
    source.add_special_tokens({"eos_token": END_OF_TURN, "additional_special_tokens": [THINK]})
    source.chat_template = SOURCE_TEMPLATE
    source.save_pretrained(folder)
    return str(folder)
