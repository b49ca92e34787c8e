"""Model loading, reference models (frozen copy, PEFT base, TR-DPO sync), the tiny offline models."""
