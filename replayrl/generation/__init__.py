"""Generation backends behind one interface: transformers `generate` (here), vLLM colocate and server."""
