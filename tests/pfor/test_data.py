"""tfx_vec.pfor.data.map_and_batch against ``dataset.map(fn).batch(n)``, element by element."""
import numpy as np
import pytest
import tensorflow as tf

from tfx_vec.pfor.data import map_and_batch
from tests.support import random_array

RNG = np.random.default_rng(5)
IMAGES = random_array(RNG, [11, 4, 3], np.float32)
LABELS = RNG.integers(0, 5, size=[11]).astype(np.int32)


def _assert_same_datasets(a: tf.data.Dataset, b: tf.data.Dataset) -> int:
    count = 0
    for x, y in zip(a, b, strict=True):
        tf.nest.assert_same_structure(x, y)
        for u, v in zip(tf.nest.flatten(x), tf.nest.flatten(y)):
            assert u.dtype == v.dtype and u.shape == v.shape, (u, v)
            np.testing.assert_allclose(u.numpy(), v.numpy(), rtol=1e-5, atol=1e-6)
        count += 1
    return count


def _features(image, label):
    centred = image - tf.reduce_mean(image)
    return {"x": tf.nn.relu(centred) * 2.0, "norm": tf.norm(image),
            "y": tf.one_hot(label, 5)}, label + 1


@pytest.mark.parametrize("batch,drop", [(4, False), (4, True), (11, False), (20, False)])
def test_tuple_elements_nested_outputs_and_partial_batch(batch, drop):
    ds = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS))
    expected = ds.map(_features).batch(batch, drop_remainder=drop)
    actual = ds.apply(map_and_batch(_features, batch, drop_remainder=drop,
                                    fallback_to_while_loop=False))
    n = _assert_same_datasets(actual, expected)
    assert n == (11 // batch if drop else -(-11 // batch))


def test_single_tensor_elements_with_control_flow():
    ds = tf.data.Dataset.from_tensor_slices(IMAGES)

    def fn(image):
        return tf.cond(tf.reduce_sum(image) > 0.0, lambda: image * 3.0, lambda: -image)
    _assert_same_datasets(ds.apply(map_and_batch(fn, 3)), ds.map(fn).batch(3))


def test_dict_elements_are_passed_whole():
    ds = tf.data.Dataset.from_tensor_slices({"a": IMAGES, "b": LABELS})

    def fn(d):
        return d["a"] * tf.cast(d["b"], tf.float32)
    _assert_same_datasets(ds.apply(map_and_batch(fn, 5)), ds.map(fn).batch(5))


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        map_and_batch(lambda x: x, 0)
