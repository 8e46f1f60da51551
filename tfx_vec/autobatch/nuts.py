"""Recursive No-U-Turn Sampler, batched by ``tfx_vec.autobatch``, as a TFP ``TransitionKernel``.

The tree building is the textbook recursive ``build_tree`` of Hoffman & Gelman (2014), with
multinomial sampling inside a trajectory, biased progressive sampling between doublings and the
generalized U-turn criterion checked across merged subtrees, as in Stan (Betancourt 2017).  It is
written for **one chain** in plain Python (``if``, ``while``, recursion) and batched over chains
by ``tfx_vec.autobatch``; nothing of the recursion is unrolled by hand.

Pipeline of this module, top to bottom:

1. ``NoUTurnSampler.one_step`` reads the batch shape from the target's output (as TFP does),
   flattens the batch dimensions into one chain dimension and the state parts into one
   ``[chains, D]`` vector (the target sees the parts again through :class:`_StateSpec`),
   builds per-chain step sizes ``[chains, D]`` and per-chain stateless seeds ``[chains, 2]``;
   the results go back to the batch shape.
2. ``_make_program`` (cached per state structure) defines the single-chain program
   ``run_trajectories -> build_tree`` and hands each function to ``wrap``: ``ab.function``
   for the batched runtimes, the identity for the per-chain reference (``runtime="python"``,
   which runs the very same Python one chain at a time).  ``run_trajectories`` is one loop
   over doublings: a chain whose trajectory stops starts the next one from its sample in the
   same loop iteration, so chains at different trajectories share every block.
3. Straight-line pieces (leapfrog leaf, subtree merge, trajectory extension and start,
   randomness) are ordinary TF functions that the autobatch compiler treats as primitives.
4. Randomness is a counter-based hash (murmur3 finalizer) of each chain's seed, so chain ``b``
   depends only on the step seed and ``b``: the same chain gives the same draws in any batch,
   under any runtime.

Example:
    >>> import tensorflow as tf, tensorflow_probability as tfp
    >>> from tfx_vec.autobatch.nuts import NoUTurnSampler
    >>> kernel = NoUTurnSampler(lambda x: -0.5 * tf.reduce_sum(x * x, -1), step_size=0.5,
    ...                         runtime="python")
    >>> x0 = tf.zeros([2, 3])
    >>> draws = tfp.mcmc.sample_chain(3, x0, kernel=kernel, trace_fn=None, seed=(1, 2))
    >>> draws.shape
    TensorShape([3, 2, 3])
"""
from __future__ import annotations

import collections
import functools
import math
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow_probability.python.internal import samplers
from tensorflow_probability.python.mcmc.internal import util as mcmc_util

from .gathered import on_active_members

__all__ = ["NoUTurnSampler", "NUTSKernelResults", "RUNTIMES", "windowed_adaptive_nuts"]

RUNTIMES = ("program_counter", "local_static", "hybrid", "python")

NUTSKernelResults = collections.namedtuple(
    "NUTSKernelResults",
    ["target_log_prob", "grads_target_log_prob", "step_size", "log_accept_ratio",
     "leapfrogs_taken", "is_accepted", "reach_max_depth", "has_divergence", "energy", "seed",
     "total_leapfrogs_taken", "leapfrogs_computed", "machine", "ahead_target",
     "ahead_restart"])
NUTSKernelResults.__doc__ = """Kernel results of :class:`NoUTurnSampler`, in the batch shape.

The fields of ``tfp.mcmc.NoUTurnSampler``'s results, with its meaning: ``target_log_prob``,
``grads_target_log_prob``, ``step_size``, ``log_accept_ratio``, ``is_accepted``,
``reach_max_depth``, ``has_divergence``, ``energy`` (log-density minus kinetic energy at the
sample), ``seed`` (the seed this step used) and ``leapfrogs_taken`` (this step's leapfrog
steps, i.e. gradient evaluations, of this chain).  Ours:
``total_leapfrogs_taken``: ``leapfrogs_taken`` summed since ``bootstrap_results``.
``leapfrogs_computed``: cumulative leapfrogs the lock-step batch needs when it synchronizes on
trajectory boundaries (the sum of per-step maxima over chains, as TFP's autobatched NUTS
reports it).
``machine``, ``ahead_target``, ``ahead_restart`` (with ``run_ahead=True``; empty otherwise): the
paused program-counter machine, the trajectory count of the last returned state, and where
chains that ran to their cap restart from.
"""

# {{{ pieces used many times per block: one function call each in a graph


def _traced_once(fn: Callable) -> Callable:
    """``fn`` (tensors in, tensors out) as one call of a ``tf.function`` when a graph is being
    built: traced once per input signature, then each use is one call operation instead of
    ``fn``'s dozens (building a graph operation costs 0.2-0.5 ms in Python; a block of small
    subtrees makes a hash, a merge and its U-turn checks several times).  XLA inlines the
    calls, so the compiled program is the same; eagerly ``fn`` runs as it is.  Made at module
    level, ``fn`` must capture nothing (its traces serve every graph); made while a graph is
    traced, it may capture that graph's tensors."""
    traced = tf.function(fn, autograph=False)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        return fn(*args) if tf.executing_eagerly() else traced(*args)
    return call


def _computed_once(x: tf.Tensor) -> tf.Tensor:
    """``x`` (bool, integer or float), computed once into a buffer of its own by XLA.

    XLA fuses cheap elementwise work into each consumer and recomputes it there per element:
    a per-chain ``[B]`` predicate (dozens of operations: U-turn checks, log-weights) selecting
    between ``[B, D]`` values was recomputed for each of the D columns, and again in every
    select using it; a seed's chain of hashes, in every consumer of every seed derived from
    it.  XLA:CPU drops optimization barriers before fusing, but never fuses an *expensive*
    producer into a consumer that reads each element several times, nor duplicates one: a
    square root (exact on 0 and 1) ends a predicate, an integer division by a one XLA cannot
    see is one (``(x | 1) / (x | 1)``) ends an integer, and a float goes through it as the
    integer of its bits.  A few operations per element in a graph; eagerly ``x`` itself."""
    if tf.executing_eagerly():
        return x
    if x.dtype == tf.bool:
        return tf.sqrt(tf.cast(x, tf.float32)) > 0.5
    if x.dtype.is_floating:
        bits = tf.as_dtype(f"int{8 * x.dtype.size}")  # the integer of the same width
        return tf.bitcast(_computed_once(tf.bitcast(x, bits)), x.dtype)
    odd = tf.bitwise.bitwise_or(x, tf.ones([], x.dtype))
    return tf.truncatediv(x, tf.truncatediv(odd, odd))

# }}}

# {{{ counter-based randomness (per-chain, stateless, elementwise: batches and compiles)

_SPLIT_DOMAIN = 0          # counters 2i, 2i+1 give child seed i
_UNIFORM_DOMAIN = 1 << 31  # counters with the top bit set give uniforms/normals


