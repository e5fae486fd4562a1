"""The mini-GPT: transformer blocks (model.block, pre-LayerNorm by default) over tied token
embeddings.

Shape letters, used as array-name suffixes throughout the package (`x_BxTxD`); each means one
thing everywhere:
  B  batch                      T  sequence (queries)      T1 T + 1: inputs and next target
  S  keys / KV-cache slots      D  width (n_embd)          H  heads
  K  head width (D / H)         R  sin-cos pairs (K/2, D/2)
  F  MLP width                  V  vocabulary              N  layers (n_layer)
  C  steps per compiled call    P  prompt slots            G  new-token slots (sampling)
  L  P + G (sampling buffer)    W  recomputed window       M, I, O  rows, in and out features
  A  micro-batches per step (grad_accum_steps)             U  rows of a micro-batch (B / A)
  Y  padded vocabulary (V rounded up to vocab_multiple)    E  tokens per loss chunk
  J  loss chunks (M / E)       Z  per-token loss values (the cross-entropy, then each term)
  Q  steps of one lab run      Q1 Q + 1: before each step and after the last

References: Vaswani et al. 2017 (arXiv:1706.03762); Radford et al. 2019, GPT-2;
Press & Wolf 2017, tied input/output embeddings (arXiv:1608.05859); nanoGPT's model.py.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax.model import param_meta
from minigpt_jax.model.attention import KVCache
from minigpt_jax.model.blocks import norm
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.embeddings import Embeddings, check_token_ids, read_out
from minigpt_jax.model.layers import INIT_STDDEV
from minigpt_jax.model.leaks import naming_remat_leaks
from minigpt_jax.model.loss_terms import (
    PickedTerm,
    TermContext,
    per_token_terms,
    scalar_term_values,
    term_name,
    term_values,
)
from minigpt_jax.model.param_meta import ParamMeta, declare
from minigpt_jax.model.parametrization import scale_init
from minigpt_jax.model.step_variable import STEP_COLLECTION, STEP_LEAF

Array = chex.Array
Params = Any  # a nested dict of arrays: the 'params' collection of `GPT`


class _HeadKernel(nn.Module):
    """The untied head's kernel (D, Y), as a module so its path is `lm_head/kernel`."""

    cfg: GPTConfig

    @nn.compact
    def __call__(self) -> Array:
        cfg = self.cfg
        shape = (cfg.n_embd, cfg.padded_vocab_size)
        base = (
            nn.initializers.zeros_init()
            if cfg.zero_init_proj
            else nn.initializers.normal(INIT_STDDEV)
        )
        # tensor splits the vocabulary; AdamW's, as the speedrun keeps its head.
        init = declare(
            base,
            (None, "tensor"),
            decay=True,
            gpt2="lm_head.weight",
            gpt2_transpose=True,
            tags=("head",),
        )
        return self.param("kernel", init, shape, cfg.weight_dtype)


