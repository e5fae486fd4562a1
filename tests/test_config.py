"""GPTConfig validation: every bad field names itself and what is allowed."""

import chex
from absl.testing import parameterized

from minigpt_jax import GPTConfig


class GPTConfigTest(chex.TestCase):
    def test_defaults_are_the_course_model(self):
        cfg = GPTConfig()
        self.assertEqual(
            (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.dropout),
            (512, 64, 4, 4, 128, 0.1),
        )
        self.assertEqual(
            (cfg.pos_encoding, cfg.tie_embeddings, cfg.causal), ("learned", True, True)
        )
        self.assertEqual((cfg.head_dim, cfg.mlp_dim), (32, 512))

    def test_is_hashable_for_jit(self):
        self.assertEqual(hash(GPTConfig()), hash(GPTConfig()))

    @parameterized.named_parameters(
        (
            "indivisible_heads",
            dict(n_embd=130, n_head=4),
            "n_embd=130 is not divisible by n_head=4",
        ),
        ("zero_layers", dict(n_layer=0), "n_layer must be a positive integer"),
        ("negative_vocab", dict(vocab_size=-1), "vocab_size must be a positive integer"),
        ("float_width", dict(n_embd=128.0), "n_embd must be a positive integer"),
        ("dropout_one", dict(dropout=1.0), "dropout must be in [0, 1)"),
        ("unknown_positions", dict(pos_encoding="alibi"), "allowed: ['learned', 'none', 'rope'"),
        (
            "odd_sinusoid",
            dict(n_embd=9, n_head=3, pos_encoding="sinusoidal"),
            "needs an even n_embd",
        ),
        ("odd_rope_head", dict(n_embd=12, n_head=4, pos_encoding="rope"), "needs an even head_dim"),
        ("embed_scale", dict(embed_scale=0.0), "embed_scale must be a positive number"),
        ("dtype", dict(dtype="int8"), "allowed: ['float32', 'bfloat16', 'float16']"),
    )
    def test_invalid_field_is_named(self, changes, message):
        with self.assertRaises(ValueError) as ctx:
            GPTConfig(**changes)
        self.assertIn(message, str(ctx.exception))

    def test_unknown_dense_grad_is_named(self):
        with self.assertRaisesRegex(ValueError, r"dense_grad='jvp'.*\['autodiff', 'direct'\]"):
            GPTConfig(dense_grad="jvp")
