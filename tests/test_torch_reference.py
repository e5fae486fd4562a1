"""TorchGPT, the PyTorch twin: logits, gradients and optimizer steps equal minigpt-jax's."""

import functools

import chex
import jax
import numpy as np
import optax
import pytest
from absl.testing import parameterized
from flax import traverse_util

torch = pytest.importorskip("torch")  # the `bench` extra

from benchmarks.torch_reference import (  # noqa: E402
    TorchGPT,
    jax_params_from_torch,
    load_jax_params,
    lr_at,
    make_torch_optimizer,
    torch_train_step,
)
from configs import default  # noqa: E402
from minigpt_jax import GPTConfig, count_params, forward, init_params  # noqa: E402
from minigpt_jax.optimizers import decay_mask, make_optimizer  # noqa: E402

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
# test_model.py's shapes: in one pytest run, eager JAX reuses its compiled primitives.
TOKENS = np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 9))
# The GPTConfig fields the tests vary; the others (shapes) stay CFG's.
_LAYOUT_FREE = (
    "dropout",
    "gelu_approximate",
    "causal",
    "pos_encoding",
    "tie_embeddings",
    "use_bias",
)


@functools.cache
def _full_params():
    """Random params in the widest JAX layout (learned positions, untied head, biases).

    Drawn through TorchGPT, so no XLA compile (compiles dominate the runtime);
    test_layout_round_trip_and_count pins the layout to `init_params`'s. Noise on every leaf,
    so that zero biases and unit LayerNorm scales cannot hide a mapping error.
    """
    torch.manual_seed(1)
    model = TorchGPT(CFG.replace(tie_embeddings=False))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return jax_params_from_torch(model)


def _params(cfg: GPTConfig):
    """`_full_params` pruned to cfg's layout."""
    assert cfg.replace(**{f: getattr(CFG, f) for f in _LAYOUT_FREE}) == CFG, cfg

    def keep(path):
        return not (
            (path[:2] == ("embed", "pos") and cfg.pos_encoding != "learned")
            or (path[0] == "lm_head" and cfg.tie_embeddings)
            or (path[-1] == "bias" and not cfg.use_bias)
        )

    flat = traverse_util.flatten_dict(_full_params())
    return traverse_util.unflatten_dict({k: v for k, v in flat.items() if keep(k)})


def _torch_model(cfg: GPTConfig) -> TorchGPT:
    torch.manual_seed(0)
    return load_jax_params(TorchGPT(cfg), _params(cfg))


def _jax_loss(params, cfg, tokens_BxT):
    logits_BxTxV = forward(params, tokens_BxT[:, :-1], cfg)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT[:, 1:])
    return loss.mean(), logits_BxTxV


def _torch_loss_and_grads(cfg: GPTConfig, tokens_BxT):
    model = _torch_model(cfg)
    logits_BxTxV = model(torch.from_numpy(tokens_BxT[:, :-1].copy()))
    loss = torch.nn.functional.cross_entropy(
        logits_BxTxV.reshape(-1, cfg.vocab_size), torch.from_numpy(tokens_BxT[:, 1:]).flatten()
    )
    loss.backward()
    return loss.item(), jax_params_from_torch(model, grads=True)


# Eager on purpose: its per-primitive compiles serve every config; jit would compile per config.
_jax_loss_and_grads = jax.value_and_grad(_jax_loss, has_aux=True)


_VARIANTS = (
    ("exact_gelu_tied", {}),
    ("tanh_gelu_tied", {"gelu_approximate": True}),
    ("exact_gelu_untied", {"tie_embeddings": False}),
    ("tanh_gelu_untied", {"gelu_approximate": True, "tie_embeddings": False}),
)
_MORE_VARIANTS = (
    ("sinusoidal", {"pos_encoding": "sinusoidal"}),
    ("rope", {"pos_encoding": "rope"}),
    ("no_positions", {"pos_encoding": "none"}),
    ("no_bias", {"use_bias": False}),
    ("bidirectional", {"causal": False}),
)