def _fmix32(x: tf.Tensor, c: dict) -> tf.Tensor:
    """MurmurHash3's 32-bit finalizer: a bijection on uint32 with full avalanche (``c``: the
    constants of :func:`_hash_constants`)."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, c[16]))
    x = x * c[0x85EBCA6B]
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, c[13]))
    x = x * c[0xC2B2AE35]
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, c[16]))


def _hash_constants() -> dict:
    """The hash's uint32 constants, made once per hash: a graph traces the hash once, as a
    function of its own (a constant per use was a third of its operations)."""
    return {v: tf.constant(v, tf.uint32) for v in (16, 13, 0x85EBCA6B, 0xC2B2AE35, 0x9E3779B9,
                                                   0x7F4A7C15)}


@_traced_once
def _hash(seed: tf.Tensor, counter: tf.Tensor) -> tf.Tensor:
    """uint32 hash of an int32 seed ``[..., 2]`` (broadcast against) a uint32 ``counter``."""
    c = _hash_constants()
    k0, k1 = tf.unstack(tf.bitcast(seed, tf.uint32), axis=-1)
    while counter.shape.rank > k0.shape.rank:
        k0, k1 = tf.expand_dims(k0, -1), tf.expand_dims(k1, -1)
    x = _fmix32(tf.bitwise.bitwise_xor(counter * c[0x9E3779B9], k0), c)
    x = _fmix32(x + k1, c)
    return _fmix32(tf.bitwise.bitwise_xor(x, k0 + c[0x7F4A7C15]), c)


def _split(seed: tf.Tensor, n: int) -> list[tf.Tensor]:
    """``n`` independent int32 seeds ``[..., 2]`` from one (one vectorized hash)."""
    counters = np.arange(_SPLIT_DOMAIN, _SPLIT_DOMAIN + 2 * n).reshape(
        (1,) * (seed.shape.rank - 1) + (2 * n,))
    bits = _hash(seed, tf.constant(counters, tf.uint32))   # [..., 2n]
    return tf.split(_computed_once(tf.bitcast(bits, tf.int32)), n, axis=-1)


def _uniforms(seed: tf.Tensor, counter: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    """Uniforms in the open interval (0, 1), 24 random bits each (``counter``: a uint32 array,
    broadcast against the seeds' batch shape)."""
    domain = np.asarray(counter, np.uint32) + np.uint32(_UNIFORM_DOMAIN)
    bits = tf.bitwise.right_shift(_hash(seed, tf.constant(domain)), tf.constant(8, tf.uint32))
    return (tf.cast(bits, dtype) + 0.5) * (2.0 ** -24)


def _uniform(seed: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """One uniform per chain: seed ``[B, 2]`` -> ``[B]``."""
    return _uniforms(seed, np.uint32(0), dtype)


def _normal(seed: tf.Tensor, dim: int, dtype: tf.DType) -> tf.Tensor:
    """``dim`` standard normals per chain (Box-Muller): seed ``[B, 2]`` -> ``[B, dim]``."""
    idx = np.arange(1, dim + 1, dtype=np.uint32)[None, :]  # [1, dim] against seeds [B]
    # one hash for both halves: the bits are elementwise in the counter, the same as two
    u1, u2 = tf.split(_uniforms(seed, np.concatenate([2 * idx, 2 * idx + 1], axis=-1), dtype),
                      2, axis=-1)
    return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos((2.0 * math.pi) * u2)


def chain_seeds(seed: Any, num_chains: int) -> tf.Tensor:
    """Per-chain int32 seeds ``[num_chains, 2]``; chain ``b`` depends only on ``seed`` and ``b``.

    Example:
        >>> chain_seeds((1, 2), 3).shape
        TensorShape([3, 2])
    """
    seed = tf.convert_to_tensor(samplers.sanitize_seed(seed), tf.int32)
    b = tf.cast(tf.range(num_chains), tf.uint32)
    pair = [_hash(seed, 2 * b + j) for j in (0, 1)]
    return tf.bitcast(tf.stack(pair, axis=-1), tf.int32)

# }}}

# {{{ flat state: the program sees one [B, D] vector, the user's target sees its parts

_NONE_GRADIENT = ("Encountered `None` gradient.\n  fn_arg_list: {}\n  grads: {}")  # TFP's text


class _StateSpec:
    """Batch and event shapes and dtype of the state parts; flattens and restores them.

    A part has shape ``batch_shape + event_shape`` where ``batch_shape`` (the chains, of any
    rank, read from the target's output) is common to all parts.  The program sees one
    ``[chains, D]`` vector (batch dimensions flattened into one, event dimensions into ``D``);
    the target sees the parts with one flat chain dimension, ``[chains, *event_shape]``.
    """

    def __init__(self, parts: Sequence[tf.Tensor], batch_ndims: int):
        self.dtype = self.check_dtype(parts)
        for p in parts:
            if p.shape.rank is None:
                raise ValueError("NoUTurnSampler: a state part has unknown rank; give each part "
                                 "a known rank (e.g. tf.ensure_shape or an input_signature "
                                 "with [None, ...] dimensions)")
            if p.shape.rank < batch_ndims or not p.shape[batch_ndims:].is_fully_defined():
                raise ValueError(
                    f"NoUTurnSampler: each state part needs the {batch_ndims} batch dimensions "
                    "of the target's output followed by a static event shape, got shape "
                    f"{p.shape}")
        self.batch_ndims = batch_ndims
        static_batch = parts[0].shape[:batch_ndims]
        for p in parts[1:]:
            static_batch = static_batch.merge_with(p.shape[:batch_ndims])
        self.batch_shape = (static_batch.as_list() if static_batch.is_fully_defined()
                            else tf.shape(parts[0])[:batch_ndims])
        self.chains = (int(np.prod(self.batch_shape, dtype=np.int64))
                       if static_batch.is_fully_defined()
                       else tf.reduce_prod(tf.shape(parts[0])[:batch_ndims]))
        self.event_shapes = tuple(tuple(p.shape[batch_ndims:].as_list()) for p in parts)
        self.sizes = tuple(int(np.prod(s, dtype=np.int64)) for s in self.event_shapes)
        self.dim = sum(self.sizes)

    @staticmethod
    def check_dtype(parts: Sequence[tf.Tensor]) -> tf.DType:
        """The one floating dtype of all state parts."""
        dtypes = {p.dtype for p in parts}
        if len(dtypes) != 1:
            raise TypeError("NoUTurnSampler: all state parts must share one float dtype, got "
                            f"{sorted(d.name for d in dtypes)}")
        dtype = parts[0].dtype
        if not dtype.is_floating:
            raise TypeError(f"NoUTurnSampler: the state must be floating point, got {dtype.name}")
        return dtype

    @property
    def key(self) -> tuple:
        return (self.dtype.name, self.event_shapes)

    def flatten(self, parts: Sequence[tf.Tensor], chains: Any = None) -> tf.Tensor:
        """Parts of ``chains`` flat chains (default: the batch), any batch shape -> ``[B, D]``."""
        chains = self.chains if chains is None else chains
        flat = [tf.reshape(p, [chains, n]) for p, n in zip(parts, self.sizes)]
        return tf.concat(flat, axis=-1) if len(flat) > 1 else flat[0]

    def split(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """``[B, D]`` -> parts ``[B, *event_shape]`` (what the target sees)."""
        chains = _leading(flat)
        pieces = tf.split(flat, self.sizes, axis=-1) if len(self.sizes) > 1 else [flat]
        return [tf.reshape(x, [chains, *s]) for x, s in zip(pieces, self.event_shapes)]

    def unflatten(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """``[chains, D]`` -> parts ``batch_shape + event_shape`` (what the user sees)."""
        pieces = tf.split(flat, self.sizes, axis=-1) if len(self.sizes) > 1 else [flat]
        return [tf.reshape(x, self._batched(s)) for x, s in zip(pieces, self.event_shapes)]

    def unflatten_batch(self, values: tf.Tensor) -> tf.Tensor:
        """Per-chain values ``[chains, *tail]`` (static tail) -> ``batch_shape + tail``."""
        return tf.reshape(values, self._batched(values.shape[1:].as_list()))

    def _batched(self, tail: Sequence[int]) -> Any:
        """The shape ``batch_shape + tail``: a list if static, else a tensor."""
        if isinstance(self.batch_shape, list):
            return [*self.batch_shape, *tail]
        return tf.concat([self.batch_shape, tf.constant(list(tail), tf.int32)], 0)

    def value_and_grad(self, target_log_prob_fn: Callable, flat: tf.Tensor):
        """Target log-density ``[B]`` and its gradient ``[B, D]`` at a flat state."""
        parts = self.split(flat)
        with tf.GradientTape() as tape:
            tape.watch(parts)
            logp = target_log_prob_fn(*parts)
        grads = tape.gradient(logp, parts)
        if any(g is None for g in grads):
            raise ValueError(_NONE_GRADIENT.format(parts, grads))
        chains = _leading(flat)
        if logp.shape.num_elements() is not None and flat.shape[0] is not None and \
                logp.shape.num_elements() != flat.shape[0]:
            raise ValueError("NoUTurnSampler: target_log_prob_fn must return one value per "
                             f"chain; given {flat.shape[0]} chains it returned shape "
                             f"{logp.shape}")
        # a target that squeezes its output (one chain: a scalar) still gives [B]
        return tf.reshape(tf.cast(logp, self.dtype), [chains]), self.flatten(grads, chains)


def _leading(x: tf.Tensor) -> Any:
    """The leading dimension of ``x``: an int if static, else a scalar tensor."""
    n = tf.compat.dimension_value(x.shape[0])
    return n if n is not None else tf.shape(x)[0]


# Subtrees of SUBTREE_DEPTH are built in one block where the gradient costs under
# SUBTREE_GRADIENT_FLOPS_PER_DIM: up to 2**depth leapfrogs a chain may not take (about five a
# trajectory, more where subtrees stop early) against the recursion's loop steps for the
# bottom of every subtree.  Measured at depth 0 / 1 / 2 / 3: eight schools and a 10-d Gaussian
# (18-33 operations per dimension, 1000 chains) 1.3-1.5x and 1.8-2.1x faster with 1 or 2, 3
# slower than 2 (its eleven merges' U-turn checks); the 100-d dense Gaussian (410 per
# dimension) 1.09x with 1, 1.19x with 2; the 500-d one (2000) the same with 2; the logistic
# regression (4400, short trajectories) 0.8x with 2.
SUBTREE_DEPTH = 2
SUBTREE_GRADIENT_FLOPS_PER_DIM = 1000

# An unrolled subtree is computed only for the chains at it (gathered in this many chunks,
# from this many chains on, where the gradient costs under this many operations per chain and
# dimension): in a loop step of the batched machine a third of the chains are at a leaf, and
# the block's 2**SUBTREE_DEPTH leapfrogs made most of its cost.  Measured in sample_chain
# under XLA, against computing every chain: eight schools (33 operations) 1.22-1.27x faster
# at 1000 chains, 1.10x at 256, 1.02x at 100 (launch-bound); the 10-d Gaussian (18)
# 1.12-1.23x at 1000, 1.04x at 256; dense Gaussians at 1000 chains: 25-d (110) 1.05x, 50-d
# (210) 0.88x, 100-d (410) 0.92x and its first call a second longer (the subtree traced once
# more).  Where the gradient is expensive (no unrolled subtree) the leaves are not gathered:
# the logistic regression at 256 chains was 7% slower (smaller matrix products).
GATHERED_SUBTREE_CHUNKS = 4
GATHERED_SUBTREE_MIN_CHAINS = 256
GATHERED_SUBTREE_GRADIENT_FLOPS_PER_DIM = 150

_MATMULS = {"MatMul": "transpose_a", "BatchMatMul": "adj_x", "BatchMatMulV2": "adj_x",
            "BatchMatMulV3": "adj_x"}
# ops whose cost is not their inputs' or outputs' size and that _op_flops does not count
_UNCOUNTED = ("Conv", "Matrix", "Cholesky", "Svd", "Qr", "Eig", "Lu", "FFT", "IFFT", "RFFT")


def _op_flops(op: tf.Operation) -> int | None:
    """``2 m n k`` for a matrix product or an einsum (twice the product of its index sizes),
    the largest input or output for other ops (elementwise ops, reductions); ``None`` where
    unknown: an unknown shape, a function (a loop, a call) or an op of ``_UNCOUNTED``."""
    if any(a in op.node_def.attr for a in ("body", "then_branch", "branches", "f")) or \
            op.type.startswith(_UNCOUNTED):
        return None
    shapes = [t.shape for t in (*op.inputs, *op.outputs)]
    if any(s.num_elements() is None for s in shapes):
        return None
    if op.type in _MATMULS:
        a = op.inputs[0].shape
        return 2 * op.outputs[0].shape.num_elements() * (
            a[-2] if op.get_attr(_MATMULS[op.type]) else a[-1])
    if op.type == "Einsum":
        terms = op.get_attr("equation").decode().split("->")[0].split(",")
        if "." in "".join(terms):
            return None
        sizes = {c: d for term, x in zip(terms, op.inputs) for c, d in zip(term, x.shape)}
        return 2 * int(np.prod(list(sizes.values()), dtype=np.int64))
    return max((s.num_elements() for s in shapes), default=0)


def _graph_flops(graph: tf.Graph) -> int | None:
    """A rough operation count of ``graph`` (see :func:`_op_flops`), ``None`` if unknown."""
    total = 0
    for op in graph.get_operations():
        flops = _op_flops(op)
        if flops is None:
            return None
        total += flops
    return total


def _gradient_cost(vg: Callable, chains: Any, dim: int, dtype: tf.DType) -> float:
    """Operations of one value-and-gradient (traced, not run) per chain and dimension;
    unknown costs (a dynamic batch, loops in the target) are infinite."""
    if not isinstance(chains, int):
        return math.inf
    graph = tf.function(vg, autograph=False).get_concrete_function(
        tf.TensorSpec([chains, dim], dtype)).graph
    flops = _graph_flops(graph)
    return math.inf if flops is None else flops / (chains * dim)

# }}}

# {{{ straight-line pieces (primitives of the batched program)


def _dot(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Row-wise dot product ``[B, D] x [B, D] -> [B]``, as a product with a vector of ones:
    XLA:CPU splits a row ``reduce_sum`` into a materialized product and a windowed reduction
    (~50 us at [1000, 100]); as a matrix-vector product the multiply fuses into the dot's
    operand (~7 us).  The U-turn checks take six of these per tree node."""
    return tf.linalg.matvec(a * b, tf.ones(a.shape[-1:], a.dtype))


def _no_u_turn(p_a: tf.Tensor, p_b: tf.Tensor, rho: tf.Tensor) -> tf.Tensor:
    """Stan's generalized criterion with an identity metric: both ends move along ``rho``."""
    return (_dot(p_a, rho) > 0) & (_dot(p_b, rho) > 0)


@_traced_once
def _merged_no_u_turn(p_first_far, p_first_near, rho_first, p_second_near, p_second_far,
                      rho_second):
    """The three checks of Stan's ``build_tree`` when trajectory ``first`` is extended by
    ``second`` (ends named relative to the seam between them): the merged tree, and each
    subtree extended by the neighbouring state of the other."""
    return (_no_u_turn(p_first_far, p_second_far, rho_first + rho_second)
            & _no_u_turn(p_first_far, p_second_near, rho_first + p_second_near)
            & _no_u_turn(p_first_near, p_second_far, rho_second + p_first_near))


def _logaddexp(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """log(exp(a) + exp(b)), -inf when both are -inf."""
    m = tf.maximum(a, b)
    m = tf.where(tf.math.is_finite(m), m, tf.zeros_like(m))
    return m + tf.math.log(tf.exp(a - m) + tf.exp(b - m))


def _where(pred: tf.Tensor, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Per-chain select: ``pred [B]`` against values ``[B, ...]`` (a predicate made in the
    same block goes through :func:`_computed_once` first, once)."""
    while pred.shape.rank < a.shape.rank:
        pred = pred[..., None]
    return tf.where(pred, a, b)


@_traced_once
def _where_each(pred: tf.Tensor, a: tuple, b: tuple) -> tuple:
    """:func:`_where` of each pair of ``a`` and ``b``, ``pred`` computed once."""
    pred = _computed_once(pred)
    return tuple(_where(pred, x, y) for x, y in zip(a, b))


def _leaf(vg: Callable, unrolled: int, max_energy_diff: float,
          direction, q, p, g, logp, eps, h0):
    """Base case of ``build_tree``: ``unrolled`` leapfrog steps, weight, divergence check."""
    step = (direction * eps)[:, None] if eps.shape.rank == 1 else direction[:, None] * eps
    for _ in range(unrolled):
        p = p + 0.5 * step * g
        q = q + step * p
        logp, g = vg(q)
        p = p + 0.5 * step * g
    energy = -logp + 0.5 * _dot(p, p)
    energy = tf.where(tf.math.is_nan(energy), tf.constant(np.inf, energy.dtype), energy)
    log_w = h0 - energy
    divergent = (energy - h0) > max_energy_diff
    metro = tf.exp(tf.minimum(log_w, 0.0))
    leaves = tf.ones_like(logp, tf.int32)
    return (q, p, g, logp, q, g, logp, energy, p, p, log_w, metro, leaves, ~divergent,
            divergent)


@_traced_once
def _merge_subtrees(seed, qp1, gp1, lp1, ep1, p_beg1, p_end1, rho1, lsw1, metro1, leaves1, div1,
                    q2, p2, g2, l2, qp2, gp2, lp2, ep2, p_beg2, rho2, lsw2, metro2, leaves2, valid2,
                    div2):
    """Recursive case of ``build_tree`` after both halves: the merged subtree's values, from
    what the first half leaves after the second is built and the second half's whole result.
    The far end is the second half's; the proposal is the far half's with probability
    w2 / (w1 + w2); the U-turn checks run across the halves."""
    lsw = _logaddexp(lsw1, lsw2)
    take2 = _computed_once(tf.math.log(_uniform(seed, lsw.dtype)) < lsw2 - lsw)
    qp, gp, lp, ep = (_where(take2, a, b)
                      for a, b in ((qp2, qp1), (gp2, gp1), (lp2, lp1), (ep2, ep1)))
    valid = valid2 & _merged_no_u_turn(p_beg1, p_end1, rho1, p_beg2, p2, rho2)
    return (q2, p2, g2, l2, qp, gp, lp, ep, p_beg1, rho1 + rho2, lsw, metro1 + metro2,
            leaves1 + leaves2, valid, div1 | div2)


def _subtree_of_leaves(seed, leaves: list) -> tuple:
    """``build_tree`` over consecutive leaves already computed (each :func:`_leaf`'s tuple,
    the next starting where the previous ended), as straight-line code: where the recursion
    returns the first half alone (it is not valid), the merge of both halves is computed and
    dropped by a select.  Same seeds, same operations, so the same values bit for bit."""
    if len(leaves) == 1:
        return leaves[0]
    half = len(leaves) // 2
    seed_first, seed_second, seed_pick = _split(seed, 3)
    first = _subtree_of_leaves(seed_first, leaves[:half])
    second = _subtree_of_leaves(seed_second, leaves[half:])
    (_, p1, _, _, qp1, gp1, lp1, ep1, p_beg1, rho1, lsw1, metro1, leaves1, valid1, div1) = first
    merged = _merge_subtrees(seed_pick, qp1, gp1, lp1, ep1, p_beg1, p1, rho1, lsw1, metro1,
                             leaves1, div1, *second)
    return _where_each(valid1, merged, first)


def _small_tree(leaf: Callable, max_depth: int, depth, direction, q, p, g, logp, eps, h0, seed):
    """``build_tree`` of a subtree of at most ``2**max_depth`` leaves (per chain: ``depth <=
    max_depth``) in one block: ``2**max_depth`` leaves in a row, then each depth's tree over
    the first ``2**d`` of them, selected by the chain's depth.

    Where the gradient is cheap, a loop step of the batched machine costs far more than a
    leapfrog: computing the leaves a chain does not need (those past its depth, or past the
    point where its subtree stopped) costs less than the recursion's calls, returns and stack
    traffic for the subtree's bottom levels.

    In a graph the leaves are calls of one function, traced here (the target's gradient is
    traced once, not once per leaf); made per call, it never outlives what the target
    captures."""
    leaf = _traced_once(leaf)
    leaves = [leaf(direction, q, p, g, logp, eps, h0)]
    for _ in range(2 ** max_depth - 1):
        leaves.append(leaf(direction, *leaves[-1][:4], eps, h0))
    tree = leaves[0]
    for d in range(1, max_depth + 1):
        tree = _where_each(tf.equal(depth, d), _subtree_of_leaves(seed, leaves[:2 ** d]), tree)
    return tree


def _draw_trajectory(seed, q):
    """What the trajectory that ``seed`` starts from ``q`` (``[B, D]``) draws: the chain's
    seed after it, its own seed and its fresh momentum.

    The momentum is computed once (:func:`_computed_once`): XLA fuses an elementwise value
    into each of its consumers, and the start uses the momentum four times (both ends, the
    summed momentum, the energy), which computed its Box-Muller cosines and logarithms four
    times."""
    seed, s_traj = _split(seed, 2)
    s_traj, s_momentum = _split(s_traj, 2)
    return seed, s_traj, _computed_once(_normal(s_momentum, q.shape[-1], q.dtype))


def _start_trajectory(seed, s_traj, q, logp, g, p):
    """The chain's next trajectory from ``(q, logp, g)`` with the seeds and momentum ``p`` of
    :func:`_draw_trajectory`: the initial energy and the bookkeeping of a one-point
    trajectory."""
    h0 = -logp + 0.5 * _dot(p, p)
    zero_f = tf.zeros_like(logp)
    zero_i = tf.zeros_like(logp, tf.int32)
    false = tf.zeros_like(logp, tf.bool)
    # forward end, backward end, sample (and its energy), rho, log-sum-weight, depth, leaves,
    # metro, flags
    return (seed, s_traj, h0, q, p, g, logp, q, p, g, logp, q, g, logp, h0, p, zero_f, zero_i,
            zero_i, zero_f, false, false, false)


def _choose_direction(seed, qf, pf, gf, lf, qb, pb, gb, lb):
    """A fair coin per chain; the end of the trajectory to extend from."""
    seed, s_coin, s_tree = _split(seed, 3)
    forward = _computed_once(_uniform(s_coin, lf.dtype) < 0.5)
    direction = tf.where(forward, tf.ones_like(lf), -tf.ones_like(lf))
    start = [_where(forward, f, b) for f, b in ((qf, qb), (pf, pb), (gf, gb), (lf, lb))]
    return (seed, s_tree, forward, direction, *start)


def _extend_trajectory(max_depth: int, seed, forward, qf, pf, gf, lf, qb, pb, gb, lb,
                       q_s, g_s, l_s, e_s, rho, lsw, depth, accepted,
                       q_e, p_e, g_e, l_e, qp, gp, lp, ep, p_beg, rho_sub, lsw_sub, valid):
    """Top level of Stan's transition after one doubling: biased progressive sampling of the
    new subtree's proposal, the new trajectory ends, and whether to keep doubling."""
    seed, s_accept = _split(seed, 2)
    accept = _computed_once(valid & (tf.math.log(_uniform(s_accept, lsw.dtype)) < lsw_sub - lsw))
    q_s, g_s, l_s, e_s = (_where(accept, a, b)
                          for a, b in ((qp, q_s), (gp, g_s), (lp, l_s), (ep, e_s)))
    p_near, p_far = _where(forward, pf, pb), _where(forward, pb, pf)
    persist = _merged_no_u_turn(p_far, p_near, rho, p_beg, p_e, rho_sub)
    end = (q_e, p_e, g_e, l_e)
    qf, pf, gf, lf = (_where(forward, e, f) for e, f in zip(end, (qf, pf, gf, lf)))
    qb, pb, gb, lb = (_where(forward, b, e) for e, b in zip(end, (qb, pb, gb, lb)))
    lsw = tf.where(valid, _logaddexp(lsw, lsw_sub), lsw)
    depth = depth + 1
    go_on = valid & persist
    reach_max = go_on & (depth >= max_depth)
    return (seed, qf, pf, gf, lf, qb, pb, gb, lb, q_s, g_s, l_s, e_s, rho + rho_sub, lsw,
            depth, accepted | accept, reach_max, go_on & (depth < max_depth))


def _tally(leaves, leaves_sub, metro, metro_sub, div, div_sub):
    """Running counts of one trajectory: leaves, Metropolis probabilities, divergence."""
    return leaves + leaves_sub, metro + metro_sub, div | div_sub


def _finish_trajectory(unrolled: int, go, t, leapfrogs, stats, leaves, metro, accepted,
                       reach_max, div, energy):
    """Chains whose trajectory stopped (``go`` false) count it and keep its statistics as their
    last ``stats = (log_accept, accepted, reach_max, div, energy)``; log_accept is Stan's (mean
    Metropolis probability over leaves, as a log), energy the Hamiltonian of the sample."""
    done = ~go
    log_accept = tf.math.log(metro / tf.cast(leaves, metro.dtype))
    new = (log_accept, accepted, reach_max, div, energy)
    return (t + tf.cast(done, t.dtype), leapfrogs + tf.where(done, leaves * unrolled, 0),
            *(tf.where(done, a, b) for a, b in zip(new, stats)))


def _same(*values):
    """The values themselves (records a copy of program variables)."""
    return values


def _kept_if(keep, *values):
    """Per chain, the first half of ``values`` where ``keep``, else the second half."""
    half = len(values) // 2
    return _where_each(keep, values[:half], values[half:])


def _all_reached(registers: dict) -> tf.Tensor:
    """Pause a run-ahead step: every chain has recorded the state after its ``target``-th
    trajectory (``t_out``; ``t`` itself counts one block earlier, before the record)."""
    return tf.reduce_all(registers["t_out"] >= registers["target"])


def _start_steps(q):
    """Per chain: zero trajectories and leapfrogs, and the statistics of no trajectory."""
    zero_i = tf.zeros(tf.shape(q)[:1], tf.int32)
    zero_f = tf.zeros(tf.shape(q)[:1], q.dtype)
    false = tf.zeros(tf.shape(q)[:1], tf.bool)
    return zero_i, zero_i, zero_f, false, false, false, zero_f

# }}}

# {{{ momentum distributions: a Gaussian mass matrix as a linear change of coordinates

_MOMENTUM_HELP = (
    "pass a zero-mean Gaussian with no batch shape (one mass matrix for all chains): "
    "tfd.MultivariateNormalDiag, tfd.Independent(tfd.Normal(0., scale), k), "
    "tfd.MultivariateNormalTriL, tfd.MultivariateNormalLinearOperator or "
    "tfp.experimental.distributions.MultivariateNormalPrecisionFactorLinearOperator; for "
    "several state parts, one such distribution per part in a tfd.JointDistributionSequential")

_DIAGONAL_OPERATORS = (tf.linalg.LinearOperatorDiag, tf.linalg.LinearOperatorIdentity,
                       tf.linalg.LinearOperatorScaledIdentity)


def _static_or_tensor(x: Any) -> Any:
    """A numpy value when ``x`` is known statically (the programs then capture no tensor of
    the graph the kernel was built in), else ``x``."""
    value = tf.get_static_value(x)
    return x if value is None else value


def _momentum_block(dist: Any) -> tuple:
    """One state part's momentum distribution N(0, M) as ``(factor, inverse)``: the factor C
    has C C^T = M^-1 (the momentum's precision); it is a vector (the diagonal, and
    ``inverse`` is None) when M is diagonal, else a matrix [n, n] with its inverse."""
    tfd = tfp.distributions
    name = type(dist).__name__
    if not isinstance(dist, tfd.Distribution):
        raise ValueError(f"NoUTurnSampler: momentum_distribution must be a distribution, got "
                         f"{name}; {_MOMENTUM_HELP}")
    if not dist.batch_shape.is_fully_defined() or dist.batch_shape.num_elements() != 1:
        raise ValueError(f"NoUTurnSampler: momentum_distribution {name} has batch shape "
                         f"{dist.batch_shape}; {_MOMENTUM_HELP}")
    if not dist.event_shape.is_fully_defined():
        raise ValueError(f"NoUTurnSampler: momentum_distribution {name} needs a static event "
                         f"shape, got {dist.event_shape}")
    loc = getattr(dist.distribution if isinstance(dist, tfd.Independent) else dist, "loc",
                  None)
    static_loc = None if loc is None else tf.get_static_value(loc)
    if loc is not None and (static_loc is None or np.any(static_loc != 0)):
        raise ValueError(f"NoUTurnSampler: momentum_distribution {name} must have mean zero "
                         "(known when the kernel is built); pass loc=None")
    size = dist.event_shape.num_elements()
    if isinstance(dist, tfd.Independent) and isinstance(dist.distribution, tfd.Normal) or \
            isinstance(dist, tfd.Normal):
        normal = dist.distribution if isinstance(dist, tfd.Independent) else dist
        scale = tf.broadcast_to(normal.scale, dist.batch_shape + dist.event_shape)
        return _static_or_tensor(tf.reshape(1.0 / scale, [size])), None
    # C is the momentum's precision factor F, or S^-T for its covariance's scale S
    if isinstance(dist, tfp.experimental.distributions
                  .MultivariateNormalPrecisionFactorLinearOperator):
        op, is_scale = dist.precision_factor, False
    elif isinstance(dist, tfd.MultivariateNormalLinearOperator):
        op, is_scale = dist.scale, True
    else:
        raise ValueError(f"NoUTurnSampler: cannot use momentum_distribution {name} (not a "
                         f"Gaussian whose mass matrix it can read); {_MOMENTUM_HELP}")
    if isinstance(op, _DIAGONAL_OPERATORS):
        diag = tf.broadcast_to(op.diag_part(), [size])
        return _static_or_tensor(1.0 / diag if is_scale else diag), None
    matrix = tf.reshape(op.to_dense(), [size, size])
    if is_scale:   # C = S^-T, so C^-1 = S^T: one inversion
        factor, inverse = tf.linalg.matrix_transpose(tf.linalg.inv(matrix)), \
            tf.linalg.matrix_transpose(matrix)
    else:
        factor, inverse = matrix, tf.linalg.inv(matrix)
    return _static_or_tensor(factor), _static_or_tensor(inverse)


class _Momentum:
    """A Gaussian momentum distribution N(0, M) as the factor C of its precision (C C^T = M^-1).

    With q = C y and momentum p_y = C^T p, the Hamiltonian -log pi(q) + p^T M^-1 p / 2 is
    -log pi(C y) + |p_y|^2 / 2, and the leapfrog on (q, p) with velocity M^-1 p is the
    identity-metric leapfrog on (y, p_y); the generalized U-turn criterion (velocity at an end
    dotted with the summed momenta) and the energy are the same numbers too.  So the program
    stays the identity-metric one and runs on y:

    * a diagonal C needs no change of coordinates at all: the same leapfrog is the
      identity-metric one with per-coordinate step sizes ``step * c`` on q itself;
    * a dense C turns the target into ``y -> pi(C y)`` with gradient ``C^T grad`` (two
      ``[chains, D] x [D, D]`` products per leapfrog); the state goes to y and back once per
      ``one_step``.  A step size must then be the same for every coordinate.

    ``log_normalizer`` is -log N(0; 0, M): TFP's kinetic energy ``-momentum_distribution
    .log_prob(p)`` is ``|C^T p|^2 / 2`` plus it.
    """

    def __init__(self, dist: Any):
        parts = getattr(dist, "model", None)
        if isinstance(dist, tfp.distributions.JointDistribution):
            if not isinstance(parts, (list, tuple)) or not all(
                    isinstance(d, tfp.distributions.Distribution) for d in parts):
                raise ValueError(
                    f"NoUTurnSampler: momentum_distribution {type(dist).__name__} must list "
                    "one distribution per state part, in order (not callables); "
                    + _MOMENTUM_HELP)
        else:
            parts = [dist]
        blocks = [_momentum_block(d) for d in parts]
        self.sizes = tuple(int(np.prod(d.event_shape, dtype=np.int64)) for d in parts)
        self.diagonal = all(inverse is None for _, inverse in blocks)
        if self.diagonal:
            self.factor = _concat([f for f, _ in blocks])
            self.inverse = None
            log_det = tf.reduce_sum(tf.math.log(tf.abs(self.factor)))
        else:
            dense = [(f, i) if i is not None else (_diag(f), _diag(1.0 / f)) for f, i in blocks]
            self.factor, self.inverse = (_block_diagonal([b[k] for b in dense]) for k in (0, 1))
            log_det = tf.linalg.slogdet(tf.convert_to_tensor(self.factor))[1]
        dim = sum(self.sizes)
        self.log_normalizer = _static_or_tensor(0.5 * dim * math.log(2 * math.pi) - log_det)

    def check(self, spec: _StateSpec) -> None:
        if self.sizes != spec.sizes:
            raise ValueError(
                "NoUTurnSampler: momentum_distribution does not match the state: its event "
                f"sizes are {list(self.sizes)}, the state parts' {list(spec.sizes)}; "
                + _MOMENTUM_HELP)

    def step_size(self, flat_step: tf.Tensor) -> tf.Tensor:
        """The identity-metric program's step sizes: ``step * c``, or the step itself."""
        if self.diagonal:
            return flat_step * tf.cast(self.factor, flat_step.dtype)
        if flat_step.shape[-1] != 1:
            raise ValueError(
                "NoUTurnSampler: with a dense momentum_distribution the step size must be the "
                "same for every coordinate (a scalar, or [chains, 1] for one per chain); put "
                "per-coordinate scales into the mass matrix instead")
        return flat_step

    def to_program(self, q: tf.Tensor, g: tf.Tensor) -> tuple:
        """State and gradient ``[B, D]`` in the program's coordinates y = C^-1 q."""
        if self.diagonal:
            return q, g
        return (tf.matmul(q, tf.cast(self.inverse, q.dtype), transpose_b=True),
                tf.matmul(g, tf.cast(self.factor, g.dtype)))

    def from_program(self, y: tf.Tensor, g: tf.Tensor) -> tuple:
        """The inverse of :meth:`to_program`."""
        if self.diagonal:
            return y, g
        return (tf.matmul(y, tf.cast(self.factor, y.dtype), transpose_b=True),
                tf.matmul(g, tf.cast(self.inverse, g.dtype)))

    def target(self, vg: Callable) -> Callable:
        """The log-density and gradient ``vg`` of q, as functions of y."""
        if self.diagonal:
            return vg

        def vg_y(y):
            logp, g = vg(tf.matmul(y, tf.cast(self.factor, y.dtype), transpose_b=True))
            return logp, tf.matmul(g, tf.cast(self.factor, g.dtype))
        return vg_y


def _concat(values: list) -> Any:
    """Concatenated vectors: numpy when all are, else a tensor."""
    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values)
    return tf.concat([tf.convert_to_tensor(v) for v in values], 0)


def _diag(vector: Any) -> Any:
    return np.diag(vector) if isinstance(vector, np.ndarray) else tf.linalg.diag(vector)


def _block_diagonal(blocks: list) -> Any:
    """The block-diagonal matrix of square ``blocks`` (numpy when all are)."""
    if all(isinstance(b, np.ndarray) for b in blocks):
        out = np.zeros([sum(len(b) for b in blocks)] * 2, blocks[0].dtype)
        start = 0
        for b in blocks:
            out[start:start + len(b), start:start + len(b)] = b
            start += len(b)
        return out
    return tf.linalg.LinearOperatorBlockDiag(
        [tf.linalg.LinearOperatorFullMatrix(tf.convert_to_tensor(b)) for b in blocks]).to_dense()

# }}}

# {{{ the single-chain program


@tf.autograph.experimental.do_not_convert  # the autobatch front end must see our source
def _make_program(vg: Callable, max_tree_depth: int, max_energy_diff: float, unrolled: int,
                  wrap: Callable[[Callable], Callable], subtree_depth: int = 0,
                  one_trajectory: bool = False, gathered: bool = False) -> Callable:
    """The NUTS program for one chain; ``wrap`` batches each function (or is the identity).
    ``gathered``: the program-counter runtime computes each subtree's leapfrogs only for the
    chains at it (see ``GATHERED_SUBTREE_CHUNKS``).

    ``run_trajectories(t, leapfrogs, *last_statistics, target, cap, q, logp, g, eps, seed)``
    runs NUTS trajectories one after the other from state ``q`` (with log-density ``logp`` and
    gradient ``g``); see its docstring.  ``one_trajectory``: every call runs exactly one
    (``t`` 0, ``target`` and ``cap`` 1), and the program is compiled for that.
    """
    leaf = functools.partial(_small_tree, functools.partial(_leaf, vg, unrolled, max_energy_diff),
                             subtree_depth)
    # gathered: decided from the number of chains and the gradient's cost (NoUTurnSampler._program)
    if gathered:
        leaf = on_active_members(leaf, chunks=GATHERED_SUBTREE_CHUNKS, min_batch=1)
    extend = functools.partial(_extend_trajectory, max_tree_depth)
    finish = functools.partial(_finish_trajectory, unrolled)

    @wrap
    def build_tree(depth, direction, q, p, g, logp, eps, h0, seed):
        """Subtree of 2**depth leaves next to (q, p) in ``direction``: far end, proposal,
        momentum at the near end, summed momentum, log-sum-weight, statistics, validity."""
        # The recursive case comes first and the leaf last: the runtimes run the earliest
        # block some member waits at, so members gather at the (expensive) leaf until every
        # other member has reached it too.
        if depth > subtree_depth:
            seed_first, seed_second, seed_pick = _split(seed, 3)
            (q1, p1, g1, l1, qp1, gp1, lp1, ep1, p_beg1, rho1, lsw1, metro1, leaves1, valid1,
             div1) = build_tree(depth - 1, direction, q, p, g, logp, eps, h0, seed_first)
            if not valid1:
                return (q1, p1, g1, l1, qp1, gp1, lp1, ep1, p_beg1, rho1, lsw1, metro1, leaves1,
                        valid1, div1)
            (q2, p2, g2, l2, qp2, gp2, lp2, ep2, p_beg2, rho2, lsw2, metro2, leaves2, valid2,
             div2) = build_tree(depth - 1, direction, q1, p1, g1, l1, eps, h0, seed_second)
            (q, p, g, logp, qp, gp, lp, ep, p_beg, rho, lsw, metro, leaves, valid,
             div) = _merge_subtrees(
                seed_pick, qp1, gp1, lp1, ep1, p_beg1, p1, rho1, lsw1, metro1, leaves1, div1,
                q2, p2, g2, l2, qp2, gp2, lp2, ep2, p_beg2, rho2, lsw2, metro2, leaves2, valid2,
                div2)
            return q, p, g, logp, qp, gp, lp, ep, p_beg, rho, lsw, metro, leaves, valid, div
        (q1, p1, g1, l1, qp, gp, lp, ep, p_beg, rho, lsw, metro, leaves, valid,
         div) = leaf(depth, direction, q, p, g, logp, eps, h0, seed)
        return q1, p1, g1, l1, qp, gp, lp, ep, p_beg, rho, lsw, metro, leaves, valid, div

    @wrap
    def run_trajectories(t, leapfrogs, log_accept, accepted, reach_max, div, energy, target,
                         cap, q, logp, g, eps, seed):
        """NUTS transitions in sequence from state ``q`` (Figure 7: the batch can overlap
        them), counting on from ``t`` trajectories and ``leapfrogs`` leapfrogs (and the last
        trajectory's statistics), until ``cap`` trajectories; the state after trajectory
        ``target`` is kept as the output (``q`` itself when ``t`` is ``target`` already).
        The outer loop runs trajectories, the inner one their doublings; chains at different
        trajectories share every block, the gradient included.  The start of a trajectory is
        a block of its own (only chains starting one wait at it), not selects in the
        doubling's block: drawing a momentum costs a few [B, D] passes, and the doubling's
        block runs whenever any chain finishes a doubling (10 trajectories per step at 1000
        chains: one step 1.95 -> 1.20 s).  No momentum is drawn after the call's last
        trajectory: the next call starts from its own arguments.

        With ``one_trajectory`` (one trajectory a call and no run-ahead, the default) the
        tests on it are decided when the program is compiled: the trajectory's sample is the
        output as it stops, with no output copies, record or cap test (two blocks fewer to
        compile and to guard in every loop step).

        Returns the output (state, log-density, gradient, statistics, leapfrogs so far), then
        where the chain stands — its state, the seed its next trajectory starts from, its
        trajectory and leapfrog counts — so that a later call can go on from there, and the
        trajectory count of the output (which a paused run-ahead step waits for)."""
        if not one_trajectory:
            (q_out, l_out, g_out, leap_out, log_accept_out, accepted_out, reach_out, div_out,
             e_out, t_out) = _same(q, logp, g, leapfrogs, log_accept, accepted, reach_max,
                                   div, energy, t)
            seed_0 = tf.identity(seed)
        seed_next, seed_next_t, p_0 = _draw_trajectory(seed, q)
        (seed, seed_t, h0, qf, pf, gf, lf, qb, pb, gb, lb, q_s, g_s, l_s, e_s, rho, lsw, depth,
         leaves, metro, accepted_t, reach_max_t, div_t) = _start_trajectory(
             seed_next, seed_next_t, q, logp, g, p_0)
        while one_trajectory or t < cap:
            while True:  # one doubling of the trajectory per iteration
                (seed_t, seed_tree, forward, direction, q_i, p_i, g_i,
                 l_i) = _choose_direction(seed_t, qf, pf, gf, lf, qb, pb, gb, lb)
                (q_e, p_e, g_e, l_e, qp, gp, lp, ep, p_beg, rho_sub, lsw_sub, metro_sub,
                 leaves_sub, valid, div_sub) = build_tree(depth, direction, q_i, p_i, g_i, l_i,
                                                          eps, h0, seed_tree)
                leaves, metro, div_t = _tally(leaves, leaves_sub, metro, metro_sub, div_t,
                                              div_sub)
                (seed_t, qf, pf, gf, lf, qb, pb, gb, lb, q_s, g_s, l_s, e_s, rho, lsw, depth,
                 accepted_t, reach_max_t, go) = extend(
                     seed_t, forward, qf, pf, gf, lf, qb, pb, gb, lb, q_s, g_s, l_s, e_s, rho,
                     lsw, depth, accepted_t, q_e, p_e, g_e, l_e, qp, gp, lp, ep, p_beg, rho_sub,
                     lsw_sub, valid)
                (t, leapfrogs, log_accept, accepted, reach_max, div, energy) = finish(
                    go, t, leapfrogs, (log_accept, accepted, reach_max, div, energy), leaves,
                    metro, accepted_t, reach_max_t, div_t, e_s)
                if not go:
                    break
            if one_trajectory:
                return (q_s, l_s, g_s, log_accept, accepted, leapfrogs, reach_max, div, q_s,
                        l_s, g_s, seed, t, leapfrogs, log_accept, accepted, reach_max, div,
                        energy, t, energy)
            # The trajectory stopped: its sample is the chain's state.  Recorded, and the cap
            # tested, in one block: a paused run resumes with target and cap re-read, and a
            # pause between the two would skip the record (a stale state for that step).
            (q_out, l_out, g_out, leap_out, log_accept_out, accepted_out, reach_out, div_out,
             e_out, t_out) = _kept_if(
                 t == target, q_s, l_s, g_s, leapfrogs, log_accept, accepted, reach_max, div,
                 energy, t, q_out, l_out, g_out, leap_out, log_accept_out, accepted_out,
                 reach_out, div_out, e_out, t_out)
            seed_0 = tf.identity(seed)
            if t >= cap:  # the call's last trajectory: no next one to draw
                break
            seed_next, seed_next_t, p_0 = _draw_trajectory(seed, q_s)
            (seed, seed_t, h0, qf, pf, gf, lf, qb, pb, gb, lb, q_s, g_s, l_s, e_s, rho, lsw,
             depth, leaves, metro, accepted_t, reach_max_t,
             div_t) = _start_trajectory(seed_next, seed_next_t, q_s, l_s, g_s, p_0)
        return (q_out, l_out, g_out, log_accept_out, accepted_out, leap_out, reach_out, div_out,
                q_s, l_s, g_s, seed_0, t, leapfrogs, log_accept, accepted, reach_max, div,
                energy, t_out, e_out)

    return run_trajectories

# }}}

# {{{ the TransitionKernel


class NoUTurnSampler(tfp.mcmc.TransitionKernel):
    """NUTS whose recursive tree building is batched over chains by ``tfx_vec.autobatch``.

    Args:
      target_log_prob_fn: ``f(*state_parts) -> batch_shape`` log-density.  As in TFP, the
        shape of its output is the batch shape (the chains: ``[]`` for one chain, ``[chains]``,
        ``[a, b]``, ...) and every state part is ``batch_shape + event_shape`` (static event
        shape).  Inside the batched program it is called on the chains flattened into one
        dimension, ``[chains, *event_shape]`` per part, and on junk values for chains that
        are not at the leapfrog (their results are discarded), so it must treat leading
        dimensions as independent chains and must not raise on finite inputs.
      step_size: a float, a tensor broadcastable to each state part (``[chains, 1]`` gives a
        step size per chain), or a list with one such entry per state part.
      momentum_distribution: (keyword) the momentum's distribution N(0, M), with the meaning
        of ``tfp.experimental.mcmc.PreconditionedNoUTurnSampler``'s argument: kinetic energy
        ``-momentum_distribution.log_prob(p)``, velocity its gradient M^-1 p (the position
        update and the U-turn criterion use it), ``energy`` in the results includes its
        normalizing constant.  A zero-mean Gaussian without batch shape: a diagonal M
        (``tfd.MultivariateNormalDiag``, ``tfd.Independent(tfd.Normal(0., s), k)``, a
        diagonal operator) costs nothing extra (it is per-coordinate step sizes); a dense one
        (``tfd.MultivariateNormalTriL``, ``tfd.MultivariateNormalLinearOperator``,
        ``tfp.experimental.distributions.MultivariateNormalPrecisionFactorLinearOperator``)
        two ``[chains, D] x [D, D]`` products per leapfrog, and needs a step size that is the
        same for every coordinate.  Several state parts: one per part in a
        ``tfd.JointDistributionSequential``.  ``None`` (default): the identity.
      max_tree_depth: a trajectory has at most ``2**max_tree_depth - 1`` leaves.
      max_energy_diff: a leaf whose energy exceeds the initial one by more is a divergence.
      unrolled_leapfrog_steps: leapfrog steps per leaf (the paper uses 4 to amortize control).
      parallel_iterations: TFP's argument, recorded in ``parameters`` (the batched program's
        loop runs one block per iteration).
      experimental_shard_axis_names: TFP's argument, recorded; sampling a sharded state (any
        name not None) raises a ``ValueError``.
      name: name scope of the kernel's ops.
      num_trajectories_per_step: trajectories run back to back in one batched program per
        ``one_step``; only the last state is returned (thinning).  With the program-counter
        runtime the batch then synchronizes on gradients rather than trajectory boundaries.
      runtime: ``"program_counter"`` (one ``tf.while_loop``; works under
        ``tf.function(jit_compile=True)``), ``"local_static"`` (eager, Python recursion),
        ``"hybrid"`` (local static with XLA-compiled basic blocks) or ``"python"`` (the same
        program run directly, one chain at a time: the unbatched reference).
      seed: seed for steps that are not given one (stateless; carried in the kernel results).
      run_ahead: (program counter only) chains never wait at a step's end.  A step pauses the
        batched program as soon as every chain has completed its next
        ``num_trajectories_per_step`` trajectories; chains that got there first have gone on
        with later trajectories (up to one step's worth), and the next step resumes the
        paused machine — program counters, registers, stacks, kept in the kernel results —
        so nothing is dropped or recomputed.  Each chain follows its own seed stream from the
        first step (``one_step``'s later seeds are not used), so a chain is the same Markov
        chain as run alone without steps; ``current_state`` must be the previous step's
        state, as in ``sample_chain``, and the step size must stay fixed (a paused chain keeps
        the one it started its trajectory with: run it after adaptation).  Utilization then
        no longer has the ceiling of synchronizing every ``num_trajectories_per_step``
        trajectories (Figure 7).
      scheduler: block selection of the program-counter runtime: ``"earliest"`` (the paper's;
        members gather at the gradient, the last block), ``"most_active"`` (the block most
        members wait at: fewer loop steps, but the gradient runs for fewer members at a time)
        or ``"sweep_guarded"`` (every block once per loop step, skipped when no member waits:
        a chain goes through several blocks in one loop step), ``"sweep"``.  Default
        (``None``): ``"sweep_guarded"``, or ``"earliest"`` with ``run_ahead`` (which needs the
        chains gathered at the gradient).  The draws are the same under every scheduler.
      unrolled_subtree_depth: subtrees of up to this depth (``2**depth`` leaves) are built in
        one block of straight-line code instead of by recursion: every chain computes all
        ``2**depth`` leapfrogs and keeps those its tree takes.  Fewer loop steps of the
        batched machine, more leapfrogs computed.  The draws are the same for every value.
        Default (``None``): ``SUBTREE_DEPTH`` (2) where the gradient costs under
        ``SUBTREE_GRADIENT_FLOPS_PER_DIM`` (1000) operations per chain and state dimension
        (counted in its graph: matrix products as ``2mnk``, other ops by their size), else 0
        (the recursion down to single leaves).

    Example:
        >>> import tensorflow as tf
        >>> k = NoUTurnSampler(lambda x: -0.5 * tf.reduce_sum(x * x, -1), 0.3, runtime="python")
        >>> x, r = k.one_step(tf.ones([2, 2]), k.bootstrap_results(tf.ones([2, 2])), seed=(4, 2))
        >>> r.leapfrogs_taken.shape
        TensorShape([2])
    """

    def __init__(self, target_log_prob_fn: Callable, step_size: Any, max_tree_depth: int = 10,
                 max_energy_diff: float = 1000.0, unrolled_leapfrog_steps: int = 1,
                 parallel_iterations: int = 10, experimental_shard_axis_names: Any = None,
                 name: str | None = None, *, num_trajectories_per_step: int = 1,
                 runtime: str = "program_counter", seed: Any = None,
                 scheduler: str | None = None, run_ahead: bool = False,
                 momentum_distribution: Any = None, unrolled_subtree_depth: int | None = None):
        max_tree_depth = tf.get_static_value(max_tree_depth)
        if max_tree_depth is None or int(max_tree_depth) < 1:
            raise ValueError("NoUTurnSampler: max_tree_depth must be known statically and >= 1, "
                             f"got {max_tree_depth}")
        if int(unrolled_leapfrog_steps) < 1:
            raise ValueError("NoUTurnSampler: unrolled_leapfrog_steps must be >= 1, got "
                             f"{unrolled_leapfrog_steps}")
        if int(num_trajectories_per_step) < 1:
            raise ValueError("NoUTurnSampler: num_trajectories_per_step must be >= 1, got "
                             f"{num_trajectories_per_step}")
        if unrolled_subtree_depth is not None and (
                isinstance(unrolled_subtree_depth, bool)
                or not isinstance(unrolled_subtree_depth, (int, np.integer))
                or unrolled_subtree_depth < 0):
            raise ValueError("NoUTurnSampler: unrolled_subtree_depth must be None or an integer "
                             f">= 0, got {unrolled_subtree_depth!r}")
        if int(parallel_iterations) < 1:
            raise ValueError("NoUTurnSampler: parallel_iterations must be a positive integer, "
                             f"got {parallel_iterations}")
        if runtime not in RUNTIMES:
            raise ValueError(f"NoUTurnSampler: runtime must be one of {RUNTIMES}, got {runtime!r}")
        if run_ahead and runtime != "program_counter":
            raise ValueError("NoUTurnSampler: run_ahead pauses and resumes the program-counter "
                             f"machine; it needs runtime=\"program_counter\", got {runtime!r}")
        from tfx_vec.autobatch.program_counter import SCHEDULERS
        if scheduler is not None and scheduler not in SCHEDULERS:
            raise ValueError(f"NoUTurnSampler: scheduler must be None or one of "
                             f"{sorted(SCHEDULERS)}, got {scheduler!r}")
        self._parameters = dict(
            target_log_prob_fn=target_log_prob_fn, step_size=step_size,
            max_tree_depth=int(max_tree_depth), max_energy_diff=float(max_energy_diff),
            unrolled_leapfrog_steps=int(unrolled_leapfrog_steps),
            parallel_iterations=int(parallel_iterations),
            experimental_shard_axis_names=experimental_shard_axis_names,
            name=name or "tfx_vec_nuts", num_trajectories_per_step=int(num_trajectories_per_step),
            runtime=runtime, seed=seed, scheduler=scheduler, run_ahead=bool(run_ahead),
            momentum_distribution=momentum_distribution,
            unrolled_subtree_depth=(None if unrolled_subtree_depth is None
                                    else int(unrolled_subtree_depth)))
        self._momentum = (None if momentum_distribution is None
                          else _Momentum(momentum_distribution))
        self._programs: dict = {}

    # -- TFP kernel protocol -------------------------------------------------------------
    @property
    def parameters(self) -> dict:
        return self._parameters

    def __getattr__(self, name):
        params = self.__dict__.get("_parameters", {})
        if name in params:
            return params[name]
        raise AttributeError(name)

    @property
    def is_calibrated(self) -> bool:
        return True

    @property
    def experimental_shard_axis_names(self) -> Any:
        return self._parameters["experimental_shard_axis_names"]

    def experimental_with_shard_axes(self, shard_axis_names: Any) -> "NoUTurnSampler":
        """A copy with ``experimental_shard_axis_names`` set (recorded; sampling refuses
        sharded states)."""
        return self.copy(experimental_shard_axis_names=shard_axis_names)

    def _check_unsharded(self) -> None:
        names = self.experimental_shard_axis_names
        if names is not None and any(n is not None for n in tf.nest.flatten(names)):
            raise ValueError(
                "NoUTurnSampler: sharded states (experimental_shard_axis_names="
                f"{names!r}) are not supported; use tfp.mcmc.NoUTurnSampler for them, or "
                "give every chain its whole state and spread the chains over devices with "
                "tfx_vec.distribute.sample_chains")

    def bootstrap_results(self, init_state: Any) -> NUTSKernelResults:
        with tf.name_scope(self.name + ".bootstrap_results"):
            self._check_unsharded()
            parts = self._parts(init_state)
            _StateSpec.check_dtype(parts)
            logp, grads = mcmc_util.maybe_call_fn_and_grads(self.target_log_prob_fn, parts)
            spec = _StateSpec(parts, _batch_ndims(logp, parts))
            logp = tf.cast(logp, spec.dtype)
            zeros_i = tf.zeros_like(logp, tf.int32)
            false = tf.zeros_like(logp, tf.bool)
            step_size = tf.nest.map_structure(
                lambda s: tf.convert_to_tensor(s, spec.dtype), self.step_size)
            self._program_step_size(spec, parts, step_size)  # a step size that does not fit: now
            seed = samplers.sanitize_seed(self.seed, salt="tfx_vec_nuts")
            machine, target, restart = (), (), ()
            if self.run_ahead:   # every member halted: the first step starts them all
                q, g = self._to_program(spec.flatten(parts), spec.flatten(grads))
                flat_logp = tf.reshape(logp, [spec.chains])
                start = _start_steps(q)
                restart = (*start[:2], q, flat_logp, g, chain_seeds(seed, spec.chains),
                           *start[2:])
                args = self._arguments(spec, parts, step_size, start[0], start[0],
                                       *restart[2:6])
                program, opts = self._resumable(spec)
                from tfx_vec.autobatch import program_counter
                machine = program_counter.idle_machine(program, args, opts)
                target = tf.constant(0, tf.int32)
            return NUTSKernelResults(
                target_log_prob=logp, grads_target_log_prob=list(grads), step_size=step_size,
                log_accept_ratio=tf.zeros_like(logp), leapfrogs_taken=zeros_i,
                is_accepted=false, reach_max_depth=false, has_divergence=false,
                # TFP's: a unit momentum in every coordinate
                energy=logp - 0.5 * spec.dim - self._log_normalizer(spec.dtype),
                seed=seed, total_leapfrogs_taken=zeros_i, leapfrogs_computed=zeros_i,
                machine=machine, ahead_target=target, ahead_restart=restart)

    def one_step(self, current_state: Any, previous_kernel_results: NUTSKernelResults,
                 seed: Any = None):
        with tf.name_scope(self.name + ".one_step"):
            self._check_unsharded()
            parts = self._parts(current_state)
            prev = previous_kernel_results
            spec = _StateSpec(parts, _batch_ndims(prev.target_log_prob, parts))
            # the seed this step uses (kept in the results, as TFP does); without one, the
            # carried seed advances
            seed = samplers.sanitize_seed(samplers.split_seed(prev.seed)[1] if seed is None
                                          else seed)
            step_seed, _ = samplers.split_seed(seed)
            q = spec.flatten(parts)
            per_chain = functools.partial(_per_chain, spec)
            per_step = tf.constant(self.num_trajectories_per_step, tf.int32)
            machine, target, restart = (), (), ()
            if self.run_ahead:
                target = prev.ahead_target + per_step
                t, leapfrogs_so_far, q_s, l_s, g_s, seeds, *stats = prev.ahead_restart
                # the first step's seed starts every chain's stream (all start then)
                seeds = tf.where(tf.equal(prev.ahead_target, 0),
                                 chain_seeds(step_seed, spec.chains), seeds)
                # a chain may complete the next step's trajectories too (then it returns, and
                # restarts at the next step with its output ready)
                args = self._arguments(spec, parts, prev.step_size, target, target + per_step,
                                       q_s, l_s, g_s, seeds, counts=(t, leapfrogs_so_far),
                                       stats=stats)
                program, opts = self._resumable(spec)
                from tfx_vec.autobatch import program_counter
                out, regs, machine = program_counter.call_resumable(
                    program, args, opts, prev.machine, _all_reached, refresh=("target", "cap"))
                (q, logp, g, log_accept, accepted, leapfrogs, reach_max, div, energy) = (
                    regs[n] for n in ("q_out", "l_out", "g_out", "log_accept_out",
                                      "accepted_out", "leap_out", "reach_out", "div_out",
                                      "e_out"))
                q, g = self._from_program(q, g)
                # leap_out counts from the first step
                leapfrogs = leapfrogs - per_chain(prev.total_leapfrogs_taken)
                # where chains that ran to their cap (and returned) restart next step; the
                # others are paused mid-program and resume from the machine
                q_s, l_s, g_s, seed_0, t, leapfrogs_so_far, *stats, _, _ = out[8:]
                restart = (t, leapfrogs_so_far, q_s, l_s, g_s, seed_0, *stats)
            else:
                q, g = self._to_program(q, spec.flatten(prev.grads_target_log_prob))
                args = self._arguments(spec, parts, prev.step_size, per_step, per_step, q,
                                       per_chain(prev.target_log_prob), g,
                                       chain_seeds(step_seed, spec.chains))
                out = self._run(spec, args)
                (q, logp, g, log_accept, accepted, leapfrogs, reach_max, div) = out[:8]
                q, g = self._from_program(q, g)
                energy = out[-1]
            batch = spec.unflatten_batch
            leapfrogs = batch(leapfrogs)
            new_state = tf.nest.pack_sequence_as(current_state, spec.unflatten(q))
            results = NUTSKernelResults(
                target_log_prob=batch(logp), grads_target_log_prob=spec.unflatten(g),
                step_size=prev.step_size, log_accept_ratio=batch(log_accept),
                leapfrogs_taken=leapfrogs, is_accepted=batch(accepted),
                reach_max_depth=batch(reach_max), has_divergence=batch(div),
                # TFP's sign: log-density minus kinetic energy
                energy=-batch(energy) - self._log_normalizer(spec.dtype),
                seed=seed, total_leapfrogs_taken=prev.total_leapfrogs_taken + leapfrogs,
                leapfrogs_computed=prev.leapfrogs_computed + tf.reduce_max(leapfrogs),
                machine=machine, ahead_target=target, ahead_restart=restart)
            return new_state, results

    def _arguments(self, spec: _StateSpec, parts: list, step_size: Any, target, cap, q, logp,
                   g, seeds, counts: tuple | None = None, stats: Sequence | None = None) -> tuple:
        """The program's arguments: trajectory and leapfrog counts to go on from with the last
        trajectory's statistics (zeros to start), target and cap (per chain), state,
        log-density, gradient, flat step sizes and seeds."""
        logp = tf.convert_to_tensor(logp, spec.dtype)
        counts = counts if counts is not None else _start_steps(q)[:2]
        stats = stats if stats is not None else _start_steps(q)[2:]
        target, cap = (tf.broadcast_to(x, tf.shape(logp)) for x in (target, cap))
        eps = self._program_step_size(spec, parts, step_size)
        if eps.shape[-1] == 1:  # one per chain: carried and stacked as [chains], whose stack
            eps = eps[:, 0]     # XLA updates in place ([chains, 1]'s it copied every loop step)
        return (*counts, *stats, target, cap, q, logp, g, eps, seeds)

    def _program_step_size(self, spec: _StateSpec, parts: list, step_size: Any) -> tf.Tensor:
        """The flat step sizes the identity-metric program takes (see :class:`_Momentum`)."""
        flat = self._flat_step_size(spec, parts, step_size)
        if self._momentum is None:
            return flat
        self._momentum.check(spec)
        return self._momentum.step_size(flat)

    def _to_program(self, q: tf.Tensor, g: tf.Tensor) -> tuple:
        """Flat state and gradient in the program's coordinates (see :class:`_Momentum`)."""
        return (q, g) if self._momentum is None else self._momentum.to_program(q, g)

    def _from_program(self, q: tf.Tensor, g: tf.Tensor) -> tuple:
        return (q, g) if self._momentum is None else self._momentum.from_program(q, g)

    def _log_normalizer(self, dtype: tf.DType) -> Any:
        """What TFP's kinetic energy adds to ours: -log N(0; 0, M), or 0 without a
        momentum distribution (as ``tfp.mcmc.NoUTurnSampler``)."""
        return 0.0 if self._momentum is None else tf.cast(self._momentum.log_normalizer, dtype)

    def _resumable(self, spec: _StateSpec) -> tuple:
        """The batched program and the options :func:`program_counter.call_resumable` runs
        it with."""
        program = self._program(spec, batched=True)
        return program, dict(program.options, runtime="program_counter",
                             scheduler=self._scheduler())

    def copy(self, **override_parameter_kwargs: Any) -> "NoUTurnSampler":
        """A kernel with some parameters replaced.  Changing only ``step_size``,
        ``num_trajectories_per_step``, ``runtime``, ``seed``, ``name``,
        ``parallel_iterations`` or a diagonal ``momentum_distribution`` keeps the compiled
        programs (they take those as inputs or options; one trajectory a call and several
        are two programs, each compiled once)."""
        params = {**self.parameters, **override_parameter_kwargs}
        new = type(self)(**params)
        program_params = ("target_log_prob_fn", "max_tree_depth", "max_energy_diff",
                          "unrolled_leapfrog_steps", "unrolled_subtree_depth")
        if all(params[k] is self.parameters[k] or params[k] == self.parameters[k]
               for k in program_params) and (
                   params["momentum_distribution"] is self.momentum_distribution
                   or new._momentum_keeps_programs() and self._momentum_keeps_programs()):
            new._programs = self._programs
        return new

    # -- helpers -------------------------------------------------------------------------
    def _momentum_keeps_programs(self) -> bool:
        """Does the program not depend on the momentum distribution (none, or diagonal: a
        step size input)?"""
        return self._momentum is None or self._momentum.diagonal

    @staticmethod
    def _parts(state: Any) -> list[tf.Tensor]:
        parts = tf.nest.flatten(state)
        if tf.nest.is_nested(state) and (not isinstance(state, (list, tuple))
                                         or len(parts) != len(state)):
            raise TypeError("NUTS does not currently support nested or non-list-like state "
                            f"structures (saw: {state}).")
        return [tf.convert_to_tensor(p) for p in parts]

    @staticmethod
    def _flat_step_size(spec: _StateSpec, parts: list[tf.Tensor], step_size: Any) -> tf.Tensor:
        """Step sizes ``[chains, D]``, or ``[chains, 1]`` when one step size per chain serves
        every coordinate (a narrower value the program carries and stacks at every level)."""
        steps = list(step_size) if tf.nest.is_nested(step_size) else [step_size]
        if len(steps) == 1:
            steps = steps * len(parts)
        if len(steps) != len(parts):
            raise ValueError(f"NoUTurnSampler: expected 1 or {len(parts)} step sizes (one per "
                             f"state part), got {len(steps)}")
        full = []
        for s, p in zip(steps, parts):
            s = tf.convert_to_tensor(s, spec.dtype)
            try:
                full.append(tf.broadcast_to(s, tf.shape(p)))
                tf.broadcast_static_shape(s.shape, p.shape)
            except (tf.errors.InvalidArgumentError, ValueError) as e:
                raise ValueError(f"NoUTurnSampler: step size of shape {s.shape} does not "
                                 f"broadcast to the state part of shape {p.shape} (use "
                                 "[chains, 1, ...] for a step size per chain)") from e
        shape = tf.convert_to_tensor(steps[0], spec.dtype).shape
        if spec.sizes[0] > 0 and all(s is steps[0] for s in steps) and all(
                _ones_over_events(shape, p.shape.rank - spec.batch_ndims) for p in parts):
            return tf.reshape(full[0], [spec.chains, spec.sizes[0]])[:, :1]
        return spec.flatten(full)

    def _program(self, spec: _StateSpec, batched: bool) -> Callable:
        subtree_depth = self._subtree_depth(spec)
        one_trajectory = self.num_trajectories_per_step == 1 and not self.run_ahead
        # decided here rather than by on_active_members' min_batch: an unmarked leaf keeps
        # type inference's trace replayable
        gathered = (batched and subtree_depth > 0 and isinstance(spec.chains, int)
                    and spec.chains >= GATHERED_SUBTREE_MIN_CHAINS
                    and self._cost(spec) < GATHERED_SUBTREE_GRADIENT_FLOPS_PER_DIM)
        key = (spec.key, batched, subtree_depth, one_trajectory, gathered)
        if key not in self._programs:
            vg = self._value_and_grad(spec)
            if batched:
                from tfx_vec import autobatch as ab
                # NUTS always terminates; max_steps only guards the runtime's loop.
                wrap = ab.function(max_stack_depth=self.max_tree_depth + 4, max_steps=2 ** 30,
                                   block_layout="continuations_first")
            else:
                wrap = _identity
            self._programs[key] = _make_program(vg, self.max_tree_depth, self.max_energy_diff,
                                                self.unrolled_leapfrog_steps, wrap,
                                                subtree_depth, one_trajectory, gathered)
        return self._programs[key]

    def _value_and_grad(self, spec: _StateSpec) -> Callable:
        """The flat state's log-density and gradient, in the program's coordinates."""
        vg = functools.partial(spec.value_and_grad, self.target_log_prob_fn)
        if self._momentum is None:
            return vg
        self._momentum.check(spec)
        return self._momentum.target(vg)

    @tf.autograph.experimental.do_not_convert
    def _run(self, spec: _StateSpec, args: tuple) -> tuple:
        if self.runtime == "python":
            if not tf.executing_eagerly():
                raise ValueError('NoUTurnSampler: runtime="python" runs chains one at a time in '
                                 "eager mode; use runtime=\"program_counter\" inside tf.function")
            program = self._program(spec, batched=False)
            rows = [program(*(a[b:b + 1] for a in args)) for b in range(int(args[8].shape[0]))]
            return tuple(tf.concat(col, axis=0) for col in zip(*rows))
        program = self._program(spec, batched=True)
        if self.runtime == "hybrid":
            return tuple(program(*args, runtime="local_static", xla_blocks=True))
        return tuple(program(*args, runtime=self.runtime, scheduler=self._scheduler()))

    def _scheduler(self) -> str:
        """The program counter's block selection (see ``scheduler`` in the class docstring).

        ``"sweep_guarded"`` by default: a loop step of the batched machine costs about as much
        whichever block it runs, and a sweep lets each chain go on through the blocks after
        its own in the same step.  Against running the block most chains wait at (cheap
        gradients) or the earliest one (the others), ``sample_chain`` under XLA: 1.07-1.8x
        faster at 4 and 16 chains, 1.06-1.24x at 100, 0.97-1.02x at 256-1000."""
        if self.scheduler is not None:
            return self.scheduler
        return "earliest" if self.run_ahead else "sweep_guarded"

    def _subtree_depth(self, spec: _StateSpec) -> int:
        """Depth of the subtrees built in one block (see ``unrolled_subtree_depth`` in the
        class docstring): the one given, else chosen from the gradient's cost."""
        depth = self.unrolled_subtree_depth
        if depth is None:
            depth = (SUBTREE_DEPTH if self._cost(spec) < SUBTREE_GRADIENT_FLOPS_PER_DIM
                     else 0)
        return min(depth, self.max_tree_depth - 1)

    def _cost(self, spec: _StateSpec) -> float:
        """The gradient's :func:`_gradient_cost`, once per state structure; kept beside the
        programs, so that a copy sharing them shares the choices made from it."""
        key = ("cost", spec.key, spec.chains if isinstance(spec.chains, int) else None)
        if key not in self._programs:
            self._programs[key] = _gradient_cost(self._value_and_grad(spec), spec.chains,
                                                 spec.dim, spec.dtype)
        return self._programs[key]


def _ones_over_events(shape: tf.TensorShape, events: int) -> bool:
    """Does a value of ``shape``, broadcast against ``[chains, *event]`` (``events`` event
    dimensions), hold one value per chain (every dimension aligned with the event is 1)?"""
    if shape.rank is None:
        return False
    tail = shape.as_list()[max(0, shape.rank - events):] if events else []
    return all(d == 1 for d in tail)


def _batch_ndims(target_log_prob: tf.Tensor, parts: Sequence[tf.Tensor]) -> int:
    """The number of batch (chain) dimensions: the rank of the target's output, as TFP reads
    it; the state parts must start with those dimensions."""
    rank = target_log_prob.shape.rank
    if rank is None:
        raise ValueError("NoUTurnSampler: target_log_prob_fn returned a value of unknown rank; "
                         "its rank is the number of batch (chain) dimensions and must be known")
    for p in parts:
        if p.shape.rank is not None and (
                p.shape.rank < rank
                or not p.shape[:rank].is_compatible_with(target_log_prob.shape)):
            raise ValueError(
                "NoUTurnSampler: target_log_prob_fn must return one value per chain: its "
                f"output's shape {target_log_prob.shape} must be the leading dimensions of "
                f"every state part, got a part of shape {p.shape}")
    return rank


def _per_chain(spec: _StateSpec, values: tf.Tensor) -> tf.Tensor:
    """Values of the batch shape -> one per flat chain ``[chains]``."""
    return tf.reshape(values, [spec.chains])


def _identity(fn: Callable) -> Callable:
    return fn

# }}}

# {{{ windowed adaptation: step size and diagonal mass matrix from the warm-up draws


def _adaptation_windows(num_steps: int) -> list[tuple[int, bool]]:
    """Stan's warm-up schedule as ``(length, estimate_variance)`` windows: a fast window (step
    size only), slow windows doubling from 25 steps (each ends with a new variance estimate;
    the last one takes what the next doubling would not fill), a final fast window.  Under 150
    steps: 15% / 75% / 10%."""
    if num_steps < 150:
        first, last = int(0.15 * num_steps), int(0.1 * num_steps)
        size = num_steps - first - last
    else:
        first, last, size = 75, 50, 25
    windows, left = [(first, False)], num_steps - first - last
    while left > 0:
        size = left if left < 3 * size else size
        windows.append((size, True))
        left, size = left - size, 2 * size
    return [w for w in windows + [(last, False)] if w[0] > 0]


def windowed_adaptive_nuts(num_draws: int, target_log_prob_fn: Callable, initial_state: Any,
                           *, num_adaptation_steps: int = 500, step_size: float = 0.1,
                           target_accept_prob: float = 0.75, seed: Any = None,
                           jit_compile: bool = True, **kernel_kwargs: Any) -> tuple:
    """Warm up NUTS (step size and diagonal mass matrix), then draw ``num_draws`` states.

    Stan's windowed adaptation, as ``tfp.experimental.mcmc.windowed_adaptive_nuts`` does it:
    ``tfp.mcmc.DualAveragingStepSizeAdaptation`` of one step size for all chains throughout,
    restarted at each window; after each slow window (see :func:`_adaptation_windows`) the
    variance of that window's draws (pooled over chains, shrunk towards 1e-3 as Stan does)
    becomes the inverse mass matrix: ``momentum_distribution =
    tfd.MultivariateNormalDiag(scale_diag=variance ** -0.5)``.  One compiled step function
    serves every window and the draws (a diagonal mass matrix is a step-size input of the
    program).

    Args:
      num_draws: states kept after the warm-up.
      target_log_prob_fn, initial_state: as for :class:`NoUTurnSampler` (``initial_state``:
        a tensor or a list of parts ``[chains, *event]``).
      num_adaptation_steps: warm-up steps (Stan's default is 1000).
      step_size: the initial step size.
      target_accept_prob: dual averaging's target mean acceptance probability.
      seed: a stateless seed.
      jit_compile: compile the step with XLA (else a plain ``tf.function``).
      **kernel_kwargs: other :class:`NoUTurnSampler` arguments (``max_tree_depth``, ...).

    Returns:
      ``(draws, kernel)``: the draws (each part ``[num_draws, chains, *event]``, in the
      structure of ``initial_state``) and the tuned kernel (its ``step_size`` and
      ``momentum_distribution``) to go on sampling with.

    Example::

        # docs/nuts.md runs a longer one (compiling takes a while)
        sd = tf.constant([0.1, 1.0, 10.0])
        draws, kernel = windowed_adaptive_nuts(
            5, lambda x: -0.5 * tf.reduce_sum((x / sd) ** 2, -1), tf.ones([4, 3]),
            num_adaptation_steps=20, seed=(1, 2), max_tree_depth=5)
        draws.shape    # [5, 4, 3]
    """
    tfd = tfp.distributions
    parts = NoUTurnSampler._parts(initial_state)
    logp = target_log_prob_fn(*parts)
    spec = _StateSpec(parts, _batch_ndims(logp, parts))
    base = NoUTurnSampler(target_log_prob_fn, step_size, **kernel_kwargs)

    def kernel(step, scale):
        if len(parts) == 1:
            md = tfd.MultivariateNormalDiag(scale_diag=scale)
        else:   # one diagonal per part, in state order
            md = tfd.JointDistributionSequential(
                [tfd.MultivariateNormalDiag(scale_diag=s) for s in tf.split(scale, spec.sizes)])
        return base.copy(step_size=step, momentum_distribution=md)

    def adaptive(step, scale):
        return tfp.mcmc.DualAveragingStepSizeAdaptation(
            kernel(step, scale), num_adaptation_steps=1, target_accept_prob=target_accept_prob)

    @tf.function(jit_compile=jit_compile, autograph=False)
    def one_step(state, results, scale, step_seed):
        # dual averaging reads the number of adaptation steps from its results
        return adaptive(results.new_step_size, scale).one_step(state, results, seed=step_seed)

    def restart(state, step, scale, num_steps):
        results = adaptive(step, scale).bootstrap_results(state)
        return results._replace(num_adaptation_steps=tf.constant(num_steps, tf.int32))

    state = list(parts)
    step = tf.convert_to_tensor(step_size, spec.dtype)
    scale = tf.ones([spec.dim], spec.dtype)
    seeds = samplers.split_seed(samplers.sanitize_seed(seed), num_adaptation_steps + num_draws)
    seeds = tf.unstack(seeds) if num_adaptation_steps + num_draws else []
    draws, i = [], 0
    # -1 adaptation steps: dual averaging keeps the step size (the draws)
    windows = _adaptation_windows(num_adaptation_steps) + [(num_draws, None)]
    for length, slow in windows:
        results, kept = restart(state, step, scale, -1 if slow is None else length), []
        for _ in range(length):
            state, results = one_step(state, results, scale, seeds[i])
            kept.append(spec.flatten(state))
            i += 1
        if slow is None:
            draws = kept
        else:
            step = tf.exp(tf.reshape(results.log_averaging_step, tf.shape(step)))
        if slow:
            n = float(length * spec.chains)
            variance = tf.math.reduce_variance(tf.stack(kept), axis=[0, 1])
            variance = (n / (n + 5.0)) * variance + 1e-3 * (5.0 / (n + 5.0))
            scale = tf.math.rsqrt(variance)
    out = [tf.stack(d) for d in zip(*(spec.unflatten(q) for q in draws))] if draws else [
        tf.zeros([0, *p.shape], p.dtype) for p in parts]
    return tf.nest.pack_sequence_as(initial_state, out), kernel(step, scale)

# }}}
