"""The automatic speed settings equal the plain path: attention kernels, the Dense VJP, the
LayerNorm VJP, vocabulary padding, the chunked loss and the compute-dtype read-out (values and
gradients, float tolerance); bfloat16 matmul operands within their stated tolerance of float32.
"""

import functools
import unittest
import unittest.mock

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from minigpt_jax import GPTConfig, forward, init_params, next_token_losses
from minigpt_jax.model.attention import attention_weights, causal_mask, mix_values
from minigpt_jax.model.embeddings import read_out
from minigpt_jax.model.gpt import forward_with_cache, init_cache
from minigpt_jax.model.speed import backend, dense, kernels
from minigpt_jax.model.speed.kernels import choose_kernel, fused_attention
from minigpt_jax.model.speed.layernorm import DirectLayerNorm
from minigpt_jax.sampling.api import generate

CFG = GPTConfig(vocab_size=61, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
TOL = dict(atol=2e-5, rtol=2e-5)


@functools.cache
def _params(cfg: GPTConfig, seed: int = 0):
    return init_params(cfg, jax.random.key(seed))


def _tokens_BxT1(shape=(3, 13), vocab=CFG.vocab_size, seed=1):
    return jax.random.randint(jax.random.key(seed), shape, 0, vocab)


def _mean_loss(params, tokens_BxT1, cfg):
    return next_token_losses(params, tokens_BxT1, cfg).mean()


_loss_and_grads = jax.jit(jax.value_and_grad(_mean_loss), static_argnums=2)


ON_CPU = unittest.skipUnless(jax.default_backend() == "cpu", "what auto means on CPU")


class ResolutionTest(chex.TestCase):
    """What "auto" means on CPU, and wherever its conditions fail (tests/test_gpu.py: on GPU)."""

    @ON_CPU
    def test_auto_on_cpu(self):
        self.assertEqual(backend.dense_grad(CFG), "direct")
        self.assertEqual(backend.norm_grad(CFG), "direct")
        self.assertEqual(choose_kernel(CFG, weight_dropout=False, cached=False), "explicit")
        self.assertEqual(choose_kernel(CFG, weight_dropout=False, cached=True), "explicit")

    def test_attention_weight_dropout_takes_the_explicit_path(self):
        self.assertEqual(choose_kernel(CFG, weight_dropout=True, cached=False), "explicit")

    def test_cudnn_needs_half_precision_and_a_head_dim_multiple_of_8(self):
        self.assertFalse(kernels.cudnn_attention_supported(CFG))  # float32
        odd_heads = CFG.replace(dtype="bfloat16", n_embd=36, n_head=6)  # head dim 6
        self.assertFalse(kernels.cudnn_attention_supported(odd_heads))

    @ON_CPU
    def test_cudnn_needs_an_nvidia_gpu(self):
        self.assertFalse(kernels.cudnn_attention_supported(CFG.replace(dtype="bfloat16")))

    def test_speed_is_chosen_once_per_config(self):
        """speed_of(cfg) holds what the backend functions resolve, the kernel of each kind of call
        as choose_kernel names it; it is made once per config (a backend that changed after
        does not move it; a new config sees the change), and a pickle leaves it out."""
        import itertools
        import pickle

        from minigpt_jax.model.speed.kernels import ATTENTION_KERNELS

        cfg = CFG.replace(n_layer=3)  # a config of this test's own, its speed not made yet
        speed = backend.speed_of(cfg)
        self.assertEqual(
            (speed.dense_grad, speed.norm_grad, speed.matmul_dtype),
            (backend.dense_grad(cfg), backend.norm_grad(cfg), backend.matmul_dtype(cfg)),
        )
        for dropout, cached, plain in itertools.product((False, True), repeat=3):
            name = choose_kernel(cfg, weight_dropout=dropout, cached=cached, plain_mask=plain)
            self.assertIs(speed.kernels[dropout, cached, plain], ATTENTION_KERNELS[name])
        elsewhere = "gpu" if jax.default_backend() == "cpu" else "cpu"
        with unittest.mock.patch.object(jax, "default_backend", lambda: elsewhere):
            self.assertIs(backend.speed_of(cfg), speed)
            fresh = CFG.replace(n_layer=5)
            self.assertEqual(
                backend.speed_of(fresh).dense_grad, "direct" if elsewhere == "cpu" else "autodiff"
            )
        restored = pickle.loads(pickle.dumps(cfg))
        self.assertNotIn("_speed", restored.__dict__)
        self.assertEqual(restored, cfg)
        self.assertEqual(backend.speed_of(restored).dense_grad, speed.dense_grad)

    def test_for_training_makes_the_speed_choices_before_the_trace(self):
        trained = backend.for_training(CFG.replace(n_layer=6))
        self.assertIn("_speed", trained.__dict__)
        self.assertEqual(backend.speed_of(trained).matmul_dtype, backend.training_matmul_dtype())

    def test_explicit_choices_are_kept(self):
        self.assertEqual(backend.dense_grad(CFG.replace(dense_grad="autodiff")), "autodiff")
        self.assertEqual(backend.norm_grad(CFG.replace(norm_grad="autodiff")), "autodiff")
        explicit = CFG.replace(attention="explicit")
        self.assertEqual(choose_kernel(explicit, weight_dropout=False, cached=False), "explicit")
        cudnn = CFG.replace(attention="cudnn", dtype="bfloat16")
        self.assertEqual(choose_kernel(cudnn, weight_dropout=False, cached=False), "cudnn")
        self.assertEqual(choose_kernel(cudnn, weight_dropout=False, cached=True), "xla")


class AttentionKernelTest(parameterized.TestCase):
    """Every kernel available on CPU computes what the explicit softmax path does."""

    @parameterized.product(causal=(True, False), dtype=("float32", "bfloat16"))
    def test_fused_xla_equals_explicit(self, causal, dtype):
        q, k, v = (
            jax.random.normal(jax.random.key(i), (2, 7, 3, 8)).astype(dtype) for i in range(3)
        )
        positions_1xT = jnp.arange(7)[None, :]
        mask = causal_mask(positions_1xT, positions_1xT) if causal else None

        def explicit(q, k, v):
            return mix_values(attention_weights(q, k, mask), v).astype(jnp.float32)

        def fused(q, k, v):
            out = fused_attention(q, k, v, None, causal=causal, implementation="xla")
            return out.astype(jnp.float32)

        tol = TOL if dtype == "float32" else dict(atol=2e-2, rtol=2e-2)
        chex.assert_trees_all_close(fused(q, k, v), explicit(q, k, v), **tol)
        cotangent = jax.random.normal(jax.random.key(9), (2, 7, 3, 8))
        grads = [
            jax.grad(lambda *a, f=f: jnp.sum(f(*a) * cotangent), argnums=(0, 1, 2))(q, k, v)
            for f in (fused, explicit)
        ]
        chex.assert_trees_all_close(grads[0], grads[1], **tol)

    @parameterized.parameters(
        ("xla", True, True), ("xla", False, False), ("auto", True, False), ("auto", False, True)
    )
    def test_model_logits_and_grads(self, attention, causal, tied):
        explicit = CFG.replace(attention="explicit", causal=causal, tie_embeddings=tied)
        fast = explicit.replace(attention=attention)
        params, tokens = _params(explicit), _tokens_BxT1()
        chex.assert_trees_all_close(
            forward(params, tokens, fast), forward(params, tokens, explicit), **TOL
        )
        chex.assert_trees_all_close(
            _loss_and_grads(params, tokens, fast), _loss_and_grads(params, tokens, explicit), **TOL
        )

    def test_cache_path_with_left_padding(self):
        """Prefill with left padding (negative positions) then one decode step through the
        cache: XLA's kernel with the padding mask gives the explicit path's logits."""
        tokens_BxT = _tokens_BxT1((2, 6))
        positions_BxT = jnp.array([[-1, -1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
        next_Bx1, next_positions_Bx1 = _tokens_BxT1((2, 1), seed=5), jnp.array([[4], [6]])
        results = {}
        for attention in ("explicit", "xla", "auto"):
            cfg = CFG.replace(attention=attention)
            params = _params(CFG)
            logits_BxTxV, cache = forward_with_cache(
                params, tokens_BxT, positions_BxT, init_cache(cfg, 2, 8), cfg
            )
            step_Bx1xV, _ = forward_with_cache(params, next_Bx1, next_positions_Bx1, cache, cfg)
            # Padding queries attend to nothing; only real tokens' logits are defined.
            results[attention] = (logits_BxTxV[:, 2:], step_Bx1xV)
        chex.assert_trees_all_close(results["xla"], results["explicit"], **TOL)
        chex.assert_trees_all_close(results["auto"], results["explicit"], **TOL)

    def test_attention_weights_still_come_out(self):
        """forward_with_attention takes the explicit path whatever cfg.attention says."""
        from minigpt_jax import forward_with_attention

        logits, weights = forward_with_attention(_params(CFG), _tokens_BxT1((2, 5)), CFG)
        chex.assert_shape(weights, [(2, CFG.n_head, 5, 5)] * CFG.n_layer)
        chex.assert_trees_all_close(logits, forward(_params(CFG), _tokens_BxT1((2, 5)), CFG), **TOL)


class DenseGradTest(chex.TestCase):
    def test_auto_equals_autodiff(self):
        params, tokens = _params(CFG), _tokens_BxT1()
        chex.assert_trees_all_close(
            _loss_and_grads(params, tokens, CFG.replace(dense_grad="auto")),
            _loss_and_grads(params, tokens, CFG.replace(dense_grad="autodiff")),
            **TOL,
        )


class NormGradTest(parameterized.TestCase):
    """norm_grad="direct" (speed.layernorm.DirectLayerNorm) is flax's nn.LayerNorm: the same
    parameter tree, output and gradients (input, scale, bias), within float32 tolerance."""

    @parameterized.product(use_bias=(True, False), dtype=("float32", "bfloat16"))
    def test_direct_layer_norm_equals_flax(self, use_bias, dtype):
        options = dict(epsilon=1e-5, use_bias=use_bias, dtype=jnp.float32)
        direct, flax_ln = DirectLayerNorm(**options), nn.LayerNorm(**options)
        # Rows with a mean far from 0 (the residual stream's), in float32 or bfloat16 input.
        x_BxTxD = (3.0 + 2.0 * jax.random.normal(jax.random.key(0), (2, 5, 24))).astype(dtype)
        params = flax_ln.init(jax.random.key(1), x_BxTxD)
        chex.assert_trees_all_equal(direct.init(jax.random.key(1), x_BxTxD), params)
        params = jax.tree.map(  # a scale and bias away from their init, so both are exercised
            lambda p: p + jax.random.normal(jax.random.key(2), p.shape), params
        )
        cotangent_BxTxD = jax.random.normal(jax.random.key(3), x_BxTxD.shape)

        def loss(module, params, x):
            return jnp.sum(module.apply(params, x) * cotangent_BxTxD)

        chex.assert_trees_all_close(
            direct.apply(params, x_BxTxD), flax_ln.apply(params, x_BxTxD), **TOL
        )
        grads = [
            jax.grad(functools.partial(loss, module), argnums=(0, 1))(params, x_BxTxD)
            for module in (direct, flax_ln)
        ]
        self.assertEqual(grads[0][1].dtype, x_BxTxD.dtype)
        # A bfloat16 input's gradient is float32 math rounded to 8 bits: within one rounding.
        tol = TOL if dtype == "float32" else dict(atol=1e-2, rtol=1e-2)
        chex.assert_trees_all_close(
            jax.tree.map(lambda g: g.astype(jnp.float32), grads[0]),
            jax.tree.map(lambda g: g.astype(jnp.float32), grads[1]),
            **tol,
        )

    def test_model_auto_equals_autodiff(self):
        params, tokens = _params(CFG), _tokens_BxT1()
        chex.assert_trees_all_equal(_params(CFG.replace(norm_grad="direct")), params)
        chex.assert_trees_all_close(
            _loss_and_grads(params, tokens, CFG.replace(norm_grad="auto")),
            _loss_and_grads(params, tokens, CFG.replace(norm_grad="autodiff")),
            **TOL,
        )


# /proc/cpuinfo "flags" lines of real CPUs, cut to the flags that matter (tests/test_machine.py
# has their whole blocks): Zen 4 EPYC (AVX512-BF16), Sapphire Rapids Xeon (AMX), a Cascade Lake
# Xeon (AVX-512, no bf16 unit), an AVX2-only EPYC (Zen 2).
ZEN4_FLAGS = "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_vnni avx512_bf16 vaes"
AMX_FLAGS = "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_fp16 amx_bf16 amx_tile amx_int8"
CASCADE_LAKE_FLAGS = "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_vnni"
ZEN2_FLAGS = "flags\t\t: fpu sse2 avx fma avx2 sha_ni clzero"
# bfloat16 operands (8 significant bits, rounding error 2^-9 each) with float32 sums, against
# float32: the loss within BF16_LOSS_RTOL, each gradient within BF16_GRAD_TOL of its leaf's
# largest entry and within BF16_GRAD_NORM_TOL in relative norm. Seen on CFG: 1e-5 (loss),
# 6e-3 (largest entry), 2e-3 (norm).
BF16_LOSS_RTOL, BF16_GRAD_TOL, BF16_GRAD_NORM_TOL = 1e-3, 2e-2, 1e-2


def _old_direct_dot_general(lhs, rhs, dimension_numbers, precision=None, **kw):
    """The Dense VJP as it was before matmul_dtype (commit 7095e3e), for the Dense layout
    only: the reference that matmul_dtype="float32" must equal bit for bit."""

    @jax.custom_vjp
    def matmul(x_MxI, w_IxO):
        return jax.lax.dot_general(x_MxI, w_IxO, (((1,), (0,)), ((), ())), precision=precision)

    def matmul_bwd(residuals, dy_MxO):
        x_MxI, w_IxO = residuals
        dx = jax.lax.dot_general(dy_MxO, w_IxO, (((1,), (1,)), ((), ())), precision=precision)
        dw = jax.lax.dot_general(x_MxI, dy_MxO, (((0,), (0,)), ((), ())), precision=precision)
        return dx.astype(x_MxI.dtype), dw.astype(w_IxO.dtype)

    matmul.defvjp(lambda x, w: (matmul(x, w), (x, w)), matmul_bwd)
    n = len(dimension_numbers[0][0])
    contracted = int(np.prod(rhs.shape[:n]))
    out_MxO = matmul(lhs.reshape(-1, contracted), rhs.reshape(contracted, -1))
    return out_MxO.reshape(*lhs.shape[: lhs.ndim - n], *rhs.shape[n:])


class MatmulDtypeTest(parameterized.TestCase):
    """GPTConfig.matmul_dtype: what "auto" picks, float32 unchanged bit for bit, bfloat16 within
    its tolerance of float32 on both differentiation paths."""

    def test_bf16_dot_unit_is_read_from_real_flag_lines(self):
        self.assertTrue(backend.has_bf16_dot(ZEN4_FLAGS))
        self.assertTrue(backend.has_bf16_dot(AMX_FLAGS))
        self.assertFalse(backend.has_bf16_dot(CASCADE_LAKE_FLAGS))
        self.assertFalse(backend.has_bf16_dot(ZEN2_FLAGS))
        self.assertFalse(backend.has_bf16_dot(""))  # no /proc/cpuinfo (macOS, some containers)
        self.assertFalse(backend.has_bf16_dot("flags : avx512_bf16x amx_bf16_lite"))

    def test_this_machines_flags_are_read_once(self):
        self.assertIs(backend.cpu_flags(), backend.cpu_flags())  # cached
        on_cpu = jax.default_backend() == "cpu"  # elsewhere XLA:CPU runs no training step
        self.assertEqual(
            on_cpu and backend.has_bf16_dot(backend.cpu_flags()), backend.bf16_matmuls_pay()
        )

    def test_auto_is_float32_in_the_model_and_explicit_choices_are_kept(self):
        """Evaluation, sampling, export and interop read the same float32 figures on every
        CPU: inside the model "auto" multiplies in float32."""
        self.assertEqual(backend.matmul_dtype(CFG), "float32")
        for choice in ("float32", "bfloat16"):
            self.assertEqual(backend.matmul_dtype(CFG.replace(matmul_dtype=choice)), choice)

    @parameterized.parameters((True, "bfloat16"), (False, "float32"))
    def test_a_training_step_resolves_auto_by_the_cpus_bf16_unit(self, pays, want):
        with unittest.mock.patch.object(backend, "bf16_matmuls_pay", return_value=pays):
            self.assertEqual(backend.matmul_dtype(backend.for_training(CFG)), want)
            for choice in ("float32", "bfloat16"):  # a dtype asked for by name is kept
                cfg = CFG.replace(matmul_dtype=choice)
                self.assertIs(backend.for_training(cfg), cfg)

    def test_auto_that_trains_in_float32_keeps_the_runs_config(self):
        """Where "auto" trains in float32, as the model reads it, the step is traced with the
        run's own config (no second one); where it trains in bfloat16 the step's says so."""
        with unittest.mock.patch.object(backend, "bf16_matmuls_pay", return_value=False):
            self.assertIs(backend.for_training(CFG), CFG)
        with unittest.mock.patch.object(backend, "bf16_matmuls_pay", return_value=True):
            self.assertEqual(backend.for_training(CFG).matmul_dtype, "bfloat16")

    def test_the_train_chunk_is_traced_with_the_training_resolution(self):
        """One step of make_train_chunk with "auto" equals, bit for bit, the step with this
        machine's resolution written out, and differs from the other dtype's step."""
        import optax

        from minigpt_jax.train.step import init_state, make_train_chunk

        tx, schedule = optax.adam(1e-2), optax.constant_schedule(1e-2)
        batches_CxBxT1 = _tokens_BxT1()[None]
        resolved = backend.matmul_dtype(backend.for_training(CFG))
        other = "float32" if resolved == "bfloat16" else "bfloat16"
        grad_norms = {}
        for name, cfg in (("auto", CFG), (resolved, CFG.replace(matmul_dtype=resolved)),
                          (other, CFG.replace(matmul_dtype=other))):  # fmt: skip
            state = init_state(cfg, tx, jax.random.key(0))
            _, metrics = make_train_chunk(cfg, tx, schedule, donate=False)(state, batches_CxBxT1)
            grad_norms[name] = float(metrics["grad_norm"][0])
        self.assertEqual(grad_norms["auto"], grad_norms[resolved])
        self.assertNotEqual(grad_norms[other], grad_norms[resolved])

    @parameterized.parameters("auto", "float32")
    def test_float32_is_bit_identical_to_the_dense_vjp_before_it(self, matmul_dtype):
        cfg = CFG.replace(dense_grad="direct", matmul_dtype=matmul_dtype)
        params, tokens = _params(CFG), _tokens_BxT1()
        got = _loss_and_grads(params, tokens, cfg)
        with unittest.mock.patch.object(dense, "direct_grad_dot_general", _old_direct_dot_general):
            # A jit of its own: the cache of `_loss_and_grads` would hand back `got`'s program.
            want = jax.jit(jax.value_and_grad(_mean_loss), static_argnums=2)(params, tokens, cfg)
        chex.assert_trees_all_equal(got, want)

    @parameterized.parameters("direct", "autodiff")
    def test_bf16_operands_stay_within_tolerance_of_float32(self, dense_grad):
        cfg = CFG.replace(dense_grad=dense_grad, matmul_dtype="float32")
        params, tokens = _params(CFG), _tokens_BxT1()
        loss, grads = _loss_and_grads(params, tokens, cfg)
        bf16_loss, bf16_grads = _loss_and_grads(
            params, tokens, cfg.replace(matmul_dtype="bfloat16")
        )
        self.assertNotEqual(float(bf16_loss), float(loss))  # the operands really were rounded
        np.testing.assert_allclose(bf16_loss, loss, rtol=BF16_LOSS_RTOL)
        chex.assert_trees_all_equal_dtypes(bf16_grads, params)  # float32 master weights' grads
        for got, want in zip(jax.tree.leaves(bf16_grads), jax.tree.leaves(grads), strict=True):
            scale = float(jnp.max(jnp.abs(want)))
            np.testing.assert_allclose(got, want, rtol=0, atol=BF16_GRAD_TOL * scale)
            relative = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
            self.assertLess(relative, BF16_GRAD_NORM_TOL)

    def test_bf16_dense_vjp_is_the_rounded_operands_products(self):
        """The direct VJP with bfloat16 operands (its weight gradient through a copied-out xᵀ,
        docs/speed.md) gives dx = dy·Wᵀ and dW = xᵀ·dy of the operands rounded to bfloat16,
        summed in float32: float64 NumPy of the same rounded operands agrees to float32's
        summation error."""
        kx, kw, kd = jax.random.split(jax.random.key(3), 3)
        x_MxI = jax.random.normal(kx, (96, 40))
        w_IxO = jax.random.normal(kw, (40, 24))
        dy_MxO = jax.random.normal(kd, (96, 24))

        @jax.jit
        def grads(x_MxI, w_IxO, dy_MxO):
            _, vjp = jax.vjp(lambda x, w: dense._matmul(x, w, None, jnp.bfloat16), x_MxI, w_IxO)
            return vjp(dy_MxO)

        dx_MxI, dw_IxO = grads(x_MxI, w_IxO, dy_MxO)

        def rounded(a):
            return np.asarray(a.astype(jnp.bfloat16), np.float64)

        np.testing.assert_allclose(dw_IxO, rounded(x_MxI).T @ rounded(dy_MxO), rtol=0, atol=1e-4)
        np.testing.assert_allclose(dx_MxI, rounded(dy_MxO) @ rounded(w_IxO).T, rtol=0, atol=1e-4)
        self.assertEqual((dx_MxI.dtype, dw_IxO.dtype), (jnp.float32, jnp.float32))

    def test_bf16_operands_with_bf16_activations(self):
        """With dtype="bfloat16" the operands are bf16 already: the logits stay within bf16
        activations' own tolerance of the plain bf16 model."""
        cfg = CFG.replace(dtype="bfloat16")
        params, tokens = _params(CFG), _tokens_BxT1()
        chex.assert_trees_all_close(
            forward(params, tokens, cfg.replace(matmul_dtype="bfloat16")),
            forward(params, tokens, cfg),
            atol=2e-2,
            rtol=2e-2,
        )


def _padded_twin(params, cfg: GPTConfig, multiple: int, fill: float):
    """(cfg, params) padded to `multiple`: the same rows, then rows (columns) of `fill`."""
    padded = cfg.replace(vocab_multiple=multiple)
    extra = padded.padded_vocab_size - cfg.vocab_size
    twin = jax.tree_util.tree_map(lambda x: x, params)
    table_VxD = params["embed"]["tok"]["embedding"]
    twin["embed"]["tok"]["embedding"] = jnp.pad(
        table_VxD, ((0, extra), (0, 0)), constant_values=fill
    )
    if not cfg.tie_embeddings:
        kernel_DxV = params["lm_head"]["kernel"]
        twin["lm_head"]["kernel"] = jnp.pad(kernel_DxV, ((0, 0), (0, extra)), constant_values=fill)
    return padded, twin


class VocabPaddingTest(parameterized.TestCase):
    @parameterized.parameters(True, False)
    def test_padded_model_equals_the_unpadded_one(self, tied):
        """Padded rows filled with large values change nothing: not the logits (still V wide),
        not the loss, not the gradients of the real rows; the padded rows get zero gradient."""
        cfg = CFG.replace(tie_embeddings=tied)
        padded, twin = _padded_twin(_params(cfg), cfg, 16, fill=3.0)
        self.assertEqual(padded.padded_vocab_size, 64)
        tokens = _tokens_BxT1()
        chex.assert_trees_all_close(
            forward(twin, tokens, padded), forward(_params(cfg), tokens, cfg), **TOL
        )
        (loss, grads), (want_loss, want_grads) = (
            _loss_and_grads(twin, tokens, padded),
            _loss_and_grads(_params(cfg), tokens, cfg),
        )
        np.testing.assert_allclose(loss, want_loss, **TOL)
        table_grad = grads["embed"]["tok"]["embedding"]
        np.testing.assert_allclose(
            table_grad[: cfg.vocab_size], want_grads["embed"]["tok"]["embedding"], **TOL
        )
        np.testing.assert_array_equal(table_grad[cfg.vocab_size :], 0.0)
        if not tied:
            head_grad = grads["lm_head"]["kernel"]
            np.testing.assert_allclose(
                head_grad[:, : cfg.vocab_size], want_grads["lm_head"]["kernel"], **TOL
            )
            np.testing.assert_array_equal(head_grad[:, cfg.vocab_size :], 0.0)

    def test_padded_ids_are_never_sampled(self):
        """Padded rows whose logits would win every draw, were they not cut off."""
        padded, twin = _padded_twin(_params(CFG), CFG, 16, fill=10.0)
        ids = generate(twin, padded, [[1, 2, 3], [4]], 12, rng=jax.random.key(0), temperature=2.0)
        self.assertLess(max(int(np.max(row)) for row in ids), CFG.vocab_size)


class ChunkedLossTest(parameterized.TestCase):
    @parameterized.parameters(
        (7, True, "float32"),
        (13, False, "float32"),
        (1000, True, "float32"),
        (12, True, "bfloat16"),
        (13, False, "bfloat16"),
    )
    def test_losses_and_grads_equal_the_plain_path(self, chunk, tied, dtype):
        """Chunks that divide B·T = 36 tokens, that do not, and one larger than all of them."""
        cfg = CFG.replace(tie_embeddings=tied, dtype=dtype, vocab_multiple=16)
        chunked = cfg.replace(loss_chunk=chunk)
        params, tokens = _params(cfg), _tokens_BxT1()
        tol = TOL if dtype == "float32" else dict(atol=1e-3, rtol=1e-3)
        chex.assert_trees_all_close(
            next_token_losses(params, tokens, chunked),
            next_token_losses(params, tokens, cfg),
            **tol,
        )
        chex.assert_trees_all_close(
            _loss_and_grads(params, tokens, chunked), _loss_and_grads(params, tokens, cfg), **tol
        )

    def test_train_mode_with_dropout_uses_the_same_masks(self):
        cfg = CFG.replace(dropout=0.2, attention="auto")
        params, tokens, rng = _params(CFG), _tokens_BxT1(), jax.random.key(3)
        chex.assert_trees_all_close(
            next_token_losses(params, tokens, cfg.replace(loss_chunk=8), train=True, rng=rng),
            next_token_losses(params, tokens, cfg, train=True, rng=rng),
            **TOL,
        )


class ReadOutTest(chex.TestCase):
    def test_bf16_read_out_accumulates_in_float32(self):
        """bf16 operands, float32 products summed in float32: the float32 matmul of the
        bf16-rounded operands, and float32 logits out."""
        cfg = CFG.replace(dtype="bfloat16")
        h_MxD = jax.random.normal(jax.random.key(0), (5, cfg.n_embd))
        table_VxD = 0.02 * jax.random.normal(jax.random.key(1), (cfg.vocab_size, cfg.n_embd))
        logits_MxV = read_out(h_MxD, table_VxD, cfg)
        self.assertEqual(logits_MxV.dtype, jnp.float32)
        rounded = [x.astype(jnp.bfloat16).astype(jnp.float32) for x in (h_MxD, table_VxD)]
        want = np.asarray(rounded[0], np.float64) @ np.asarray(rounded[1], np.float64).T
        np.testing.assert_allclose(logits_MxV, want, atol=1e-6, rtol=1e-5)

    def test_bf16_model_returns_float32_logits_and_loss(self):
        cfg = CFG.replace(dtype="bfloat16")
        tokens = _tokens_BxT1()
        self.assertEqual(forward(_params(cfg), tokens, cfg).dtype, jnp.float32)
        for chunk in (0, 8):
            losses = next_token_losses(_params(cfg), tokens, cfg.replace(loss_chunk=chunk))
            self.assertEqual(losses.dtype, jnp.float32)


class RematTest(parameterized.TestCase):
    @parameterized.parameters("dots", "full")
    def test_remat_equals_keeping_everything(self, remat):
        """Recomputing activations changes memory, not values or gradients (dropout included:
        the recomputed masks are the ones of the forward pass)."""
        cfg = CFG.replace(dropout=0.1)
        params, tokens, rng = _params(CFG), _tokens_BxT1(), jax.random.key(4)

        def loss(params, cfg):
            return next_token_losses(params, tokens, cfg, train=True, rng=rng).mean()

        grad_fn = jax.jit(jax.value_and_grad(loss), static_argnums=1)
        chex.assert_trees_all_close(
            grad_fn(params, cfg.replace(remat=remat)), grad_fn(params, cfg), **TOL
        )