class GPT(nn.Module):
    """tokens_BxT -> `(logits_BxTxV, caches)`: logits in float32, and the updated per-layer KV
    caches, or None when called without caches (`forward` returns the logits alone).

    Params: `embed/tok/embedding` (Y, D), `embed/pos/embedding` (block_size, D) for learned
    positions, `block_{i}/...`, `ln_f`, and `lm_head/kernel` (D, Y) only when untied. Y is V
    padded to cfg.vocab_multiple; the padded rows and columns never reach the logits.
    """

    cfg: GPTConfig

    def setup(self):
        cfg = self.cfg
        self.embed = Embeddings(cfg)
        block = cfg.parts.block
        if cfg.remat != "none":
            # Argument 3 counts the module: (self, x, positions, deterministic).
            block = nn.remat(block, static_argnums=(3,), policy=cfg.parts.speed.remat_policy)
        self.blocks = [block(cfg, name=f"block_{i}") for i in range(cfg.n_layer)]
        self.ln_f = norm(cfg, "ln_f")
        if not cfg.tie_embeddings:
            self.lm_head = _HeadKernel(cfg)

    def hidden(
        self,
        tokens_BxT: Array,
        positions_BxT: Array | None = None,
        *,
        deterministic: bool = True,
        cache: list[KVCache] | None = None,
    ) -> tuple[Array, list[KVCache] | None]:
        """`(h_BxTxD, caches)`: the final-LayerNorm features that the head reads out. With a
        mask that packs documents (and no cache), each token's document and its position in it
        come from the end-of-text ids (`document_layout`)."""
        cfg = self.cfg
        segments = {}
        if cache is None and cfg.parts.mask.documents:
            segments_BxT, document_positions_BxT = document_layout(tokens_BxT, cfg)
            segments = {"segments_BxT": segments_BxT}
            if cfg.parts.position.per_document:
                positions_BxT = document_positions_BxT
        if cache is not None:
            chex.assert_shape(positions_BxT, tokens_BxT.shape)
            chex.assert_equal(len(cache), cfg.n_layer)
            embed_positions_BxT = jnp.maximum(positions_BxT, 0)
        else:
            embed_positions_BxT = positions_BxT
        x_BxTxD = self.embed(tokens_BxT, embed_positions_BxT, deterministic=deterministic)
        if positions_BxT is None:
            positions_BxT = jnp.arange(tokens_BxT.shape[1])[None, :]
        new_cache, carry = [], None
        for i, block in enumerate(self.blocks):
            carried = {"carry": carry} if cfg.parts.carries else {}
            with naming_remat_leaks(cfg) if cfg.remat != "none" else contextlib.nullcontext():
                x_BxTxD, layer_cache, *carry_out = block(
                    x_BxTxD,
                    positions_BxT,
                    deterministic,
                    None if cache is None else cache[i],
                    **segments,
                    **carried,
                )
            carry = carry_out[0] if cfg.parts.carries else None
            new_cache.append(layer_cache)
            # Each block's mean square output, for terms of the model's internals
            # (loss_terms.activation_l2); kept only when applied with mutable 'intermediates'.
            square_mean = jnp.mean(jnp.square(x_BxTxD), dtype=jnp.float32)
            self.sow("intermediates", "residual_sq", square_mean)
        return self.ln_f(x_BxTxD), None if cache is None else new_cache

    def __call__(
        self,
        tokens_BxT: Array,
        positions_BxT: Array | None = None,
        *,
        deterministic: bool = True,
        cache: list[KVCache] | None = None,
    ) -> tuple[Array, list[KVCache] | None]:
        """`(logits_BxTxV, caches)`; caches is None unless one KV cache per layer is given.

        With caches, positions_BxT is required and a negative position marks left padding: the
        token is embedded at position 0 and never attended to.
        """
        cfg = self.cfg
        h_BxTxD, new_cache = self.hidden(
            tokens_BxT, positions_BxT, deterministic=deterministic, cache=cache
        )
        if cfg.tie_embeddings:
            logits_BxTxY = self.embed.attend(h_BxTxD)
        else:
            logits_BxTxY = read_out(h_BxTxD, self.lm_head(), cfg)
        logits_BxTxV = logits_BxTxY[..., : cfg.vocab_size]
        chex.assert_shape(logits_BxTxV, (*tokens_BxT.shape, cfg.vocab_size))
        return logits_BxTxV, new_cache


# ----------------------------------------------------------------------------- pure functions


def init_params(cfg: GPTConfig, rng: Array) -> Params:
    """Fresh parameters for `cfg` (their shapes do not depend on the sequence length)."""
    return nn.unbox(init_annotated_params(cfg, rng))


def init_annotated_params(cfg: GPTConfig, rng: Array) -> Any:
    """`init_params`, with each parameter whose creation site declares mesh axes and metadata
    (`param_meta.declare`) boxed: what `sharding.tree_shardings` reads. Records the metadata
    for the optimizers (`param_meta.record`); a matrix declaring none raises
    `param_meta.UndeclaredParameterError` naming its path. The values follow
    cfg.parametrization's init rule (`parametrization.scale_init`)."""
    annotated = GPT(cfg).init(rng, jnp.zeros((1, 1), jnp.int32))["params"]
    param_meta.record(annotated)
    return scale_init(annotated, cfg)  # cfg.parametrization's init rule (μP's); standard: none


def declared_params(cfg: GPTConfig) -> dict[tuple[str, ...], tuple[tuple[int, ...], ParamMeta]]:
    """{parameter path: (shape, ParamMeta)} of cfg's model, from shapes alone."""
    annotated = jax.eval_shape(functools.partial(init_annotated_params, cfg), jax.random.key(0))
    metas = param_meta.metadata(annotated)
    leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(annotated))[0]
    return {
        param_meta.path_names(path): (tuple(leaf.shape), metas[param_meta.path_names(path)])
        for path, leaf in leaves
    }


