"""DDPO (arXiv:2305.13301): RL fine-tuning of diffusion models; config, pipeline wrapper and trainer.

Needs diffusers (`pip install replayrl[diffusers]`); importing this package does not import it.
"""

from replayrl._lazy import lazy_exports

_EXPORTS = {
    "DDPOConfig": "replayrl.ddpo.config",
    "DDPOTrainer": "replayrl.ddpo.trainer",
    "DDPOStableDiffusionPipeline": "replayrl.ddpo.pipeline",
    "DefaultDDPOStableDiffusionPipeline": "replayrl.ddpo.pipeline",
    "DDPOPipelineOutput": "replayrl.ddpo.pipeline",
    "DDPOSchedulerOutput": "replayrl.ddpo.pipeline",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
