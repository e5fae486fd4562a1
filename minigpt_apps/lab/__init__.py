"""The course's embedding lab as a local web page: `minigpt-jax lab` (needs the `lab` extra).

`compute` holds the numbers (JAX, no UI); `app` the Gradio page, built from `parts` (the table of
parts), `views` and `actions` over `state` (the shared table), `markup` and `figures`; `text` its
words in each language.
"""

import os

from minigpt_apps.lab.serving import use_own_temp_dir

# The lab talks to no one but its own browser tab: no usage statistics. Set here, before any
# module of the lab imports gradio (some of its modules read these at import).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
use_own_temp_dir()
