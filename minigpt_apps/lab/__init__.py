"""The course's embedding lab as a local web page: `minigpt-jax lab` (needs the `lab` extra).

`compute` holds the numbers (JAX, no UI); `app` the Gradio page, built from `parts` (the table of
parts), `views` and `actions` over `state` (the shared table), `markup` and `figures`; `text` its
words in each language.
"""

import os
import tempfile

# The lab talks to no one but its own browser tab: no usage statistics. Set here, before any
# module of the lab imports gradio (some of its modules read these at import).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Gradio's files go to a folder of this process's own (it stores nothing there while the lab
# refuses files, see serving.Gatekeeper), which the lab removes when it stops, where they went
# to the temp folder's gradio/, shared with every other Gradio app, and stayed.
TEMP_DIR = os.path.join(tempfile.gettempdir(), f"minigpt-jax-lab-{os.getpid()}")
if "GRADIO_TEMP_DIR" not in os.environ:
    os.environ["GRADIO_TEMP_DIR"] = TEMP_DIR
