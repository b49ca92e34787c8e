"""Built-in offline tasks for the default jobs and the tests (`addition`: single-digit sums)."""
