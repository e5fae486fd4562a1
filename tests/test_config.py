"""GPTConfig and run-config validation: every bad field or key names itself and what is allowed."""

import chex
from absl.testing import parameterized

from configs import default
from minigpt_jax import GPTConfig
from minigpt_jax.config_dict import MODEL_KEYS, check_experiment_config, gpt_config_from


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

    def test_padded_vocab_size(self):
        self.assertEqual(GPTConfig(vocab_size=50_257, vocab_multiple=64).padded_vocab_size, 50_304)
        self.assertEqual(GPTConfig(vocab_size=512, vocab_multiple=64).padded_vocab_size, 512)
        self.assertEqual(GPTConfig(vocab_size=65).padded_vocab_size, 65)

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
        (
            "unknown_positions",
            dict(pos_encoding="alibi"),
            "the position encodings are learned, sinusoidal, rope, none, or name your own code",
        ),
        (
            "odd_sinusoid",
            dict(n_embd=9, n_head=3, pos_encoding="sinusoidal"),
            "needs an even n_embd",
        ),
        ("odd_rope_head", dict(n_embd=12, n_head=4, pos_encoding="rope"), "needs an even head_dim"),
        ("embed_scale", dict(embed_scale=0.0), "embed_scale must be a positive number"),
        ("dtype", dict(dtype="int8"), "the dtypes are float32, bfloat16, float16."),
        (
            "attention",
            dict(attention="flash"),
            "the attention kernels are auto, cudnn, explicit, xla, or name your own",
        ),
        (
            "fused_attention_with_dropout",
            dict(attention="xla", dropout=0.1),
            "cannot drop out attention weights (dropout=0.1): use attention='auto'",
        ),
        (
            "cudnn_in_float32",
            dict(attention="cudnn", dropout=0.0),
            "needs dtype bfloat16 or float16 and a head dim that is a multiple of 8",
        ),
        (
            "cudnn_head_dim",
            dict(attention="cudnn", dropout=0.0, dtype="bfloat16", n_embd=120, n_head=4),
            "(got dtype='bfloat16', head_dim=30)",
        ),
        ("vocab_multiple", dict(vocab_multiple=0), "vocab_multiple must be a positive integer"),
        ("loss_chunk", dict(loss_chunk=-1), "loss_chunk must be 0 (all logits at once)"),
    )
    def test_invalid_field_is_named(self, changes, message):
        with self.assertRaises(ValueError) as ctx:
            GPTConfig(**changes)
        self.assertIn(message, str(ctx.exception))

    def test_unknown_dense_grad_is_named(self):
        with self.assertRaisesRegex(ValueError, r"dense_grad='jvp'.*are auto, autodiff, direct"):
            GPTConfig(dense_grad="jvp")

    def test_unknown_matmul_dtype_is_named(self):
        with self.assertRaisesRegex(
            ValueError, r"matmul_dtype='float16'.*are auto, float32, bfloat16"
        ):
            GPTConfig(matmul_dtype="float16")


class ConfigFileTest(chex.TestCase):
    """configs/default.py's commented model group and GPTConfig's defaults describe one model."""

    def test_gpt_config_defaults_equal_the_default_config_file(self):
        config = default.get_config()
        # vocab_size is the tokenizer's, set from data.vocab_size; the rest is the model group.
        self.assertEqual(
            GPTConfig(),
            gpt_config_from(config, vocab_size=config.data.vocab_size),
        )
        self.assertEqual(set(config.model.keys()), set(MODEL_KEYS))


class RunConfigTest(chex.TestCase):
    """The experiment-config checks, all in config_dict, each naming the key and the fix."""

    def test_default_config_passes(self):
        check_experiment_config(default.get_config())

    @parameterized.named_parameters(
        ("typo", "optim.lrr", 1e-3, "unknown config key config.optim.lrr (did you mean 'lr'?)"),
        ("top_level", "num_step", 10, "unknown config key config.num_step"),
        ("not_multiple", "eval_every", 25, "config.eval_every=25 must be a positive multiple"),
        ("zero_batch", "batch_size", 0, "config.batch_size must be a positive integer"),
        ("zero_chunk", "steps_per_call", 0, "steps_per_call must be a positive integer"),
    )
    def test_bad_key_or_value_is_named(self, dotted, value, message):
        config = default.get_config()
        config.steps_per_call = 10
        config.num_steps, config.eval_every, config.checkpoint_every = 100, 50, 50
        group, _, key = dotted.rpartition(".")
        node = config[group] if group else config
        node[key] = value
        with self.assertRaises(ValueError) as ctx:
            check_experiment_config(config)
        self.assertIn(message, str(ctx.exception))

    def test_a_missing_key_takes_its_declared_default(self):
        """A config file need only state what differs from the declared defaults."""
        config = default.get_config()
        del config.optim["b2"]
        del config["loss"]
        checked = check_experiment_config(config)
        self.assertEqual(checked.optim.b2, 0.99)
        self.assertEqual(checked.loss.terms, "")

    def test_gpt_config_from_refuses_an_unknown_model_key(self):
        config = default.get_config()
        config.model.n_embed = 64
        with self.assertRaisesRegex(ValueError, r"config.model.n_embed \(did you mean 'n_embd'"):
            gpt_config_from(config, vocab_size=65)


def test_the_picked_entries_are_resolved_once_kept_and_never_pickled():
    """GPTConfig.parts holds the registries' own entries for the config's picks (gelu in the
    tanh form when gelu_approximate) and the backend's speed choices, made on first use and
    kept; a pickle leaves them out, and the copy resolves the same ones."""
    import pickle

    from minigpt_jax.model.attention_masks import ATTENTION_MASKS
    from minigpt_jax.model.blocks import BLOCKS, MLPS
    from minigpt_jax.model.layers import ACTIVATIONS, NORMS
    from minigpt_jax.model.positions import POSITION_ENCODINGS
    from minigpt_jax.model.speed.backend import for_training, speed_of

    cfg = GPTConfig(
        block="parallel",
        mlp="swiglu",
        norm="rmsnorm",
        gelu_approximate=True,
        pos_encoding="rope",
        attention_mask="document",
    )
    assert "parts" not in cfg.__dict__
    parts = cfg.parts
    assert cfg.parts is parts
    assert parts.block is BLOCKS["parallel"] and not parts.carries
    assert parts.mlp is MLPS["swiglu"] and parts.norm is NORMS["rmsnorm"]
    assert parts.activation is ACTIVATIONS["gelu_tanh"]
    assert parts.position is POSITION_ENCODINGS["rope"]
    assert parts.mask is ATTENTION_MASKS["document"] and parts.mask.documents
    assert parts.speed is speed_of(cfg)
    copy = pickle.loads(pickle.dumps(cfg))
    assert copy == cfg and "parts" not in copy.__dict__ and "_speed" not in copy.__dict__
    assert copy.parts.block is parts.block and copy.parts.activation is parts.activation
    step_cfg = for_training(GPTConfig(matmul_dtype="float32"))
    assert "parts" in step_cfg.__dict__  # made before the step is traced
