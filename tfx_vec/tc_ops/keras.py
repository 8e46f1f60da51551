"""Keras (3) layers built from Tensor Comprehensions.

:class:`TcLayer` wraps any TC def: parameters named in ``weights`` become trainable weights, the
others are the layer's inputs, in signature order.  A weight's shape lists ints or size names of
the TC signature, bound from the inputs' shapes when the layer is built.  The forward pass is
a TF op (``tf_op.TcFunction``): ``TcKernel`` with ``backend="cpu"`` (the default), or
``TcCudaKernel`` on a GPU with ``backend="cuda"``; the backward pass is a derived backward TC on
the same backend, so a model trains with ``fit()``.  Layers serialise with ``get_config``
(``backend`` included) and are registered for ``keras.models.load_model``.

Ready layers: :class:`FusedMLP` (fcrelu chain, paper §7), :class:`GroupedConv` (the grouped
convolution of appendix A.4.3) and :class:`EmbeddingBag` (the paper's LUT).

Dimensions unknown when Keras traces (the batch) are fine: the op makes and caches a kernel per
concrete size on first use, so ``fit`` with a partial last batch and ``predict`` on any batch
size work, and a reloaded ``.keras`` model rebuilds its kernels from the TC in its config.

Example::

    import keras, numpy as np
    from tfx_vec.tc_ops.keras import FusedMLP
    model = keras.Sequential([keras.Input((8,), batch_size=16), FusedMLP([32, 4])])
    model.compile("adam", "mse")
    model.fit(np.random.rand(64, 8), np.random.rand(64, 4), batch_size=16, epochs=2)
    gpu = FusedMLP([32, 4], backend="cuda")   # the same layer as TcCudaKernel ops (GPU only)
"""
from __future__ import annotations

from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from .op_builder import output_specs
from .options import MappingOptions
from .tf_op import TcFunction

__all__ = ["TcLayer", "FusedMLP", "GroupedConv", "EmbeddingBag"]


@keras.saving.register_keras_serializable(package="tfx_vec")
class TcLayer(keras.layers.Layer):
    """A layer computing TC ``entry`` of ``source``; see the module docstring.

    Args:
      weights: {parameter name: shape}, shape entries ints or signature size names.
      initializers: {parameter name: Keras initializer name/config} (default glorot_uniform for
        rank >= 2, zeros for rank 1).
      output: which TC output the layer returns (index), or None for all of them.
      options: MappingOptions of the generated kernel (default: per the TC).
      backend: "cpu" (the ``TcKernel`` op) or "cuda" (the ``TcCudaKernel`` op: the layer runs
        on a GPU only, and raises ``TcBackendError`` where TensorFlow sees none).
    """

    def __init__(self, source: str, entry: str, weights: dict | None = None,
                 initializers: dict | None = None, output: int | None = 0,
                 options: MappingOptions | dict | None = None, backend: str = "cpu",
                 **kwargs: Any):
        super().__init__(**kwargs)
        if isinstance(options, dict):
            options = MappingOptions.from_dict(options)
        self.source, self.entry, self.output_index = source, entry, output
        self.weight_shapes = {k: tuple(v) for k, v in (weights or {}).items()}
        self.initializer_specs = dict(initializers or {})
        self.options, self.backend = options, backend
        weight_names = tuple(self.weight_shapes)
        self.fn = TcFunction(source, entry, options=options, backend=backend)
        params = self.fn.cdef.inputs
        unknown = set(weight_names) - {p.name for p in params}
        if unknown:
            raise ValueError(f"TcLayer {entry}: weights {sorted(unknown)} are not parameters of "
                             f"the TC (parameters: {[p.name for p in params]})")
        self.input_names = tuple(p.name for p in params if p.name not in weight_names)
        self.tc_weights: dict[str, Any] = {}

    def _bind_sizes(self, shapes: Sequence[Sequence[int | None]]) -> dict[str, int | None]:
        sizes: dict[str, int | None] = {}
        params = {p.name: p for p in self.fn.cdef.inputs}
        for name, shape in zip(self.input_names, shapes):
            dims = params[name].dims or ()
            for d, n in zip(dims, shape):
                if isinstance(d, str):
                    sizes[d] = n
        return sizes

    @staticmethod
    def _as_list(x: Any) -> list:
        return list(x) if isinstance(x, (list, tuple)) else [x]

    def build(self, input_shape: Any) -> None:
        shapes = input_shape if isinstance(input_shape, (list, tuple)) and input_shape and \
            isinstance(input_shape[0], (list, tuple)) else [input_shape]
        sizes = self._bind_sizes(shapes)
        params = {p.name: p for p in self.fn.cdef.inputs}
        for name, shape in self.weight_shapes.items():
            concrete = []
            for d in shape:
                if isinstance(d, str):
                    if sizes.get(d) is None:
                        raise ValueError(f"TcLayer {self.entry}: weight {name} uses size {d!r}, "
                                         "which no input dimension of known size binds")
                    d = sizes[d]
                concrete.append(int(d))
            init = self.initializer_specs.get(
                name, "glorot_uniform" if len(concrete) >= 2 else "zeros")
            self.tc_weights[name] = self.add_weight(
                name=name, shape=tuple(concrete), initializer=init, trainable=True,
                dtype=str(np.dtype(_np_dtype(params[name].dtype))))
        super().build(input_shape)

    def _args(self, inputs: list) -> list:
        it = iter(inputs)
        out = []
        for p in self.fn.cdef.inputs:
            if p.name in self.tc_weights:
                out.append(tf.convert_to_tensor(self.tc_weights[p.name]))
            else:
                out.append(tf.convert_to_tensor(next(it)))
        return out

    def call(self, inputs: Any) -> Any:
        outs = self.fn(*self._args(self._as_list(inputs)))
        outs = outs if isinstance(outs, tuple) else (outs,)
        return outs if self.output_index is None else outs[self.output_index]

    def compute_output_spec(self, inputs: Any) -> Any:
        """Output shapes from range inference (as the op computes them); unknown (batch) sizes
        stay unknown."""
        shapes = dict(zip(self.input_names, (tuple(s.shape) for s in self._as_list(inputs))))
        shapes.update({n: tuple(w.shape) for n, w in self.tc_weights.items()})
        cdef = self.fn.cdef
        specs = output_specs(cdef, [shapes.get(p.name) for p in cdef.inputs], {})
        outs = [keras.KerasTensor(shape, dtype=str(np.dtype(_np_dtype(t)))) for shape, t in specs]
        return outs if self.output_index is None else outs[self.output_index]

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(source=self.source, entry=self.entry,
                      weights={k: list(v) for k, v in self.weight_shapes.items()},
                      initializers=self.initializer_specs, output=self.output_index,
                      options=None if self.options is None else self.options.to_dict(),
                      backend=self.backend)
        return config


