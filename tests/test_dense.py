"""direct_grad_dot_general: lax.dot_general's values and gradients, with its own VJP; with
bfloat16 operands, the float32 sums of the rounded operands (rounded_operand_dot_general too)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from minigpt_jax.model.speed.dense import direct_grad_dot_general, rounded_operand_dot_general

# (lhs shape, rhs shape, dimension numbers): what nn.Dense (one contracted dim) and the
# attention's DenseGeneral layers ask for (qkv: D -> 3xHxK; proj: HxK -> D).
_DENSE_CASES = (
    ("dense", (2, 5, 8), (8, 12), (((2,), (0,)), ((), ()))),
    ("qkv", (2, 5, 8), (8, 3, 2, 4), (((2,), (0,)), ((), ()))),
    ("proj", (2, 5, 2, 4), (2, 4, 8), (((2, 3), (0, 1)), ((), ()))),
    # Not a Dense layout: batch dims and a leading contraction go to lax unchanged.
    ("batched", (3, 5, 4), (3, 4, 6), (((2,), (1,)), ((0,), (0,)))),
    ("leading_contraction", (4, 5), (4, 6), (((0,), (0,)), ((), ()))),
)


def _operands(lhs_shape, rhs_shape):
    rng = np.random.default_rng(0)
    return (
        jnp.asarray(rng.normal(size=lhs_shape), jnp.float32),
        jnp.asarray(rng.normal(size=rhs_shape), jnp.float32),
    )


class DirectGradDotGeneralTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*_DENSE_CASES)
    def test_values_and_grads_equal_lax(self, lhs_shape, rhs_shape, dims):
        lhs, rhs = _operands(lhs_shape, rhs_shape)
        # A fixed random cotangent, so every output element's gradient path is checked.
        out_shape = jax.eval_shape(lambda a, b: jax.lax.dot_general(a, b, dims), lhs, rhs).shape
        cotangent = jnp.asarray(np.random.default_rng(1).normal(size=out_shape), jnp.float32)

        def loss(dot_general, a, b):
            return jnp.sum(dot_general(a, b, dims) * cotangent)

        direct = self.variant(
            jax.value_and_grad(lambda a, b: loss(direct_grad_dot_general, a, b), (0, 1))
        )
        autodiff = self.variant(
            jax.value_and_grad(lambda a, b: loss(jax.lax.dot_general, a, b), (0, 1))
        )
        (value, grads), (want_value, want_grads) = direct(lhs, rhs), autodiff(lhs, rhs)
        np.testing.assert_allclose(value, want_value, rtol=1e-5)
        chex.assert_trees_all_close(grads, want_grads, rtol=1e-5, atol=1e-6)
        chex.assert_trees_all_equal_shapes(grads, (lhs, rhs))

    @chex.variants(with_jit=True, without_jit=True)
    def test_bfloat16_operands_give_bfloat16_grads_close_to_lax(self):
        lhs, rhs = (x.astype(jnp.bfloat16) for x in _operands((2, 5, 8), (8, 12)))
        dims = (((2,), (0,)), ((), ()))

        def grads(dot_general):
            def loss(a, b):
                return jnp.sum(dot_general(a, b, dims).astype(jnp.float32) ** 2)

            return jax.grad(loss, (0, 1))

        direct = self.variant(grads(direct_grad_dot_general))(lhs, rhs)
        want = self.variant(grads(jax.lax.dot_general))(lhs, rhs)
        chex.assert_trees_all_equal_dtypes(direct, (lhs, rhs))
        chex.assert_trees_all_close(
            jax.tree.map(lambda g: g.astype(jnp.float32), direct),
            jax.tree.map(lambda g: g.astype(jnp.float32), want),
            rtol=2e-2,
            atol=1e-1,
        )

    def test_dense_layout_uses_the_custom_vjp(self):
        """The Dense layout really takes the hand-written backward (a custom_vjp_call in the
        jaxpr); other layouts stay plain dot_general."""
        lhs, rhs = _operands((2, 5, 8), (8, 12))
        jaxpr = str(
            jax.make_jaxpr(lambda a, b: direct_grad_dot_general(a, b, (((2,), (0,)), ((), ()))))(
                lhs, rhs
            )
        )
        self.assertIn("custom_vjp_call", jaxpr)
        lhs, rhs = _operands((3, 5, 4), (3, 4, 6))
        batched = (((2,), (1,)), ((0,), (0,)))
        jaxpr = str(jax.make_jaxpr(lambda a, b: direct_grad_dot_general(a, b, batched))(lhs, rhs))
        self.assertNotIn("custom_vjp_call", jaxpr)


def _bf16_rounded_float64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


class RoundedOperandsTest(chex.TestCase):
    """matmul_dtype="bfloat16": operands rounded to bfloat16, products summed in float32, results
    and gradients in the operands' float32."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*_DENSE_CASES[:3])
    def test_values_and_direct_grads_are_sums_of_rounded_operands(self, lhs_shape, rhs_shape, dims):
        lhs, rhs = _operands(lhs_shape, rhs_shape)
        dot = functools.partial(direct_grad_dot_general, operand_dtype=jnp.bfloat16)
        out, vjp = self.variant(lambda a, b: jax.vjp(lambda a, b: dot(a, b, dims), a, b))(lhs, rhs)
        cotangent = jnp.asarray(np.random.default_rng(1).normal(size=out.shape), jnp.float32)
        dlhs, drhs = vjp(cotangent)
        chex.assert_trees_all_equal_dtypes((out, dlhs, drhs), (out, lhs, rhs))
        self.assertEqual(out.dtype, jnp.float32)
        # Float64 references of the rounded operands, as (M, I) x (I, O) matrices.
        n = len(dims[0][0])
        x_MxI = _bf16_rounded_float64(lhs).reshape(-1, int(np.prod(rhs_shape[:n])))
        w_IxO = _bf16_rounded_float64(rhs).reshape(x_MxI.shape[1], -1)
        dy_MxO = _bf16_rounded_float64(cotangent).reshape(x_MxI.shape[0], -1)
        tol = dict(rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out.reshape(dy_MxO.shape), x_MxI @ w_IxO, **tol)
        np.testing.assert_allclose(dlhs.reshape(x_MxI.shape), dy_MxO @ w_IxO.T, **tol)
        np.testing.assert_allclose(drhs.reshape(w_IxO.shape), x_MxI.T @ dy_MxO, **tol)
        # Not the float32 product: the rounding is real.
        self.assertGreater(float(np.max(np.abs(out - jax.lax.dot_general(lhs, rhs, dims)))), 1e-4)

    @parameterized.named_parameters(*_DENSE_CASES[:3])
    def test_autodiff_form_has_the_same_values_and_close_grads(self, lhs_shape, rhs_shape, dims):
        """rounded_operand_dot_general (for jax.grad) computes the same forward; its gradients,
        autodiff's transpose of the mixed-precision dot, within bf16 rounding of the direct ones."""
        lhs, rhs = _operands(lhs_shape, rhs_shape)
        results = []
        for dot in (direct_grad_dot_general, rounded_operand_dot_general):
            dot = functools.partial(dot, operand_dtype=jnp.bfloat16)
            out, vjp = jax.vjp(lambda a, b, dot=dot: dot(a, b, dims), lhs, rhs)
            results.append((out, *vjp(jnp.ones_like(out))))
        np.testing.assert_array_equal(results[1][0], results[0][0])
        chex.assert_trees_all_close(results[1][1:], results[0][1:], rtol=1e-2, atol=1e-2)
        chex.assert_trees_all_equal_dtypes(results[1][1:], (lhs, rhs))

    def test_other_layouts_go_to_lax_unrounded(self):
        lhs, rhs = _operands((3, 5, 4), (3, 4, 6))
        batched = (((2,), (1,)), ((0,), (0,)))
        for dot in (direct_grad_dot_general, rounded_operand_dot_general):
            got = dot(lhs, rhs, batched, operand_dtype=jnp.bfloat16)
            np.testing.assert_array_equal(got, jax.lax.dot_general(lhs, rhs, batched))


if __name__ == "__main__":
    absltest.main()