def forward(
    params: Params,
    tokens_BxT: Array,
    cfg: GPTConfig,
    *,
    train: bool = False,
    rng: Array | None = None,
) -> Array:
    """logits_BxTxV (float32) for ids tokens_BxT.

    With `train=True` dropout is on and its randomness comes only from `rng`. Ids must lie in
    [0, V): under jit an out-of-range id is not an error but a garbage row, so validate
    untrusted ids with `checked_forward` or `embeddings.check_token_ids`.
    """
    logits_BxTxV, _ = GPT(cfg).apply(
        {"params": params}, tokens_BxT, deterministic=not train, rngs=_dropout_rngs(cfg, train, rng)
    )
    return logits_BxTxV


def _dropout_rngs(cfg: GPTConfig, train: bool, rng: Array | None) -> dict:
    """The `rngs` of an apply: {"dropout": rng} when training with one; refuses training with
    dropout > 0 and no rng."""
    if train and cfg.dropout > 0 and rng is None:
        raise ValueError("forward(train=True) with dropout > 0 needs an `rng` for dropout.")
    return {"dropout": rng} if train and rng is not None else {}


def document_layout(tokens_BxT: Array, cfg: GPTConfig) -> tuple[Array, Array]:
    """(segments_BxT, positions_BxT) of documents packed into rows: a token's document is the
    count of end-of-text ids before it (the tokenizer's last id, V - 1: every tokenizer puts it
    after each document, and it ends the document it closes), its position the distance from
    the first token after the previous end-of-text (or from the row's start)."""
    is_eot_BxT = tokens_BxT == cfg.vocab_size - 1
    ends_BxT = jnp.cumsum(is_eot_BxT, axis=1, dtype=jnp.int32)
    segments_BxT = ends_BxT - is_eot_BxT.astype(jnp.int32)
    t_1xT = jnp.arange(tokens_BxT.shape[1], dtype=jnp.int32)[None, :]
    # A document starts one past an end-of-text: the latest such start at or before t.
    after_eot_BxT = jnp.pad(jnp.where(is_eot_BxT, t_1xT + 1, 0)[:, :-1], ((0, 0), (1, 0)))
    starts_BxT = jax.lax.cummax(after_eot_BxT, axis=1)
    return segments_BxT, t_1xT - starts_BxT


def target_weights(tokens_BxT1: Array, cfg: GPTConfig) -> Array:
    """weights_BxT (float32) of the next-token targets tokens_BxT1[:, 1:]: 1, except 0 for a
    target across a document boundary (its input is an end-of-text) when cfg packs documents.
    Means and sums of the losses weigh each target by it."""
    inputs_BxT = tokens_BxT1[:, :-1]
    if not cfg.parts.mask.documents:
        return jnp.ones(inputs_BxT.shape, jnp.float32)
    return (inputs_BxT != cfg.vocab_size - 1).astype(jnp.float32)


def init_cache(cfg: GPTConfig, batch: int, length: int) -> list[KVCache]:
    """One empty KV cache of `length` slots per layer, for `forward_with_cache`."""
    return [KVCache.empty(cfg, batch, length) for _ in range(cfg.n_layer)]


def forward_with_cache(
    params: Params, tokens_BxT: Array, positions_BxT: Array, cache: list[KVCache], cfg: GPTConfig
) -> tuple[Array, list[KVCache]]:
    """(logits_BxTxV, cache): the tokens attend to the cache's filled slots and to each other
    (causally, by position), and their keys and values are written at the cache index.

    A negative position marks left padding, which is never attended to.
    """
    return GPT(cfg).apply({"params": params}, tokens_BxT, positions_BxT, cache=cache)


def step_variables(params: Any, step: Array | None) -> dict[str, Any]:
    """The variables to add to a model's apply for `step` over `params` (None: none): the step
    at the root and at every module path of the params tree."""
    if step is None:
        return {}

    def at_every_path(tree: Any) -> dict[str, Any]:
        children = {k: at_every_path(v) for k, v in tree.items() if isinstance(v, dict)}
        return {STEP_LEAF: step, **children}

    return {STEP_COLLECTION: at_every_path(params)}


