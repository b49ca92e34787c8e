"""Supervised fine-tuning: `SFTConfig` and `SFTTrainer` (current TRL API, TRL v0.7.1's names accepted)."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "DataCollatorForLanguageModeling": "replayrl.sft.collator",
    "SFTConfig": "replayrl.sft.config",
    "SFTTrainer": "replayrl.sft.trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