class ForwardTest(chex.TestCase):
    @parameterized.named_parameters(*_VARIANTS, *_MORE_VARIANTS)
    def test_logits_equal_jax_forward(self, changes):
        """TorchGPT loaded from JAX params gives minigpt_jax.forward's logits."""
        cfg = CFG.replace(**changes)
        with torch.no_grad():
            logits_torch = _torch_model(cfg)(torch.from_numpy(TOKENS[:, :-1].copy())).numpy()
        logits_jax = forward(_params(cfg), TOKENS[:, :-1], cfg)
        chex.assert_trees_all_close(logits_torch, logits_jax, rtol=1e-5, atol=1e-5)

    def test_padded_vocabulary(self):
        """V = 60 padded to 64 rows (vocab_multiple=16): CFG's params fit, both sides return the
        first 60 logits, and they agree."""
        cfg = CFG.replace(vocab_size=60, vocab_multiple=16)
        model = load_jax_params(TorchGPT(cfg), _params(CFG))
        tokens = TOKENS % cfg.vocab_size
        with torch.no_grad():
            logits_torch = model(torch.from_numpy(tokens[:, :-1].copy())).numpy()
        logits_jax = forward(_params(CFG), tokens[:, :-1], cfg)
        self.assertEqual(logits_torch.shape[-1], 60)
        chex.assert_trees_all_close(logits_torch, logits_jax, rtol=1e-5, atol=1e-5)

    def test_dropout_only_in_train_mode(self):
        """eval() ignores dropout (equals the dropout-free JAX forward); train() drops."""
        model = _torch_model(CFG.replace(dropout=0.5)).eval()
        x_BxT = torch.from_numpy(TOKENS[:, :-1].copy())
        want = forward(_params(CFG), TOKENS[:, :-1], CFG)
        with torch.no_grad():
            chex.assert_trees_all_close(model(x_BxT).numpy(), want, rtol=1e-5, atol=1e-5)
            self.assertGreater(np.abs(model.train()(x_BxT).numpy() - want).max(), 1e-2)

    @parameterized.named_parameters(*_VARIANTS)
    def test_layout_round_trip_and_count(self, changes):
        """The JAX layout is init_params'; load then export is the identity; same param count."""
        cfg = CFG.replace(**changes)
        model = _torch_model(cfg)
        chex.assert_trees_all_equal_shapes_and_dtypes(
            _params(cfg), jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
        )
        chex.assert_trees_all_close(jax_params_from_torch(model), _params(cfg), rtol=0, atol=0)
        self.assertEqual(sum(p.numel() for p in model.parameters()), count_params(cfg))

    def test_mismatched_config_is_refused(self):
        with self.assertRaisesRegex(ValueError, "unexpected.*lm_head"):
            load_jax_params(TorchGPT(CFG), _params(CFG.replace(tie_embeddings=False)))
        with self.assertRaisesRegex(ValueError, "float32"):
            TorchGPT(CFG.replace(dtype="bfloat16"))

    def test_registry_choices_it_lacks_are_refused(self):
        """A new entry of minigpt-jax is refused by the twin, never trained as the default."""
        with self.assertRaisesRegex(ValueError, r"norm='rmsnorm' \(the twin has layernorm\)"):
            TorchGPT(CFG.replace(norm="rmsnorm"))
        optim = default.get_config().optim
        optim.name = "optax:lion"
        with self.assertRaisesRegex(ValueError, r"name='optax:lion' \(the twin has adamw\)"):
            make_torch_optimizer(TorchGPT(CFG), optim, 10)


class GradientTest(chex.TestCase):
    @parameterized.named_parameters(*_VARIANTS)
    def test_grads_equal_jax_grad(self, changes):
        """d(mean cross-entropy)/d(params) from torch equals jax.grad, leaf by leaf."""
        cfg = CFG.replace(**changes)
        loss_torch, grads_torch = _torch_loss_and_grads(cfg, TOKENS)
        (loss_jax, _), grads_jax = _jax_loss_and_grads(_params(cfg), cfg, TOKENS)
        self.assertAlmostEqual(loss_torch, float(loss_jax), places=5)
        chex.assert_trees_all_close(
            grads_torch["embed"]["tok"]["embedding"],
            grads_jax["embed"]["tok"]["embedding"],
            rtol=1e-4,
            atol=1e-7,
        )
        chex.assert_trees_all_close(grads_torch, grads_jax, rtol=1e-4, atol=1e-7)