def next_token_losses(
    params: Params,
    tokens_BxT1: Array,
    cfg: GPTConfig,
    *,
    train: bool = False,
    rng: Array | None = None,
    step: Array | None = None,
) -> Array:
    """losses_BxT (float32, nats): the cross-entropy of each next token, for inputs
    tokens_BxT1[:, :-1] and targets tokens_BxT1[:, 1:] (T1 = T + 1). `train` and `rng` as in
    `forward`; `step`, the optimizer steps taken (None outside training), is the model's "step"
    variable (`step_variable.training_step`). Training takes its mean, evaluation its sum
    (`next_token_loss_terms` adds the config's loss terms)."""
    h_BxTxD = GPT(cfg).apply(
        {"params": params, **step_variables(params, step)},
        tokens_BxT1[:, :-1],
        deterministic=not train,
        rngs=_dropout_rngs(cfg, train, rng),
        method=GPT.hidden,
    )[0]
    targets_BxT = tokens_BxT1[:, 1:]
    if 0 < cfg.loss_chunk < targets_BxT.size:  # the logits a chunk at a time, never all at once
        return chunked_cross_entropy(h_BxTxD, head_weight(params, cfg), targets_BxT, cfg)[0]
    h_ExD = h_BxTxD.reshape(targets_BxT.size, h_BxTxD.shape[-1])  # E = B·T tokens
    logits_ExV = read_out(h_ExD, head_weight(params, cfg), cfg)[:, : cfg.vocab_size]
    return cross_entropy(logits_ExV, targets_BxT.reshape(-1)).reshape(targets_BxT.shape)


