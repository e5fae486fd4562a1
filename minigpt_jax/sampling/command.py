"""`minigpt-jax sample`'s output: the texts of a run or of a Hugging Face GPT-2 directory on
stdout as they come, notices on stderr, and a signal's stop with what was sampled."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from minigpt_jax.model_files import LoadedModel, load_model, load_run
from minigpt_jax.runtime.signals import StopThenInterrupt
from minigpt_jax.sampling.options import SampleSettings
from minigpt_jax.sampling.texts import SampleText, stream_texts

COMMAND = "minigpt-jax sample"


def print_samples(
    *,
    workdir: str | Path | None = None,
    pretrained: str | Path | None = None,
    checkpoint: str = "latest",
    prompt: str,
    max_new_tokens: int,
    seed: int,
    num_samples: int,
    settings: SampleSettings,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """`minigpt-jax sample`: the samples of a run (or of a GPT-2 directory) on `out` as they
    come, each under a `---------- sample i/N` line when N > 1, and notices on `err`.

    SIGINT or SIGTERM stops it between compiled calls: what was sampled is printed, then one
    line on `err`. Returns the exit status: 0, or 128 + the signal's number when stopped.
    """
    out, err = out or sys.stdout, err or sys.stderr
    model: LoadedModel = load_model(pretrained) if pretrained else load_run(workdir, checkpoint)
    say = lambda line: print(f"{COMMAND}: {line}", file=err, flush=True)  # noqa: E731
    last, complete = None, 0
    with StopThenInterrupt() as stop:
        try:
            for piece in stream_texts(
                model.params, model.cfg, model.tokenizer, prompt, max_new_tokens=max_new_tokens,
                settings=settings, seed=seed, num_samples=num_samples, on_notice=say,
                should_stop=stop.requested,
            ):  # fmt: skip
                if last is None or piece.index != last.index:
                    if last is not None and not last.done:  # a sample cut off by a signal
                        out.write("\n")
                    if num_samples > 1:
                        out.write(f"---------- sample {piece.index + 1}/{num_samples}\n")
                out.write(piece.text + ("\n" if piece.done else ""))
                out.flush()
                last, complete = piece, complete + piece.done
        except KeyboardInterrupt:  # a second signal: stop now
            pass
        if not stop.requested() or complete == num_samples:
            return 0
        if last is not None and not last.done:
            out.write("\n")
            out.flush()
        progress = _progress(last, complete, num_samples, max_new_tokens)
        say(f"stopped by {stop.signal_name}{progress}")
        return 128 + stop.signal_number


def _progress(last: SampleText | None, complete: int, num_samples: int, max_new: int) -> str:
    """How far an interrupted `print_samples` got, for its last line."""
    cut = 0 if last is None else last.index + 1 - complete
    made = f"{last.new_tokens:,} of {max_new:,} new tokens" if cut else ""
    if num_samples == 1:
        return f" after {made or 'no new tokens'}; the text above is all that was sampled."
    cut_off = f", {cut:,} cut off at {made}" if cut else ""
    return (
        f": {complete:,} of {num_samples:,} samples complete{cut_off}; the text above is all "
        "that was sampled."
    )