def _optim(**changes):
    """The project's default AdamW hyperparameters (configs/default.py), with changes."""
    optim = default.get_config().optim
    optim.update(changes)
    return optim


class OptimizerTest(chex.TestCase):
    @parameterized.named_parameters(("warmup", 3, 10), ("no_warmup", 0, 10), ("short", 3, 2))
    def test_lr_at_equals_make_optimizer_schedule(self, warmup, num_steps):
        _, schedule = make_optimizer(_optim(warmup_steps=warmup), num_steps)
        for step in range(13):
            want = float(schedule(step))
            self.assertAlmostEqual(lr_at(step, 1e-3, warmup, num_steps, 1e-4), want, places=9)

    def test_decay_split_is_train_decay_mask(self):
        """Decayed: the ≥2-D torch params, i.e. the leaves train.decay_mask marks."""
        cfg = CFG.replace(tie_embeddings=False)
        optimizer, _ = make_torch_optimizer(_torch_model(cfg), _optim(), num_steps=2)
        decayed, not_decayed = (group["params"] for group in optimizer.param_groups)
        mask = jax.tree_util.tree_leaves(decay_mask(_params(cfg)))
        self.assertEqual((len(decayed), len(not_decayed)), (sum(mask), len(mask) - sum(mask)))

    def test_train_steps_equal_make_optimizer(self):
        """Clip + AdamW + schedule (tied head): 4 torch steps equal train.make_optimizer's."""
        # A large decay, so that a wrong decay split moves params far beyond the tolerance; a
        # clip below the grad norm, so that clipping is exercised.
        optim = _optim(lr=1e-2, warmup_steps=2, min_lr=1e-3, weight_decay=1.0, grad_clip=0.5)
        tx, _ = make_optimizer(optim, num_steps=4)
        model = _torch_model(CFG).train()
        optimizer, scheduler = make_torch_optimizer(model, optim, num_steps=4)
        x_BxT, y_BxT = (torch.from_numpy(t.copy()) for t in (TOKENS[:, :-1], TOKENS[:, 1:]))

        @jax.jit
        def update(grads, opt_state, params):
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, optax.tree.norm(grads)

        params = _params(CFG)
        opt_state = tx.init(params)
        for _ in range(4):
            loss_torch = torch_train_step(
                model, optimizer, x_BxT, y_BxT, scheduler=scheduler, grad_clip=optim.grad_clip
            )
            (loss_jax, _), grads = _jax_loss_and_grads(params, CFG, TOKENS)
            params, opt_state, grad_norm = update(grads, opt_state, params)
            self.assertGreater(float(grad_norm), optim.grad_clip)
            self.assertAlmostEqual(loss_torch, float(loss_jax), places=4)
        # Adam divides by sqrt(v): where v is tiny, float32 noise moves an update by ~1e-5.
        chex.assert_trees_all_close(jax_params_from_torch(model), params, rtol=1e-4, atol=5e-5)


def test_the_twins_gaps_name_each_choice_it_lacks():
    """benchmarks/step_account.py leaves the torch column out, with a reason, for a config the
    twin does not mirror (the speedrun's RMSNorm, ReLU², RoPE and Muon), and keeps it for one it
    mirrors (shakespeare_char)."""
    from benchmarks.torch_reference import twin_gaps
    from minigpt_jax.config_dict import (
        check_experiment_config,
        config_file_of,
        gpt_config_from,
        load_config_file,
    )

    def gaps(name):
        config = check_experiment_config(load_config_file(config_file_of(name)))
        return twin_gaps(gpt_config_from(config, 65), config.optim)

    assert gaps("shakespeare_char") == []
    speedrun = " ".join(gaps("speedrun_char"))
    for phrase in ("norm='rmsnorm'", "activation='relu2'", "name='muon'"):
        assert phrase in speedrun, speedrun
