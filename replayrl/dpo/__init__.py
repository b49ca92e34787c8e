"""DPO (arXiv:2305.18290) and its loss variants: config and trainer."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "DataCollatorForPreference": "replayrl.dpo.collator",
    "DataCollatorForVisionPreference": "replayrl.dpo.collator",
    "DPOConfig": "replayrl.dpo.config",
    "DPOTrainer": "replayrl.dpo.trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
