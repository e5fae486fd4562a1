"""generate: cached decoding equals recomputation, prefill buckets, streaming and batching change
nothing, memory plans, sampling filters, bounded compiles, bad input; SampleSettings: one set of
defaults, bad values refused."""

import dataclasses
import functools
import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from minigpt_jax import GPTConfig, SampleSettings, forward, generate, init_params
from minigpt_jax.sampling.api import generate_stream
from minigpt_jax.sampling.decode import decode, prefill
from minigpt_jax.sampling.filters import sample_token, top_k_filter, top_p_filter
from minigpt_jax.sampling.plan import plan_sampling, plan_slots, row_bytes, tokens_past_block

DIMS = chex.Dimensions(B=2, V=32)
CFG = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
NUM_NEW = 20  # with 11-token prompts, crosses block_size=16


@functools.cache
def _params(cfg: GPTConfig):
    """Random weights in cfg's param tree, drawn with numpy (jax's initialisers compile slowly on
    CPU); 4x the 0.02 init, so that logits are far from ties and attention is sharp."""
    shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        mean = 1.0 if path[-1].key == "scale" else 0.0  # LayerNorm scales stay near 1
        return jnp.asarray(mean + 0.08 * rng.standard_normal(leaf.shape), leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.cache
def _jit_forward(cfg: GPTConfig):
    return jax.jit(functools.partial(forward, cfg=cfg))


def _reference_greedy(params, cfg, prompts, num_new):
    """nanoGPT's loop: each step runs `forward` on the whole sequence, cropped to the last
    block_size tokens for learned positions, and appends the argmax. Rows are right-padded to
    one width (causality makes the padding invisible), so forward compiles once."""
    crop = cfg.block_size if cfg.pos_encoding == "learned" else None
    seqs = [list(p) for p in prompts]
    width = cfg.block_size if crop else max(map(len, seqs)) + num_new
    logits = []
    for _ in range(num_new):
        contexts = [s[-crop:] if crop else s for s in seqs]
        tokens_BxW = np.zeros((len(seqs), width), np.int32)
        for b, context in enumerate(contexts):
            tokens_BxW[b, : len(context)] = context
        logits_BxWxV = np.asarray(_jit_forward(cfg)(params, tokens_BxW))
        step_BxV = np.stack([logits_BxWxV[b, len(c) - 1] for b, c in enumerate(contexts)])
        logits.append(step_BxV)
        for seq, token in zip(seqs, step_BxV.argmax(-1), strict=True):
            seq.append(int(token))
    return [np.array(s) for s in seqs], np.stack(logits, axis=1)


def _prompts_BxT(length=11, seed=1):
    return np.random.default_rng(seed).integers(0, DIMS.V, (DIMS.B, length), np.int32)


def _nucleus(probs_V, p):
    """Ids of the fewest most likely tokens whose probability reaches p (numpy reference)."""
    order = np.argsort(-probs_V)
    num_kept = int(np.searchsorted(np.cumsum(probs_V[order]), p) + 1)
    return set(order[:num_kept].tolist())


class CachedDecodingTest(chex.TestCase):
    """Greedy cached decoding reproduces the recompute-everything loop, token for token."""

    def _assert_matches_reference(self, cfg, prompts):
        params = _params(cfg)
        out, logits = generate(
            params, cfg, prompts, NUM_NEW, rng=jax.random.key(0), temperature=0.0,
            return_logits=True,
        )  # fmt: skip
        ref_seqs, ref_logits = _reference_greedy(params, cfg, list(prompts), NUM_NEW)
        chex.assert_shape(logits, (DIMS.B, NUM_NEW, DIMS.V))
        for seq, ref in zip(out, ref_seqs, strict=True):
            np.testing.assert_array_equal(seq, ref)
        chex.assert_trees_all_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
        return out

    @parameterized.named_parameters(
        ("learned", "learned"), ("sinusoidal", "sinusoidal"), ("rope", "rope")
    )
    def test_batch_array_crossing_block_size(self, scheme):
        prompts_BxT = _prompts_BxT()
        out = self._assert_matches_reference(CFG.replace(pos_encoding=scheme), prompts_BxT)
        self.assertIsInstance(out, np.ndarray)
        chex.assert_shape(out, (DIMS.B, prompts_BxT.shape[1] + NUM_NEW))
        np.testing.assert_array_equal(out[:, : prompts_BxT.shape[1]], prompts_BxT)

    @parameterized.named_parameters(("learned", "learned"), ("rope", "rope"))
    def test_prompts_of_different_lengths_are_left_padded(self, scheme):
        """Each row equals its own unpadded run; learned positions crop the 18-token prompt."""
        lengths = (3, 18) if scheme == "learned" else (3, 11)
        prompts = [_prompts_BxT(length, seed=length)[0] for length in lengths]
        out = self._assert_matches_reference(CFG.replace(pos_encoding=scheme), prompts)
        self.assertEqual([len(s) for s in out], [n + NUM_NEW for n in lengths])
        for seq, prompt in zip(out, prompts, strict=True):
            np.testing.assert_array_equal(seq[: len(prompt)], prompt)

    @parameterized.named_parameters(("equal_lengths", (5, 5)), ("different_lengths", (3, 5)))
    def test_learned_positions_prefill_only_the_prompt_bucket(self, lengths):
        """Short prompts under learned positions fill an 8-slot prefill, not a block_size (16)
        one, and still equal nanoGPT's loop over block_size-wide contexts (the unbucketed path)
        in every token and logit, through the crop past block_size too (5 + 20 > 16)."""
        self.assertEqual(plan_slots(CFG, max(lengths), NUM_NEW).prompt, 8)
        prompts = [_prompts_BxT(n, seed=10 * i + n)[0] for i, n in enumerate(lengths)]
        self._assert_matches_reference(CFG, prompts)

    def test_zero_new_tokens_returns_the_prompt(self):
        prompts_BxT = _prompts_BxT()
        np.testing.assert_array_equal(
            generate(_params(CFG), CFG, prompts_BxT, 0, rng=jax.random.key(0)), prompts_BxT
        )


class SamplingTest(chex.TestCase):
    def _logits_BxV(self, batch=4):
        return jnp.asarray(3.0 * np.random.default_rng(2).standard_normal((batch, DIMS.V)))

    @parameterized.parameters(1, 5, DIMS.V)
    def test_top_k_filter_keeps_exactly_the_k_largest(self, k):
        logits_BxV = self._logits_BxV()
        kept_BxV = np.isfinite(np.asarray(top_k_filter(logits_BxV, k)))
        expected_BxV = np.zeros_like(kept_BxV)
        np.put_along_axis(expected_BxV, np.argsort(-np.asarray(logits_BxV))[:, :k], True, -1)
        np.testing.assert_array_equal(kept_BxV, expected_BxV)

    @parameterized.parameters(0.05, 0.5, 0.9, 1.0)
    def test_top_p_filter_keeps_exactly_the_nucleus(self, p):
        logits_BxV = self._logits_BxV()
        kept_BxV = np.isfinite(np.asarray(top_p_filter(logits_BxV, p)))
        probs_BxV = np.asarray(jax.nn.softmax(logits_BxV, axis=-1))
        for kept_V, probs_V in zip(kept_BxV, probs_BxV, strict=True):
            self.assertEqual(set(np.flatnonzero(kept_V).tolist()), _nucleus(probs_V, p))

    def _draws(self, logits_BxV, **kwargs):
        rngs = jax.random.split(jax.random.key(3), 1000)
        draw = jax.jit(lambda rng: sample_token(logits_BxV, rng, **kwargs))
        return np.asarray(jax.vmap(draw)(rngs))

    def test_samples_never_leave_the_top_k(self):
        logits_BxV = self._logits_BxV()
        draws = self._draws(logits_BxV, temperature=2.0, top_k=4)
        top4_Bx4 = np.argsort(-np.asarray(logits_BxV))[:, :4]
        for b in range(logits_BxV.shape[0]):
            self.assertEqual(set(draws[:, b].tolist()), set(top4_Bx4[b].tolist()))

    def test_samples_never_leave_the_nucleus(self):
        logits_BxV = self._logits_BxV()
        draws = self._draws(logits_BxV, temperature=1.0, top_p=0.8)
        probs_BxV = np.asarray(jax.nn.softmax(logits_BxV, axis=-1))
        for b in range(logits_BxV.shape[0]):
            nucleus = _nucleus(probs_BxV[b], 0.8)
            self.assertLessEqual(set(draws[:, b].tolist()), nucleus)
            self.assertGreater(len(set(draws[:, b].tolist())), 1 if len(nucleus) > 1 else 0)

    @parameterized.named_parameters(
        ("plain", {}), ("filtered", {"top_k": 3, "top_p": 0.5})
    )  # fmt: skip
    def test_temperature_zero_is_argmax(self, filters):
        logits_BxV = self._logits_BxV()
        sample = jax.jit(functools.partial(sample_token, logits_BxV, temperature=0.0, **filters))
        for seed in range(3):
            tokens_B = sample(jax.random.key(seed))
            np.testing.assert_array_equal(tokens_B, jnp.argmax(logits_BxV, axis=-1))

    def test_generate_is_reproducible_from_rng(self):
        run = functools.partial(
            generate, _params(CFG), CFG, _prompts_BxT(), NUM_NEW, temperature=1.0,
            return_logits=True,
        )  # fmt: skip
        first, _ = run(rng=jax.random.key(7))
        np.testing.assert_array_equal(first, run(rng=jax.random.key(7))[0])
        self.assertFalse(np.array_equal(first, run(rng=jax.random.key(8))[0]))

    def test_generate_samples_inside_top_k_and_nucleus(self):
        """Every new token lies in the top-k of its step's logits and in the nucleus of the
        tempered, top-k-filtered distribution."""
        k, p, temperature = 3, 0.7, 1.5
        out, logits_BxGxV = generate(
            _params(CFG), CFG, _prompts_BxT(), NUM_NEW, rng=jax.random.key(0),
            temperature=temperature, top_k=k, top_p=p, return_logits=True,
        )  # fmt: skip
        new_BxG = out[:, -NUM_NEW:]
        for b, j in np.ndindex(new_BxG.shape):
            order = np.argsort(-logits_BxGxV[b, j])
            self.assertIn(new_BxG[b, j], order[:k])
            top_k_probs = np.asarray(jax.nn.softmax(logits_BxGxV[b, j, order[:k]] / temperature))
            nucleus = {int(order[i]) for i in _nucleus(top_k_probs, p)}
            self.assertIn(new_BxG[b, j], nucleus)


def _compiled_count():
    return prefill._cache_size() + decode._cache_size()


class CompileCountTest(chex.TestCase):
    @parameterized.named_parameters(("learned", "learned"), ("rope", "rope"))
    def test_one_compile_per_prompt_length_bucket(self, scheme):
        """Calls with different prompt lengths, new-token counts and temperatures compile the
        prefill and the decoding loop once per prompt-length bucket (8 and 16 here, learned
        positions included; one new-token bucket, 32)."""
        cfg = CFG.replace(pos_encoding=scheme)
        params, sizes, buckets_seen = _params(cfg), [_compiled_count()], set()
        for i, length in enumerate((1, 5, 8, 9, 12, 16, 3, 15, 2)):
            prompts = [np.arange(length) % DIMS.V, np.arange(1 + i % 8) % DIMS.V]
            out, _ = generate(
                params, cfg, prompts, 17 + i, rng=jax.random.key(i), temperature=i / 4,
                return_logits=True,
            )  # fmt: skip
            self.assertLen(out[0], length + 17 + i)
            sizes.append(_compiled_count())
            bucket = 8 if length <= 8 else 16
            if bucket in buckets_seen:  # Same bucket as an earlier call: nothing new compiled.
                self.assertEqual(sizes[-1], sizes[-2], f"call {i} (length {length}) recompiled")
            buckets_seen.add(bucket)
        # Other tests may have compiled these entries already, hence at most.
        self.assertLessEqual(sizes[-1] - sizes[0], 4)

    def test_sampling_values_do_not_recompile(self):
        """temperature, top_k and top_p are traced: new values reuse the compiled loop."""
        run = functools.partial(
            generate, _params(CFG), CFG, _prompts_BxT(), NUM_NEW, rng=jax.random.key(0),
            return_logits=True,
        )  # fmt: skip
        run(temperature=1.5, top_k=3, top_p=0.7)
        size = _compiled_count()
        for temperature, k, p in ((0.5, 5, 0.9), (0.0, 1, 0.3), (2.0, DIMS.V + 9, 1.0)):
            run(temperature=temperature, top_k=k, top_p=p)
        self.assertEqual(_compiled_count(), size)


class StreamingAndBatchingTest(chex.TestCase):
    """Splitting the steps over compiled calls, or the prompts over batches, changes no token."""

    SETTINGS = dict(temperature=1.0, top_k=20)

    def _prompts(self, num=5):
        return [_prompts_BxT(3 + i % 4, seed=i)[0] for i in range(num)]

    def test_streamed_chunks_equal_generate(self):
        """Chunks of one token at first (a near-zero time target), past block_size included."""
        prompts, rng = self._prompts(2), jax.random.key(4)
        whole = generate(_params(CFG), CFG, prompts, NUM_NEW, rng=rng, **self.SETTINGS)
        chunks = list(
            generate_stream(
                _params(CFG), CFG, prompts, NUM_NEW, rng=rng, chunk_seconds=1e-9, **self.SETTINGS
            )
        )
        self.assertGreater(len(chunks), 5)
        self.assertEqual([c.first for c in chunks], sorted({c.first for c in chunks}))
        streamed_BxG = np.concatenate([c.tokens_BxC for c in chunks], axis=1)
        np.testing.assert_array_equal(streamed_BxG, np.stack([w[-NUM_NEW:] for w in whole]))

    def _run(self, cfg, **kwargs):
        """Three prompts, each step's logits too (one set of compiled shapes for the tests)."""
        return generate(
            _params(cfg), cfg, self._prompts(3), NUM_NEW, rng=jax.random.key(5),
            return_logits=True, **self.SETTINGS, **kwargs,
        )  # fmt: skip

    def _assert_same(self, first, second):
        for seq, ref in zip(first[0], second[0], strict=True):
            np.testing.assert_array_equal(seq, ref)
        chex.assert_trees_all_close(first[1], second[1], atol=1e-5, rtol=1e-5)

    @parameterized.named_parameters(("learned", "learned"), ("rope", "rope"))
    def test_batches_equal_one_batch(self, scheme):
        """Prompt i draws with fold_in(rng, i) whatever its batch; the last batch is padded."""
        cfg = CFG.replace(pos_encoding=scheme)
        self._assert_same(self._run(cfg, batch_size=2), self._run(cfg))

    def test_a_memory_budget_splits_the_prompts_into_batches(self):
        row = plan_sampling(CFG, 3, 6, NUM_NEW, return_logits=True).row_bytes
        budget = int(2.5 * row)
        tight = plan_sampling(
            CFG, 3, 6, NUM_NEW, SampleSettings(memory_bytes=budget), return_logits=True
        )
        self.assertEqual((tight.batch_size, tight.num_batches), (2, 2))
        self.assertTrue(tight.limited_by_memory)
        self._assert_same(self._run(CFG, memory_bytes=budget), self._run(CFG))

    def test_a_sample_that_does_not_fit_is_refused_in_one_line(self):
        with self.assertRaisesRegex(ValueError, "one sample needs about") as caught:
            generate(_params(CFG), CFG, self._prompts(1), 1000, rng=jax.random.key(0),
                     memory_bytes=10_000)  # fmt: skip
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertIn("sampling may use 9.8 KiB (memory_bytes)", message)
        self.assertIn("ask for fewer new tokens (max_new_tokens=1,000)", message)

    @parameterized.named_parameters(("learned", "learned", False), ("rope", "rope", True))
    def test_estimate_covers_what_decoding_holds(self, scheme, return_logits):
        """The estimate per row is at least the bytes of the arrays carried between calls."""
        cfg, batch = CFG.replace(pos_encoding=scheme), 3
        slots = plan_slots(cfg, 5, NUM_NEW)
        state = prefill(
            _params(cfg), np.ones((batch, slots.prompt), np.int32), np.full(batch, 5, np.int32),
            cfg=cfg, slots=slots, return_logits=return_logits,
        )  # fmt: skip
        held = sum(x.nbytes for x in jax.tree.leaves(state)) / batch
        self.assertGreaterEqual(sum(row_bytes(cfg, slots, return_logits).values()), held)

    def test_tokens_past_block_count_the_cropped_steps(self):
        """Token j (j >= 1) of a prompt of n tokens sees min(n, block) + j tokens; those past
        block_size=16 have no cache. Positions without a table never crop."""
        for length, num_new in ((5, 20), (16, 3), (30, 4), (3, 10)):
            cropped = sum(
                1 for j in range(1, num_new) if min(length, CFG.block_size) + j > CFG.block_size
            )
            self.assertEqual(tokens_past_block(CFG, length, num_new), cropped)
            self.assertEqual(
                tokens_past_block(CFG.replace(pos_encoding="rope"), length, num_new), 0
            )


class BadInputTest(chex.TestCase):
    def _generate(self, prompts, max_new_tokens=4, cfg=CFG, **kwargs):
        return generate(_params(cfg), cfg, prompts, max_new_tokens, rng=jax.random.key(0), **kwargs)

    def test_out_of_range_id_is_named(self):
        with self.assertRaisesRegex(ValueError, r"prompt 1: token id 32 at index \(2,\)"):
            self._generate([np.array([1, 2]), np.array([0, 1, 32])])

    def test_float_ids_are_refused(self):
        with self.assertRaisesRegex(TypeError, r"integer dtype, got float32.*astype\(np.int32\)"):
            self._generate(np.zeros((2, 3), np.float32))

    @parameterized.named_parameters(
        ("empty_array", np.zeros((2, 0), np.int32)),
        ("empty_row", [np.array([1, 2]), np.array([], np.int32)]),
        ("no_prompts", []),
    )
    def test_empty_prompt(self, prompts):
        with self.assertRaisesRegex(ValueError, "empty prompt.*at least one token"):
            self._generate(prompts)

    def test_one_dimensional_array_is_refused(self):
        with self.assertRaisesRegex(ValueError, r"shape \(3,\).*prompt_ids\[None, :\]"):
            self._generate(np.array([1, 2, 3]))

    def test_negative_max_new_tokens(self):
        with self.assertRaisesRegex(ValueError, "max_new_tokens=-1 is negative"):
            self._generate(_prompts_BxT(), max_new_tokens=-1)

    @parameterized.named_parameters(
        ("temperature", {"temperature": -1.0}, "temperature=-1.0 must be finite and >= 0"),
        ("top_k", {"top_k": 0}, "top_k=0 must be a positive int"),
        ("top_p", {"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\]"),
    )
    def test_bad_sampling_settings(self, kwargs, message):
        with self.assertRaisesRegex(ValueError, message):
            self._generate(_prompts_BxT(), **kwargs)

    def test_bad_batch_size(self):
        with self.assertRaisesRegex(ValueError, "batch_size=0 must be a positive int"):
            self._generate(_prompts_BxT(), batch_size=0)

    def test_max_len_exceeded(self):
        cfg = CFG.replace(pos_encoding="rope")
        with self.assertRaisesRegex(ValueError, "plus max_new_tokens=10 exceeds max_len=15"):
            self._generate(_prompts_BxT(length=6), max_new_tokens=10, cfg=cfg, max_len=15)

    def test_max_len_with_learned_positions_is_refused(self):
        with self.assertRaisesRegex(ValueError, "learned positions keep the last block_size"):
            self._generate(_prompts_BxT(), max_len=64)

    def test_bidirectional_model_is_refused(self):
        with self.assertRaisesRegex(ValueError, "causal=False"):
            # `causal` does not change the params, so CFG's serve.
            generate(
                _params(CFG), CFG.replace(causal=False), _prompts_BxT(), 4, rng=jax.random.key(0)
            )


class SampleSettingsTest(chex.TestCase):
    """One set of defaults for every entry point, and a bad value refused where it is made."""

    def test_no_entry_point_declares_defaults_of_its_own(self):
        """The sampling settings reach every layer as a SampleSettings: no function takes
        temperature, top_k or top_p with a default of its own (they once disagreed: 0.8 in the
        command and the texts, 1.0 in generate)."""
        from minigpt_jax.sampling.command import print_samples
        from minigpt_jax.sampling.decode import time_step_past_block
        from minigpt_jax.sampling.loop import decoded_batches
        from minigpt_jax.sampling.texts import sample_from_workdir, sample_texts, stream_texts

        entry_points = [
            generate, generate_stream, stream_texts, sample_texts, sample_from_workdir,
            print_samples, time_step_past_block, decoded_batches, plan_sampling,
        ]  # fmt: skip
        for function in entry_points:
            parameters = inspect.signature(function).parameters
            for name in ("temperature", "top_k", "top_p", "batch_size", "samples_per_batch"):
                self.assertNotIn(name, parameters, function.__qualname__)

    def test_the_command_line_defaults_are_the_settings_defaults(self):
        from minigpt_jax import cli

        defaults = SampleSettings()
        self.assertEqual(defaults.temperature, 1.0)  # the model's own distribution
        self.assertEqual(cli._TEMPERATURE.default, defaults.temperature)
        self.assertEqual(cli._TOP_K.default, defaults.top_k)
        self.assertEqual(cli._TOP_P.default, defaults.top_p)
        self.assertEqual(cli._SAMPLES_PER_BATCH.default, defaults.batch_size)

    def test_keywords_and_settings_give_the_same_tokens(self):
        """generate(...) with no settings, with SampleSettings(), with temperature=1.0, and
        with settings that a keyword overrides, draw the same tokens."""
        run = functools.partial(
            generate, _params(CFG), CFG, _prompts_BxT(), 9, rng=jax.random.key(2)
        )
        default = run()
        for same in (
            run(settings=SampleSettings()),
            run(temperature=1.0),
            run(settings=SampleSettings(temperature=0.0), temperature=1.0),
        ):
            np.testing.assert_array_equal(same, default)
        greedy = run(settings=SampleSettings(temperature=0.0))
        self.assertFalse(np.array_equal(greedy, default))
        np.testing.assert_array_equal(greedy, run(temperature=0))

    def test_settings_are_frozen(self):
        with self.assertRaises(dataclasses.FrozenInstanceError):
            SampleSettings().temperature = 0.5

    @parameterized.named_parameters(
        (
            "negative_temperature",
            {"temperature": -1.0},
            r"temperature=-1.0 must be .* >= 0 \(0 means",
        ),
        ("nan_temperature", {"temperature": float("nan")}, "temperature=nan must be finite"),
        ("text_temperature", {"temperature": "hot"}, "temperature='hot' must be finite"),
        ("zero_top_k", {"top_k": 0}, "top_k=0 must be a positive int, or None to keep all"),
        ("float_top_k", {"top_k": 2.5}, "top_k=2.5 must be a positive int"),
        ("top_p_above_one", {"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\], or None to keep"),
        ("zero_top_p", {"top_p": 0.0}, r"top_p=0.0 must be in \(0, 1\]"),
        ("zero_batch_size", {"batch_size": 0}, "batch_size=0 must be a positive int, or None"),
        ("negative_memory", {"memory_bytes": -1}, "memory_bytes=-1 must be a positive int"),
    )
    def test_a_bad_value_is_refused_naming_the_setting_and_the_fix(self, values, message):
        for make in (
            lambda: SampleSettings(**values),
            lambda: SampleSettings().replace(**values),
            lambda: generate(_params(CFG), CFG, _prompts_BxT(), 4, rng=jax.random.key(0), **values),
        ):
            with self.assertRaisesRegex(ValueError, message) as caught:
                make()
            self.assertNotIn("\n", str(caught.exception))

    def test_an_unknown_setting_is_refused_with_the_names(self):
        with self.assertRaisesRegex(
            TypeError, "unknown sampling setting temprature: the settings are temperature, top_k"
        ):
            generate(_params(CFG), CFG, _prompts_BxT(), 4, rng=jax.random.key(0), temprature=0.5)
