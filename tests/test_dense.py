"""direct_grad_dot_general: lax.dot_general's values and gradients, with its own VJP."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from minigpt_jax.model.dense import direct_grad_dot_general

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


if __name__ == "__main__":
    absltest.main()
