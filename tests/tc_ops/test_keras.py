"""Keras 3 layers from TCs: forward vs NumPy, training with fit(), get_config, saving."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array
from tfx_vec.tc_ops.keras import EmbeddingBag, FusedMLP, GroupedConv, TcLayer

FCRELU = """def fcrelu(float(B,M) I, float(N,M) W, float(N) bias) -> (O) {
    O(b,n) = bias(n)
    O(b,n) += I(b,m) * W(n,m)
    O(b,n) = fmaxf(O(b,n), 0)
}"""


def _fit_lowers_loss(model, x, y, epochs=6):
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    first = model.evaluate(x, y, batch_size=8, verbose=0)
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False)
    last = model.evaluate(x, y, batch_size=8, verbose=0)
    assert last < first, (first, last)


def test_tc_layer_forward_matches_numpy_and_trains():
    rng = np.random.default_rng(0)
    layer = TcLayer(FCRELU, "fcrelu", weights={"W": (5, "M"), "bias": (5,)},
                    initializers={"bias": "ones"})
    x = random_array(rng, (8, 3))
    out = layer(x).numpy()
    W, b = layer.tc_weights["W"].numpy(), layer.tc_weights["bias"].numpy()
    np.testing.assert_allclose(out, np.maximum(x @ W.T + b, 0), rtol=1e-5, atol=1e-5)
    model = keras.Sequential([keras.Input((3,), batch_size=8), layer, keras.layers.Dense(2)])
    _fit_lowers_loss(model, random_array(rng, (32, 3)), random_array(rng, (32, 2)))


def test_fused_mlp_matches_dense_layers_and_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    mlp = FusedMLP([6, 3])
    x = random_array(rng, (8, 4))
    out = mlp(x).numpy()
    W1, b1, W2, b2 = (mlp.tc_weights[k].numpy() for k in ("W1", "b1", "W2", "b2"))
    np.testing.assert_allclose(out, np.maximum(x @ W1.T + b1, 0) @ W2.T + b2, rtol=1e-5,
                               atol=1e-5)
    clone = FusedMLP.from_config(mlp.get_config())
    assert clone.get_config() == mlp.get_config() and clone.units == [6, 3]

    model = keras.Sequential([keras.Input((4,), batch_size=8), FusedMLP([6, 3])])
    _fit_lowers_loss(model, random_array(rng, (32, 4)), random_array(rng, (32, 3)))
    path = str(tmp_path / "mlp.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    probe = random_array(rng, (8, 4))
    np.testing.assert_allclose(loaded.predict(probe, batch_size=8, verbose=0),
                               model.predict(probe, batch_size=8, verbose=0), rtol=1e-6)


def test_grouped_conv_matches_tf_and_trains():
    rng = np.random.default_rng(2)
    conv = GroupedConv(filters_per_group=2, kernel_size=(2, 2), initializers={"B": "ones"})
    x = random_array(rng, (4, 2, 3, 5, 5))  # N, G, C, H, W
    out = conv(x).numpy()
    W, B = conv.tc_weights["W1"].numpy(), conv.tc_weights["B"].numpy()
    ref = np.stack([
        tf.nn.conv2d(np.transpose(x[:, g], (0, 2, 3, 1)),
                     np.transpose(W[g], (2, 3, 1, 0)), 1, "VALID").numpy() for g in range(2)], 1)
    np.testing.assert_allclose(out, np.transpose(ref, (0, 1, 4, 2, 3)) + B[None, :, :, None, None],
                               rtol=1e-4, atol=1e-4)
    model = keras.Sequential([keras.Input((2, 3, 5, 5), batch_size=8), conv,
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    _fit_lowers_loss(model, random_array(rng, (16, 2, 3, 5, 5)), random_array(rng, (16, 1)),
                     epochs=4)


def test_embedding_bag_matches_gather_sum_and_trains():
    rng = np.random.default_rng(3)
    bag = EmbeddingBag(num_embeddings=10, dim=4)
    ids = rng.integers(0, 10, size=(8, 3)).astype(np.int32)
    out = bag(ids).numpy()
    np.testing.assert_allclose(out, bag.tc_weights["LUT"].numpy()[ids].sum(1), rtol=1e-5,
                               atol=1e-6)
    model = keras.Sequential([keras.Input((3,), batch_size=8, dtype="int32"), bag,
                              keras.layers.Dense(1)])
    _fit_lowers_loss(model, rng.integers(0, 10, size=(32, 3)).astype(np.int32),
                     random_array(rng, (32, 1)))


def test_bad_weight_name_is_a_clear_error():
    with pytest.raises(ValueError, match="not parameters of the TC"):
        TcLayer(FCRELU, "fcrelu", weights={"V": (5, 3)})
