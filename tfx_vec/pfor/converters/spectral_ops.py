"""Converters for the FFT family: batched kernels over the innermost one, two or three axes.

Every ``FFT``/``IFFT``/``RFFT``/``IRFFT`` kernel (1-D, 2-D, 3-D) transforms the innermost
axes of a tensor of any rank, so the iteration axis is one more leading batch axis: the op
runs once on ``[n, ...]``.  The ``fft_length`` of the real transforms must be the same in
every iteration (it sets the output shape).

Example:
    >>> import numpy as np, tensorflow as tf, tfx_vec
    >>> x = tf.complex(tf.random.normal([3, 8]), tf.random.normal([3, 8]))
    >>> y = tfx_vec.pfor(lambda i: tf.signal.fft(tf.gather(x, i)), 3, fallback_to_while_loop=False)
    >>> bool(np.allclose(y.numpy(), np.fft.fft(x.numpy()), atol=1e-4))
    True
"""
from __future__ import annotations

from tfx_vec.pfor.converters._helpers import reemit_stacked
from tfx_vec.pfor.registry import ConversionInput, register_converter

__all__: list[str] = []


@register_converter("FFT", "FFT2D", "FFT3D", "IFFT", "IFFT2D", "IFFT3D")
def _fft(x: ConversionInput):
    return reemit_stacked(x, [x.input(0).t])


@register_converter("RFFT", "RFFT2D", "RFFT3D", "IRFFT", "IRFFT2D", "IRFFT3D")
def _real_fft(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    return reemit_stacked(x, [x.input(0).t, x.input(1).t])