def _np_dtype(t: str):
    from .lang.types import np_dtype
    return np_dtype(t)


def _mlp_source(n_layers: int) -> tuple[str, dict]:
    """A fused ``n_layers``-deep fcrelu chain (MLP3 of the paper, any depth)."""
    params, stmts, weights = ["float(B,D0) X"], [], {}
    prev = "X"
    for k in range(1, n_layers + 1):
        params += [f"float(D{k},D{k - 1}) W{k}", f"float(D{k}) b{k}"]
        out = f"H{k}"
        stmts += [f"{out}(b,o{k}) = b{k}(o{k})",
                  f"{out}(b,o{k}) += {prev}(b,i{k}) * W{k}(o{k},i{k})"]
        if k < n_layers:
            stmts.append(f"{out}(b,o{k}) = fmaxf({out}(b,o{k}), 0)")
        prev = out
    src = (f"def fused_mlp{n_layers}({', '.join(params)}) -> (H{n_layers}) {{\n    "
           + "\n    ".join(stmts) + "\n}")
    return src, weights


@keras.saving.register_keras_serializable(package="tfx_vec")
class FusedMLP(TcLayer):
    """Dense-ReLU layers fused in one TC (no activation after the last): ``units`` per layer."""

    def __init__(self, units: Sequence[int], **kwargs: Any):
        units = [int(u) for u in units]
        if not units or min(units) < 1:
            raise ValueError(f"FusedMLP: units must be positive ints, got {units}")
        source, _ = _mlp_source(len(units))
        weights = {}
        for k, u in enumerate(units, start=1):
            weights[f"W{k}"] = (u, "D0" if k == 1 else units[k - 2])
            weights[f"b{k}"] = (u,)
        for key in ("source", "entry", "weights"):
            kwargs.pop(key, None)
        super().__init__(source, f"fused_mlp{len(units)}", weights=weights, **kwargs)
        self.units = units

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("source", "entry", "weights"):
            config.pop(key)
        config["units"] = self.units
        return config


_GCONV = """def grouped_conv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1, float(G,F) B) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,c,h + kh,w + kw) * W1(g,f,c,kh,kw)
    O(n,g,f,h,w) = O(n,g,f,h,w) + B(g,f)
}"""


@keras.saving.register_keras_serializable(package="tfx_vec")
class GroupedConv(TcLayer):
    """Grouped 2-D convolution (valid padding) on inputs (N, groups, C, H, W)."""

    def __init__(self, filters_per_group: int, kernel_size: Sequence[int], **kwargs: Any):
        kh, kw = (int(k) for k in kernel_size)
        for key in ("source", "entry", "weights"):
            kwargs.pop(key, None)
        super().__init__(_GCONV, "grouped_conv",
                         weights={"W1": ("G", int(filters_per_group), "C", kh, kw),
                                  "B": ("G", int(filters_per_group))}, **kwargs)
        self.filters_per_group, self.kernel_size = int(filters_per_group), (kh, kw)

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("source", "entry", "weights"):
            config.pop(key)
        config.update(filters_per_group=self.filters_per_group, kernel_size=list(self.kernel_size))
        return config


_LUT = "def embedding_bag(float(E,D) LUT, int32(B,L) I) -> (O) { O(b,d) +=! LUT(I(b,l), d) }"


@keras.saving.register_keras_serializable(package="tfx_vec")
class EmbeddingBag(TcLayer):
    """Sum of the embeddings of each row's ids (the paper's LUT): (B, L) int32 -> (B, dim)."""

    def __init__(self, num_embeddings: int, dim: int, **kwargs: Any):
        for key in ("source", "entry", "weights"):
            kwargs.pop(key, None)
        kwargs.setdefault("initializers", {"LUT": "random_normal"})
        super().__init__(_LUT, "embedding_bag",
                         weights={"LUT": (int(num_embeddings), int(dim))}, **kwargs)
        self.num_embeddings, self.dim = int(num_embeddings), int(dim)

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("source", "entry", "weights"):
            config.pop(key)
        config.update(num_embeddings=self.num_embeddings, dim=self.dim)
        return config
