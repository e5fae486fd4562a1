"""Data preparation at scale: streaming a multi-file corpus into token shards, and training on them.

Run:      python -m benchmarks.data_prep [--size-gb 1] [--files 64] [--naive-mb 100] \
            [--vocab-size 8192] [--sample-mb 16] [--tmp-dir DIR] [--keep]
Corpus:   generated on the fly in a temporary folder (deleted afterwards unless --keep): --files
          files, half .txt (one document each) and half .jsonl (documents of 2-20 kB, one per
          line), of paragraphs of CPython's documentation (pydoc_data) drawn at random.
Measures: `minigpt-jax prepare` in a child process per tokenizer (char; byte-level BPE trained on
          a --sample-mb sample), timed end to end (tokenizer building included): MB/s, tokens/s
          and the child's peak RSS (os.wait4). Then the naive path of today, data.format=memory
          (read every .txt into one string, encode it in one call, hold the tokens in RAM), on
          --naive-mb of .txt files, next to `prepare` on the very same files. Then a
          configs/gpt2_small.py-shaped run (its batch of 512 x 1024 tokens in 32 micro-batches,
          block 1024, steps_per_call 1; a tiny model) on the shards of the last --tokenizers
          entry: the time from launch to the first optimizer step and the peak RSS meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GPT2_SMALL = str(REPO / "configs" / "gpt2_small.py")
# A tiny model with configs/gpt2_small.py's data path and batch shape, steps kept few.
TRAIN_OVERRIDES = {
    "model.n_layer": 2,
    "model.n_head": 2,
    "model.n_embd": 64,
    "model.dtype": "float32",  # bfloat16 is emulated, hence slow, on CPU
    "steps_per_call": 1,
    "num_steps": 3,
    "eval_every": 3,
    "checkpoint_every": 3,
    "eval_batches": 1,
}


def _paragraphs() -> list[str]:
    from pydoc_data.topics import topics

    return [p for key in sorted(topics) for p in topics[key].split("\n\n") if p.strip()]


def make_corpus(root: Path, size_bytes: int, files: int, seed: int = 0) -> int:
    """Writes `files` files of about size_bytes in all; returns the bytes written."""
    rng = np.random.default_rng(seed)
    paragraphs = [p.encode() for p in _paragraphs()]
    per_file, written = size_bytes // files, 0
    for i in range(files):
        jsonl = i % 2 == 1
        path = root / f"part_{i:04d}.{'jsonl' if jsonl else 'txt'}"
        with path.open("wb") as file:
            size = 0
            while size < per_file:
                doc, doc_size = [], 0
                target = rng.integers(2_000, 20_000) if jsonl else per_file
                while doc_size < target and size + doc_size < per_file:
                    block = b"\n\n".join(
                        paragraphs[j] for j in rng.integers(0, len(paragraphs), 64)
                    )
                    doc.append(block)
                    doc_size += len(block) + 2
                text = b"\n\n".join(doc)
                if jsonl:
                    line = json.dumps({"text": text.decode()}).encode() + b"\n"
                else:
                    line = text
                file.write(line)
                size += len(line)
        written += size
    return written


def _popen_wait(args: list[str], on_tick=None) -> tuple[float, int, str, str]:
    """Runs a child; returns (wall seconds, its peak RSS in bytes from wait4, stdout, stderr)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.NamedTemporaryFile("w+") as err:
        proc = subprocess.Popen(
            args, stdout=out, stderr=err, text=True, cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )  # fmt: skip
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if on_tick is not None:
                on_tick(proc.pid, time.perf_counter() - start, Path(err.name))
            time.sleep(0.2)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return wall, usage.ru_maxrss * 1024, stdout, stderr  # Linux reports kB


def _cli(command: str, workdir: Path, overrides: dict, progress: bool = False) -> list[str]:
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    return [
        sys.executable, "-m", "minigpt_jax", command, "--config", GPT2_SMALL,
        f"--workdir={workdir}", f"--progress={str(progress).lower()}", *flags,
    ]  # fmt: skip


def _data_overrides(corpus: Path, tokenizer: str, vocab_size: int, sample_mb: int) -> dict:
    return {
        "data.corpus": "text",
        "data.path": corpus,
        "data.format": "shards",
        "data.tokenizer": tokenizer,
        "data.vocab_size": vocab_size,
        "data.tokenizer_sample_bytes": sample_mb << 20,
    }


def prepare(corpus: Path, out: Path, tokenizer: str, vocab_size: int, sample_mb: int) -> dict:
    overrides = _data_overrides(corpus, tokenizer, vocab_size, sample_mb)
    wall, rss, stdout, _ = _popen_wait(_cli("prepare", out, overrides))
    manifest = json.loads((out / "shards" / "manifest.json").read_text())
    return {"wall": wall, "rss": rss, "manifest": manifest, "stdout": stdout.strip()}


_NAIVE = """
import sys, time
from minigpt_jax.data.in_memory import prepare_dataset
start = time.perf_counter()
dataset = prepare_dataset("text", sys.argv[1], sys.argv[2], int(sys.argv[3]), 1024, None)
print(len(dataset.train) + len(dataset.val), time.perf_counter() - start)
"""


