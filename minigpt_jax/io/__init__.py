"""Reading and writing models and runs: Hugging Face GPT-2 checkpoints (`pretrained`),
sampling (`sampling`), sampling from a run (`runs`) and perplexity (`evaluate`)."""
