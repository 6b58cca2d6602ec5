"""A vLLM-faithful model-server simulator: engine, HTTP pods and an in-process fleet."""
