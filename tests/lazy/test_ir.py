"""The IR: golden text, canonical keys (structure, not data), content hashes."""
import numpy as np
import tensorflow as tf

from tfx_vec import lazy
from tfx_vec.lazy import ir


def _x_mul_y_plus_z(rng):
    x, y, z = (lazy.tensor(rng.normal(size=(2, 4)).astype(np.float32)) for _ in range(3))
    return x * y + z


def test_ir_text_matches_the_papers_figure_1_form():
    out = _x_mul_y_plus_z(np.random.default_rng(0))
    assert lazy.ir_text(out) == (
        "IR {\n"
        "  %0 = f32[2,4] data()\n"
        "  %1 = f32[2,4] data()\n"
        "  %2 = f32[2,4] math.multiply(%0, %1)\n"
        "  %3 = f32[2,4] data()\n"
        "  %4 = f32[2,4] math.add(%2, %3), ROOT=0\n"
        "}")


def test_ir_text_shows_scalars_attrs_and_baked_constants():
    x = lazy.tensor(np.ones([3, 2], np.float32))
    out = tf.reduce_sum(x * 0.5 + 1.0, axis=1)
    assert lazy.ir_text(out) == (
        "IR {\n"
        "  %0 = f32[3,2] data()\n"
        "  %1 = f32[] scalar(), value=0.5\n"
        "  %2 = f32[3,2] math.multiply(%0, %1)\n"
        "  %3 = f32[] const(), 1.0\n"
        "  %4 = f32[3,2] math.add(%2, %3)\n"
        "  %5 = f32[3] reduce_sum(%4), axis=1, ROOT=0\n"
        "}")


def test_same_structure_different_data_gives_equal_keys():
    rng = np.random.default_rng(1)
    a, b = _x_mul_y_plus_z(rng), _x_mul_y_plus_z(rng)
    ka, kb = ir.canonicalize([a._node]).key, ir.canonicalize([b._node]).key
    assert ka == kb and hash(ka) == hash(kb)
    assert a._node.key() == b._node.key()
    pa = ir.canonicalize([a._node])
    assert len(pa.data) == 3 and not pa.scalars and not pa.variables


def test_shape_dtype_and_attrs_change_the_key():
    x = lazy.tensor(np.ones([2, 3], np.float32))
    y = lazy.tensor(np.ones([3, 2], np.float32))
    z = lazy.tensor(np.ones([2, 3], np.float64))
    keys = {ir.canonicalize([t._node]).key for t in (
        tf.reduce_sum(x, 0), tf.reduce_sum(x, 1), tf.reduce_sum(y, 0), tf.reduce_sum(z, 0))}
    assert len(keys) == 4


def test_scalars_are_parameters_but_zero_and_one_are_baked():
    x = lazy.tensor(np.ones([2], np.float32))
    k1 = ir.canonicalize([(x * 0.1)._node])
    k2 = ir.canonicalize([(x * 0.2)._node])
    assert k1.key == k2.key and k1.scalars == [0.1] and k2.scalars == [0.2]
    b1 = ir.canonicalize([(x * 1.0)._node]).key
    b0 = ir.canonicalize([(x * 0.0)._node]).key
    assert b1 != b0 and b1 != k1.key


def test_long_graphs_canonicalize_without_recursion():
    x = lazy.tensor(np.ones([2], np.float32))
    for _ in range(3000):
        x = x + 2.0
    prog = ir.canonicalize([x._node])
    assert len(prog.key[0]) == 6001
    del x, prog  # nothing live: the next barrier has nothing to compile
