"""KTO (arXiv:2402.01306) from unpaired desirable / undesirable completions: TRL's `KTOConfig` / `KTOTrainer`."""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "DataCollatorForUnpairedPreference": "replayrl.data.unpaired",
    "KTOConfig": "replayrl.kto.config",
    "KTOTrainer": "replayrl.kto.trainer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
