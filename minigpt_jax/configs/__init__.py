"""The built-in experiment configs, shipped inside the package: each module's get_config(arg)
returns an ml_collections.ConfigDict. `--config tiny` (or `tiny:arg`) names one; a config file
of your own starts from one:

    from minigpt_jax.configs import tiny

    def get_config(arg=None):
        config = tiny.get_config()
        config.model.n_layer = 4
        return config

The repository's configs/*.py re-export these. Imports nothing of the package.
"""
