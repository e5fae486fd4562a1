"""Sampling: `generate` and `generate_stream` (`api`), and texts from a run or a Hugging Face
GPT-2 directory, streamed as they come (`texts`, the `sample` command)."""
