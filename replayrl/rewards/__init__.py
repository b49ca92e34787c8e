"""Reward functions: the TRL convention (`functions`), reward models, and the built-in rewards (`builtin`)."""
