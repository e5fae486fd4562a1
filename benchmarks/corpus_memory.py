"""The memory budget of a text corpus read into RAM, against the peak RSS it really takes.

Run:      python -m benchmarks.corpus_memory [--sizes-mb 16,64,128,256] [--tokenizers char]
            [--vocab-size 512] [--tmp-dir DIR]
Corpus:   one .txt file per size, generated in a temporary folder (deleted afterwards) from
          paragraphs of CPython's documentation (pydoc_data) drawn at random until it holds
          that many MB (10^6 bytes).
Measures: data.format=memory's whole path (`in_memory.prepare_dataset`: read the text, build the
          tokenizer on it, encode it in one call, split the tokens) in a child process per
          (size, tokenizer): its peak RSS (VmHWM) less its RSS before it reads the text,
          divided by the text's bytes (after a first call on 100 kB of text, so first-call costs
          are not counted as the text's), next to what the budget assumes
          (`budget.TEXT_BYTES_PER_BYTE`). A row whose measured figure is above the budget's is
          marked UNDER: the budget would let a text through that does not fit.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from pydoc_data.topics import topics

from minigpt_jax import budget

REPO = Path(__file__).resolve().parent.parent

# The child: imports, runs the in-memory path on a 100 kB text (the lazy imports and first-call
# costs), notes its RSS, then runs it on the file.
CHILD = """
import sys
from minigpt_jax.data.in_memory import prepare_dataset

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

path, kind, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
prepare_dataset("text", sys.argv[4], kind, vocab, 16, None)  # what the first call loads
print("baseline", status("VmRSS"), flush=True)
dataset = prepare_dataset("text", path, kind, vocab, 16, None)
print("tokens", dataset.train.size + dataset.val.size, flush=True)
print("peak", status("VmHWM"), flush=True)
"""

# The peak is the child's own VmHWM, not wait4's ru_maxrss: a forked child's ru_maxrss keeps the
# parent's RSS from before exec (a pytest process with JAX loaded is ~430 MB).


def write_corpus(path: Path, size_bytes: int, seed: int = 0) -> None:
    """A .txt file of exactly `size_bytes` bytes of pydoc paragraphs drawn at random."""
    paragraphs = [p for text in topics.values() for p in text.split("\n\n") if p.strip()]
    rng = random.Random(seed)
    written = 0
    with open(path, "w", encoding="ascii", errors="replace") as file:
        while written < size_bytes:
            part = (rng.choice(paragraphs) + "\n\n").encode("ascii", "replace")
            part = part[: size_bytes - written]
            file.write(part.decode("ascii"))
            written += len(part)


def measure(path: Path, kind: str, vocab_size: int) -> tuple[int, int]:
    """(peak RSS, RSS after the imports) in bytes of the child on `path`."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    warm_up = path.with_name("warm_up.txt")
    write_corpus(warm_up, 100_000, seed=1)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), kind, str(vocab_size), str(warm_up)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    out, _ = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the child failed on {path} ({kind}): exit {child.returncode}")
    printed = dict(line.split()[:2] for line in out.splitlines())
    return int(printed["peak"]), int(printed["baseline"])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="16,64,128,256")
    parser.add_argument("--tokenizers", default="char")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--tmp-dir", default=None)
    args = parser.parse_args(argv)
    rows = []
    print(
        f"{'text MB':>8} {'tokenizer':>9} {'peak RSS MB':>12} {'baseline MB':>12} "
        f"{'bytes/byte':>10} {'budget':>7}"
    )
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        for size_mb in (int(s) for s in args.sizes_mb.split(",")):
            path = Path(tmp) / f"corpus_{size_mb}mb.txt"
            write_corpus(path, size_mb * 10**6)
            for kind in args.tokenizers.split(","):
                peak, baseline = measure(path, kind, args.vocab_size)
                per_byte = (peak - baseline) / path.stat().st_size
                assumed = budget.TEXT_BYTES_PER_BYTE[kind]
                rows.append({"mb": size_mb, "tokenizer": kind, "peak": peak, "per_byte": per_byte})
                print(
                    f"{size_mb:>8} {kind:>9} {peak / 1e6:>12,.0f} {baseline / 1e6:>12,.0f} "
                    f"{per_byte:>10.1f} {assumed:>7}" + ("  UNDER" if per_byte > assumed else ""),
                    flush=True,
                )
            path.unlink()
    return rows


if __name__ == "__main__":
    main()
