"""`python -m minigpt_jax train|prepare|sample|...` and the `minigpt-jax` script: the command line
(minigpt_jax.cli), with SIGINT/SIGTERM recorded before its imports (absl, ml_collections, JAX:
a second or more on a loaded machine), so a signal in that time is answered in one line too."""

from minigpt_jax.runtime.signals import record_signals_while_starting


def main() -> None:
    record_signals_while_starting()
    from minigpt_jax.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
