"""FFT-family converters: one batched kernel, against the per-iteration loop."""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec
from tests.pfor.oracle import check_op
from tests.support import random_array

R = np.random.default_rng(5)


def c(*shape):
    return (random_array(R, shape, np.float32) + 1j * random_array(R, shape, np.float32)
            ).astype(np.complex64)


COMPLEX = [("FFT", tf.signal.fft), ("FFT2D", tf.signal.fft2d), ("FFT3D", tf.signal.fft3d),
           ("IFFT", tf.signal.ifft), ("IFFT2D", tf.signal.ifft2d), ("IFFT3D", tf.signal.ifft3d)]
REAL = [("RFFT", lambda x: tf.signal.rfft(x, [6])), ("RFFT2D", tf.signal.rfft2d),
        ("RFFT3D", tf.signal.rfft3d)]
INVERSE = [("IRFFT", lambda x: tf.signal.irfft(x, [6])), ("IRFFT2D", tf.signal.irfft2d),
           ("IRFFT3D", tf.signal.irfft3d)]


@pytest.mark.parametrize("name,fn", COMPLEX, ids=[r[0] for r in COMPLEX])
def test_complex_transforms(name, fn):
    check_op(fn, [c(2, 3, 4, 4)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,fn", REAL + INVERSE, ids=[r[0] for r in REAL + INVERSE])
def test_real_transforms(name, fn):
    x = c(2, 3, 4, 4) if name.startswith("I") else random_array(R, (2, 3, 4, 4), np.float32)
    check_op(fn, [x], rtol=1e-4, atol=1e-4)


def test_no_loop_and_xla():
    x = tf.constant(c(4, 8))
    tfx_vec.reset_fallbacks()
    check_op(tf.signal.fft, [x.numpy()], combos=[(True,)], modes=("xla",), rtol=1e-4, atol=1e-4)
    assert dict(tfx_vec.fallback_report()) == {}


def test_loop_variant_fft_length_is_named():
    x = tf.constant(random_array(R, (3, 8), np.float32))
    with pytest.raises(tfx_vec.VectorizationError, match="loop invariant"):
        tfx_vec.pfor(lambda i: tf.signal.rfft(tf.gather(x, i), tf.reshape(i + 4, [1])), 2,
                     fallback_to_while_loop=False)
