"""Dataset formats shared by every trainer: prompts, chat templates, masks, packing, collators."""