def naive(corpus: Path, tokenizer: str, vocab_size: int) -> dict:
    wall, rss, stdout, _ = _popen_wait(
        [sys.executable, "-c", _NAIVE, str(corpus), tokenizer, str(vocab_size)]
    )
    tokens, _ = stdout.split()
    return {"wall": wall, "rss": rss, "tokens": int(tokens)}


def _rss_now(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def train_on_shards(data_overrides: dict, shards_dir: Path, workdir: Path) -> dict:
    """The gpt2_small-shaped run on prepared shards: time to the first step, RSS over the run."""
    overrides = {**data_overrides, "data.shards_dir": shards_dir, **TRAIN_OVERRIDES}
    seen = {"first_step": None, "rss_max": 0}

    def on_tick(pid, elapsed, stderr_path):
        seen["rss_max"] = max(seen["rss_max"], _rss_now(pid))
        # The progress bar moves to 1/N once step 1's metrics are back on the host.
        if seen["first_step"] is None and re.search(r"\| 1/\d", stderr_path.read_text()):
            seen["first_step"] = elapsed

    args = _cli("train", workdir, overrides, progress=True)
    wall, rss, stdout, _ = _popen_wait(args, on_tick)
    return {
        "wall": wall,
        "rss": rss,
        "rss_polled": seen["rss_max"],
        "first_step": seen["first_step"],
        "stdout": stdout.strip(),
        "command": " ".join(str(a) for a in args),
    }


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--naive-mb", type=int, default=100)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--sample-mb", type=int, default=16)
    parser.add_argument("--tokenizers", default="char,bpe")
    parser.add_argument("--tmp-dir", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-train", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))  # still clean up

    root = Path(tempfile.mkdtemp(prefix="minigpt_data_prep_", dir=args.tmp_dir))
    try:
        corpus = root / "corpus"
        corpus.mkdir()
        start = time.perf_counter()
        size = make_corpus(corpus, int(args.size_gb * 2**30), args.files)
        print(
            f"corpus: {args.files} files ({args.files - args.files // 2} .txt, "
            f"{args.files // 2} .jsonl), {size / 2**30:.2f} GiB of text, generated in "
            f"{time.perf_counter() - start:.0f} s in {corpus}"
        )
        print(f"{'path':<34} {'input':>9} {'wall s':>8} {'MB/s':>7} {'tokens':>14} "
              f"{'tokens/s':>11} {'peak RSS':>9}")  # fmt: skip

        def row(name, nbytes, wall, tokens, rss):
            print(
                f"{name:<34} {_mb(nbytes):>9} {wall:>8.1f} {nbytes / 2**20 / wall:>7.2f} "
                f"{tokens:>14,} {tokens / wall:>11,.0f} {_mb(rss):>9}"
            )

        prepared = {}
        for kind in args.tokenizers.split(","):
            result = prepare(corpus, root / f"prep_{kind}", kind, args.vocab_size, args.sample_mb)
            manifest = result["manifest"]
            prepared[kind] = root / f"prep_{kind}" / "shards"
            row(f"prepare --tokenizer {kind}", size, result["wall"], manifest["tokens"],
                result["rss"])  # fmt: skip
            print(
                f"  {len(manifest['shards'])} shards of {manifest['dtype']}, "
                f"{manifest['documents']:,} documents, "
                f"vocab {manifest['tokenizer']['vocab_size']:,}, "
                f"encoding alone {manifest['prepare_seconds']:.1f} s"
            )

        # The naive path needs .txt files only; the same files for both paths.
        subset, subset_size = root / "subset", 0
        subset.mkdir()
        for path in sorted(corpus.glob("*.txt")):
            if subset_size >= args.naive_mb << 20:
                break
            os.link(path, subset / path.name)
            subset_size += path.stat().st_size
        for kind in args.tokenizers.split(","):
            result = naive(subset, kind, args.vocab_size)
            row(f"naive (memory) --tokenizer {kind}", subset_size, result["wall"],
                result["tokens"], result["rss"])  # fmt: skip
            result = prepare(subset, root / f"subset_{kind}", kind, args.vocab_size, args.sample_mb)
            row(f"prepare (same files) {kind}", subset_size, result["wall"],
                result["manifest"]["tokens"], result["rss"])  # fmt: skip

        if not args.no_train:
            kind = list(prepared)[-1]  # bpe when it was prepared
            data_overrides = _data_overrides(corpus, kind, args.vocab_size, args.sample_mb)
            result = train_on_shards(data_overrides, prepared[kind], root / "train")
            print(f"train: {result['command']}")
            print(f"  {result['stdout']}")
            print(
                f"  time to first step {result['first_step']:.1f} s (launch, imports, "
                f"shards check, compile, one step of 512 x 1024 tokens in 32 micro-batches); "
                f"peak RSS {_mb(result['rss'])} (polled while training: "
                f"{_mb(result['rss_polled'])}); wall {result['wall']:.1f} s"
            )
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
