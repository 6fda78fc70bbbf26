"""Rollout engines: the interface stages sample through, on Hugging Face models or vLLM."""
