"""The course's embedding lab as a local web page: `minigpt-jax lab` (needs the `lab` extra).

`compute` holds the numbers (JAX, no UI); `app` the Gradio page; `text` its words in each language.
"""
