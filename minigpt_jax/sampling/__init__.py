"""Sampling, one concern a module: `settings` (SampleSettings), `filters` (how a token is drawn),
`plan` (slots and memory), `decode` (the compiled calls), `loop` (the host loop), `api`
(`generate`, `generate_stream`), `texts` (texts from a run, streamed) and `command` (the
`minigpt-jax sample` output)."""
