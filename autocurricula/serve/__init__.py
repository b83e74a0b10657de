"""The OpenAI-compatible inference server and the run dashboard."""
