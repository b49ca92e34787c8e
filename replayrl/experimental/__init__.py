"""TRL's experimental import paths, for code written against them (`trl.experimental.*`)."""