def next_token_loss_terms(
    params: Params,
    tokens_BxT1: Array,
    cfg: GPTConfig,
    terms: tuple[PickedTerm, ...] = (),
    *,
    train: bool = False,
    rng: Array | None = None,
    step: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """(losses_BxT, {term name: values_BxT}): the next-token cross-entropy as in
    `next_token_losses`, and each loss term's values in `terms`' order (`loss_terms.parse_terms`;
    the weights are the caller's): a per-token term's from the same read-out of the features,
    a term of the model's internals or of the step's context (one scalar, from a
    `loss_terms.TermContext` of this batch, the forward's sown 'intermediates' and `step`, the
    optimizer steps taken: None outside training) broadcast to every token, so means and sums
    treat all alike."""
    if not terms:
        return next_token_losses(params, tokens_BxT1, cfg, train=train, rng=rng, step=step), {}
    scalar_terms = len(per_token_terms(terms)) < len(terms)
    variables = {"params": params, **step_variables(params, step)}  # read by training_step
    outputs = GPT(cfg).apply(
        variables,
        tokens_BxT1[:, :-1],
        deterministic=not train,
        rngs=_dropout_rngs(cfg, train, rng),
        method=GPT.hidden,
        mutable=["intermediates"] if scalar_terms else False,
    )
    (h_BxTxD, _), state = outputs if scalar_terms else (outputs, {})
    values_ZxBxT = chunked_cross_entropy(
        h_BxTxD, head_weight(params, cfg), tokens_BxT1[:, 1:], cfg, terms
    )
    losses_BxT = values_ZxBxT[0]
    per_token = dict(
        zip((term_name(term.key) for term in per_token_terms(terms)), values_ZxBxT[1:], strict=True)
    )
    scalars = {}
    if scalar_terms:
        ctx = TermContext(
            inputs_BxT=tokens_BxT1[:, :-1],
            targets_BxT=tokens_BxT1[:, 1:],
            weights_BxT=target_weights(tokens_BxT1, cfg),
            features_BxTxD=h_BxTxD,
            intermediates=state.get("intermediates", {}),
            params=params,
            cfg=cfg,
            step=step,
            train=train,
        )
        scalars = scalar_term_values(terms, ctx)
    values_BxT = {
        name: per_token[name]
        if name in per_token
        else jnp.broadcast_to(scalars[name], losses_BxT.shape)
        for name in (term_name(term.key) for term in terms)
    }
    return losses_BxT, values_BxT


def head_weight(params: Params, cfg: GPTConfig) -> Array:
    """The weight the head reads out through: the token table (Y, D) when tied, else the
    `lm_head` kernel (D, Y)."""
    return (
        params["embed"]["tok"]["embedding"] if cfg.tie_embeddings else params["lm_head"]["kernel"]
    )


def cross_entropy(logits_ExV: Array, targets_E: Array) -> Array:
    """losses_E: -log softmax(logits)[target] per token, as
    optax.softmax_cross_entropy_with_integer_labels computes it (logsumexp minus the target's
    logit), but with the target's logit squeezed out rather than gathered at index 0: the
    gradient of that gather is a scatter of constants, which XLA folds at compile time, for
    seconds per million tokens."""
    target_logits_E = jnp.take_along_axis(logits_ExV, targets_E[:, None], axis=-1).squeeze(-1)
    return jax.nn.logsumexp(logits_ExV, axis=-1) - target_logits_E


def chunked_cross_entropy(
    h_BxTxD: Array,
    weight: Array,
    targets_BxT: Array,
    cfg: GPTConfig,
    terms: tuple[PickedTerm, ...] = (),
) -> Array:
    """values_ZxBxT of the read-out `read_out(h, weight)`: the cross-entropy (row 0), then each
    per-token term of `terms` (Z = 1 + those terms), cfg.loss_chunk tokens at a time (0: all at
    once, one chunk).

    With several chunks, each chunk's logits (E, V) live only inside a `jax.checkpoint`ed step
    of `lax.map`: the backward pass recomputes them instead of keeping all (B·T, V) float32
    logits, which for GPT-2 (V = 50,257) at 16 × 1024 tokens are 3.3 GB; the price is the
    head's forward matmul done twice. Same math as one chunk.
    """
    batch, length, width = h_BxTxD.shape
    rows = batch * length
    chunk = min(cfg.loss_chunk or rows, rows)
    num_chunks = -(-rows // chunk)
    pad = num_chunks * chunk - rows
    h_JxExD = jnp.pad(h_BxTxD.reshape(rows, width), ((0, pad), (0, 0))).reshape(
        num_chunks, chunk, width
    )
    targets_JxE = jnp.pad(targets_BxT.reshape(rows), (0, pad)).reshape(num_chunks, chunk)

    def chunk_losses(args: tuple[Array, Array]) -> Array:
        """values_ZxE: the cross-entropy, then each per-token term."""
        h_ExD, targets_E = args
        logits_ExV = read_out(h_ExD, weight, cfg)[:, : cfg.vocab_size]
        losses_E = cross_entropy(logits_ExV, targets_E)
        if not terms:
            return losses_E[None]
        return jnp.stack([losses_E, *term_values(terms, logits_ExV, targets_E)])

    if num_chunks == 1:
        values_JxZxE = chunk_losses((h_JxExD[0], targets_JxE[0]))[None]
    else:
        values_JxZxE = jax.lax.map(jax.checkpoint(chunk_losses), (h_JxExD, targets_JxE))
    values_ZxM = values_JxZxE.swapaxes(0, 1).reshape(values_JxZxE.shape[1], -1)[:, :rows]
    return values_ZxM.reshape(-1, batch, length)


def checked_forward(params: Params, tokens_BxT: Array, cfg: GPTConfig, **kwargs) -> Array:
    """`forward` after a host-side check that every id lies in [0, V) (not jit-able)."""
    check_token_ids(tokens_BxT, cfg.vocab_size)
    return forward(params, tokens_BxT, cfg, **kwargs)


def forward_with_attention(
    params: Params, tokens_BxT: Array, cfg: GPTConfig
) -> tuple[Array, list[Array]]:
    """Deterministic forward that also returns each layer's attention weights_BxHxTxT (through
    the explicit attention path, whatever cfg.attention says)."""
    (logits_BxTxV, _), state = GPT(cfg.replace(attention="explicit")).apply(
        {"params": params}, tokens_BxT, mutable=["intermediates"]
    )
    inter = state["intermediates"]
    weights = [inter[f"block_{i}"]["attn"]["attention_weights"][0] for i in range(cfg.n_layer)]
    return logits_BxTxV, weights


def count_params(cfg: GPTConfig) -> int:
    """Number of parameters of `cfg`, from shapes alone (`jax.eval_shape`, nothing allocated),
    without the vocabulary padding, which `vocab_padding_params` counts apart."""
    shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    return sum(x.size for x in jax.tree_util.tree_leaves(shapes)) - vocab_padding_params(cfg)


def vocab_padding_params(cfg: GPTConfig) -> int:
    """Parameters in the padded rows of the token table (and columns of an untied head):
    allocated and multiplied, never used (cfg.vocab_multiple)."""
    tables = 1 if cfg.tie_embeddings else 2
    return tables * (cfg.padded_vocab_size - cfg.vocab_size) * cfg.n_embd


def flops_per_token(cfg: GPTConfig) -> int:
    """Training FLOPs per token (forward + backward), nanoGPT's / PaLM's estimate for MFU.

    6 per weight for the matmuls against the weights (the position table is a lookup, not
    counted), plus 12·N·H·K·T (N layers) for attention's scores and mixing over a full block of T
    positions. (nanoGPT writes 6·N + 12·L·H·K·T with N the weights and L the layers.) Useful
    work only: the vocabulary padding's multiplies are not counted.
    """
    n = count_params(cfg)
    if cfg.parts.position.learned:
        n -= cfg.block_size * cfg.n_embd
    return 6 * n + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.block_size
