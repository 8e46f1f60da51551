"""A graph or SavedModel never runs a shell command or code of its own choosing.

Crafted ``TcKernel`` nodes (GraphDefs run in a Session, and SavedModels) carry what an attacker
would try: shell commands in a compiler attribute, C with a constructor function, path traversal
in a hash or entry name, a TC replaced by C, absurd shapes, options and scalars, mismatched
dtypes.  Each gets a clear error and nothing executes: every attack would create a marker file,
and none appears.  A legitimate SavedModel reloads in a fresh process, with an empty cache and
another user key (another machine), and runs at batch sizes it never saw."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tests.support import require
from tfx_vec.tc_ops import op_builder, tf_op

SAXPY = """def saxpy(float(N) X, float(N) Y, float s) -> (O) {
    O(i) = s * X(i) + Y(i)
}"""
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
WINDOW = "def window(float(N) X, int32 k) -> (O) { O(i) = X(i) * 2 where i in 0:k }"


def _constructor_c(marker) -> str:
    return textwrap.dedent(f"""\
        #include <stdlib.h>
        __attribute__((constructor)) static void planted(void) {{ system("touch {marker}"); }}
        void tc_saxpy(void* const* a) {{}}
        """)


def _saxpy_graph() -> tf.compat.v1.GraphDef:
    """A legitimate graph: O = s * X + Y on X, Y of 5 floats."""
    tf_op.load_op_library()
    f = tf.function(lambda x, y: tf_op.kernel_op([x, y, tf.constant(2.0)], tc=SAXPY,
                                                  entry="saxpy")[0])
    return f.get_concrete_function(tf.TensorSpec([5]), tf.TensorSpec([5])).graph.as_graph_def()


def _run(graph_def, feed=None):
    """Import ``graph_def`` and run the TcKernel node's output in a TF1 Session."""
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        (node,) = [op for op in g.get_operations() if op.type == "TcKernel"]
        ins = [op.outputs[0] for op in g.get_operations() if op.type == "Placeholder"]
        with tf.compat.v1.Session(graph=g) as sess:
            return sess.run(node.outputs[0], dict(zip(ins, feed or [])))


def _feed():
    return [np.arange(5, dtype=np.float32), np.ones(5, np.float32)]


def _edit(graph_def, **attrs):
    """The graph with the TcKernel node's attributes changed (bytes, ints, shapes or a callback
    taking the AttrValue)."""
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(graph_def)
    (node,) = [n for n in gd.node if n.op == "TcKernel"]
    for name, value in attrs.items():
        if callable(value):
            value(node.attr[name])
        else:
            node.attr[name].s = value.encode()
    return gd


def test_the_legitimate_graph_runs():
    np.testing.assert_allclose(_run(_saxpy_graph(), _feed()), 2 * np.arange(5) + 1)


def _fill(value, marker):
    """``{m}`` -> the marker's path, ``{c}`` -> C source whose constructor would create it,
    ``{#c}`` -> the same C as TC comments."""
    if not isinstance(value, str):
        return value
    c = _constructor_c(marker)
    commented = "".join(f"# {line}\n" for line in c.splitlines())
    return value.replace("{m}", str(marker)).replace("{c}", c).replace("{#c}", commented)


# What the op once carried: C source, its hash, a compiler and its flags.
OLD_STYLE = [
    ("shell in a compiler attribute", {"compiler": "touch {m}; cc", "source": "",
                                       "source_hash": "k0", "compile_flags": "-shared"}),
    ("shell in compile flags", {"compile_flags": "-shared; touch {m}", "source": "",
                                "source_hash": "k0", "compiler": "cc"}),
    ("C with a constructor", {"source": "{c}", "source_hash": "k1", "compiler": "cc",
                              "compile_flags": "-shared -fPIC"}),
    ("path traversal in the hash", {"source": "{c}", "source_hash": "../../../../tmp/evil",
                                    "compiler": "cc", "compile_flags": "-shared -fPIC"}),
]


@pytest.mark.parametrize("attack", OLD_STYLE, ids=[a[0] for a in OLD_STYLE])
def test_code_carrying_attributes_are_not_part_of_the_op(attack, tmp_path):
    """A node carrying C, a hash and a compiler command line instead of a TC does not even
    import (the op has no such attributes and needs its TC); added to a node that has its TC,
    they are ignored: the node computes its TC and nothing else runs."""
    marker = tmp_path / "marker"
    attrs = {k: _fill(v, marker) for k, v in attack[1].items()}
    old = _edit(_saxpy_graph(), **attrs)
    (node,) = [n for n in old.node if n.op == "TcKernel"]
    del node.attr["tc"], node.attr["options"]
    with pytest.raises(ValueError, match="NodeDef missing attrs 'tc', 'options' from "
                                         "Op<name=TcKernel"):
        _run(old, _feed())
    np.testing.assert_allclose(_run(_edit(_saxpy_graph(), **attrs), _feed()),
                               2 * np.arange(5) + 1)
    assert not marker.exists()


def _options(text):
    return lambda v: setattr(v, "s", text.encode())


def _shapes(*shapes):
    def set_(v):
        v.list.Clear()
        for s in shapes:
            v.list.shape.add().CopyFrom(tf.TensorShape(s).as_proto())
    return set_


CRAFTED = [
    ("the TC replaced by C with a constructor", {"tc": "{c}"}, tf.errors.InvalidArgumentError,
     "TcKernel tc_saxpy: TcSyntaxError"),
    ("a C constructor inside TC comments", {"tc": "{#c}" + SAXPY}, None, None),
    ("path traversal in the entry", {"entry": "../../../../tmp/evil"},
     tf.errors.InvalidArgumentError, "TcNameError: TC entry name .* is not an identifier"),
    ("shell in the entry", {"entry": "saxpy; touch {m}"}, tf.errors.InvalidArgumentError,
     "TcNameError"),
    ("an entry the TC does not define", {"entry": "system"}, tf.errors.InvalidArgumentError,
     "the TC has no def 'system'"),
    ("shell in the options", {"options": '{"tile": ["$(touch {m})"]}'},
     tf.errors.InvalidArgumentError, "TcOptionsError: MappingOptions.tile"),
    ("options that are not JSON", {"options": "$(touch {m})"}, tf.errors.InvalidArgumentError,
     "TcOptionsError: MappingOptions.from_json: not JSON"),
    ("an absurd tile size", {"options": '{"tile": [1099511627776]}'},
     tf.errors.InvalidArgumentError, "TcOptionsError: saxpy: mapping options .* hold a size"),
    ("an absurd declared output shape", {"output_shapes": _shapes([2 ** 40])},
     tf.errors.InvalidArgumentError, r"output 0 has shape \[5\] for these inputs, but the graph "
                                     r"declares \[1099511627776\]"),
    ("a declared input shape the inputs do not have", {"input_shapes": _shapes([3], [3], [])},
     tf.errors.InvalidArgumentError, r"has shape \[\d\].* but the graph declares \[\d\]"),
    ("a TC producing an absurd tensor", {"tc": "def saxpy(float(N) X, float(N) Y, float s) -> "
                                               "(O) { O(i, j) = X(i) where j in 0:1000000000 }",
                                         "output_shapes": _shapes([5, None])},
     tf.errors.InvalidArgumentError, "TcShapeError: saxpy: tensor O of shape .* has 5000000000 "
                                     "elements"),
    ("a huge TC text", {"tc": "#" + "x" * (1 << 21) + "\n" + SAXPY},
     tf.errors.InvalidArgumentError, "TcShapeError: TC source of 2097.* characters"),
    ("scalars for a TC without any", {"scalars": '{"k": 1}'}, tf.errors.InvalidArgumentError,
     r"the op's scalars attribute .* must give an int .* for exactly \[\]"),
]


@pytest.mark.parametrize("attack", CRAFTED, ids=[a[0] for a in CRAFTED])
def test_crafted_tc_attributes_get_a_clear_error_and_run_nothing(attack, tmp_path):
    name, attrs, error, message = attack
    marker = tmp_path / "marker"
    graph = _edit(_saxpy_graph(), **{k: _fill(v, marker) for k, v in attrs.items()})
    if error is None:     # harmless: comments never reach the generated code
        np.testing.assert_allclose(_run(graph, _feed()), 2 * np.arange(5) + 1)
    else:
        with pytest.raises(error, match=message):
            _run(graph, _feed())
    assert not marker.exists()


def test_dtypes_the_tc_does_not_declare_are_refused():
    """Buffers of another element type than the TC's would be read or written out of bounds."""
    lib = tf_op.load_op_library()
    x = tf.ones([5])
    args = dict(tc=SAXPY, entry="saxpy", options="", input_shapes=[(5,), (5,), ()],
                output_shapes=[(5,)])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"TcShapeError: saxpy returns \['float'\]; the op declares "
                             r"\['double'\]"):
        lib.tc_kernel(inputs=[x, x, tf.constant(1.0)], Tout=[tf.float64], **args)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="input Y is declared float but the op passes double"):
        lib.tc_kernel(inputs=[x, tf.ones([5], tf.float64), tf.constant(1.0)],
                      Tout=[tf.float32], **args)


def test_a_scalar_the_kernel_was_specialised_to_is_checked_every_run():
    """``k`` bounds the loop; a graph feeding another value than its ``scalars`` attribute
    gets an error, not a kernel running with bounds proven for another value."""
    lib = tf_op.load_op_library()
    x = tf.range(8, dtype=tf.float32)
    out = tf_op.kernel_op([x, tf.constant(3)], tc=WINDOW, entry="window")[0]
    np.testing.assert_array_equal(out.numpy(), [0, 2, 4])
    args = dict(Tout=[tf.float32], tc=WINDOW, entry="window", options="",
                input_shapes=[(8,), ()], output_shapes=[(3,)], scalars='{"k": 3}')
    with pytest.raises(tf.errors.InvalidArgumentError, match="specialised to the value 3"):
        lib.tc_kernel(inputs=[x, tf.constant(7)], **args)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalars attribute"):
        lib.tc_kernel(inputs=[x, tf.constant(7)], **{**args, "scalars": '{"k": 1e30}'})


def _saved_model(tmp_path) -> str:
    """A legitimate SavedModel: a TC op on an unknown batch, with its gradient."""
    f = tf_op.tc_function("def tmm(float(M,K) A, float(N,K) B) -> (C) "
                          "{ C(m,n) +=! A(m,kk) * B(n,kk) }", "tmm")

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([4, 3])])
        def value_and_grad(self, a, b):
            with tf.GradientTape() as tape:
                tape.watch(a)
                c = f(a, b)
                loss = tf.reduce_sum(c * c)
            return c, tape.gradient(loss, a)

        @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([4, 3])])
        def forward(self, a, b):
            return f(a, b)

    path = str(tmp_path / "model")
    tf.saved_model.save(M(), path)
    return path


def _edit_saved_model(path: str, **attrs) -> None:
    pb = os.path.join(path, "saved_model.pb")
    with open(pb, "rb") as f:
        model = saved_model_pb2.SavedModel.FromString(f.read())
    nodes = [n for mg in model.meta_graphs for fd in mg.graph_def.library.function
             for n in fd.node_def if n.op == "TcKernel"]
    assert nodes
    for n in nodes:
        for name, value in attrs.items():
            n.attr[name].s = value.encode()
    with open(pb, "wb") as f:
        f.write(model.SerializeToString())


SAVED_MODEL_ATTACKS = [
    ("a compiler attribute", {"compiler": "touch {m}; cc", "source": "{c}"}, None),
    ("the TC replaced by C", {"tc": "{c}"}, "TcSyntaxError"),
    ("path traversal in the entry", {"entry": "../../{m}"}, "TcNameError"),
    ("shell in the options", {"options": "$(touch {m})"}, "TcOptionsError"),
]


@pytest.mark.parametrize("attack", SAVED_MODEL_ATTACKS, ids=[a[0] for a in SAVED_MODEL_ATTACKS])
def test_a_crafted_saved_model_gets_a_clear_error_and_runs_nothing(attack, tmp_path):
    _, attrs, message = attack
    marker = tmp_path / "marker"
    path = _saved_model(tmp_path)
    _edit_saved_model(path, **{k: _fill(v, marker) for k, v in attrs.items()})
    a, b = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    loaded = tf_op.load_saved_model(path)
    if message is None:         # attributes the op does not have change nothing
        np.testing.assert_allclose(loaded.value_and_grad(a, b)[0].numpy(), a @ b.T)
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            loaded.value_and_grad(a, b)
    assert not marker.exists()


def _python(tmp_path, script: str, **env) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh Python with its own HOME (and the test's PYTHONPATH)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if k not in ("TFX_VEC_TC_CACHE_DIR",
                                                             "XDG_CACHE_HOME")}
    full.update(HOME=str(home), TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=full,
                          capture_output=True, text=True, timeout=600)


def test_a_saved_model_reloads_in_a_fresh_process_with_an_empty_cache(tmp_path):
    """Another machine: an empty cache, another user key, nothing of this process. The op
    library and every kernel are built there from the model's TCs, at batch sizes the model
    never ran with, and every cache lands under $TFX_VEC_CACHE_DIR."""
    path = _saved_model(tmp_path)
    cache = tmp_path / "fresh_cache"
    proc = _python(tmp_path, f"""
        import numpy as np, tensorflow as tf
        from tfx_vec.tc_ops import tf_op
        m = tf_op.load_saved_model({path!r})
        rng = np.random.default_rng(0)
        b = rng.standard_normal((4, 3)).astype(np.float32)
        for n in (1, 6, 33):
            a = rng.standard_normal((n, 3)).astype(np.float32)
            c, da = m.value_and_grad(a, b)
            np.testing.assert_allclose(c.numpy(), a @ b.T, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(da.numpy(), 2 * (a @ b.T) @ b, rtol=1e-4, atol=1e-4)
        a = tf.constant(a)
        with tf.GradientTape() as tape:     # differentiated after the reload, in this process
            tape.watch(a)
            loss = tf.reduce_sum(m.forward(a, b) ** 2)
        np.testing.assert_allclose(tape.gradient(loss, a).numpy(), 2 * (a.numpy() @ b.T) @ b,
                                   rtol=1e-4, atol=1e-4)
        print("reloaded-ok")
        """, TFX_VEC_CACHE_DIR=str(cache), TFX_VEC_KEY_FILE=str(tmp_path / "other_key"))
    assert proc.returncode == 0 and "reloaded-ok" in proc.stdout, proc.stderr[-3000:]
    assert sorted(p.name for p in cache.iterdir()) == ["kernels", "ops", "tmp"]
    kernels = sorted(p.name for p in (cache / "kernels").glob("*.so"))
    assert len(kernels) == 6, kernels          # forward and backward at three batch sizes (the
    # tape's gradient at 33 reuses them)
    assert not (tmp_path / "home" / ".cache" / "tfx_vec").exists()


def test_an_op_library_loaded_behind_our_back_builds_nothing(tmp_path):
    """Loaded with plain tf.load_op_library, no builder is registered: the op says how to load
    it, and never compiles anything itself."""
    tf_op.load_op_library()
    library = tf_op._op_library("tc_kernel_op", tf_op._OP_SOURCE).path
    proc = _python(tmp_path, f"""
        import shutil, tempfile, tensorflow as tf
        copy = tempfile.mkdtemp() + "/lib.so"
        shutil.copy({str(library)!r}, copy)
        lib = tf.load_op_library(copy)
        try:
            lib.tc_kernel(inputs=[tf.ones([3])], Tout=[tf.float32], options="",
                          tc="def f(float(N) X) -> (Y) {{ Y(i) = X(i) }}", entry="f",
                          input_shapes=[(3,)], output_shapes=[(3,)])
        except tf.errors.FailedPreconditionError as e:
            print(e.message)
        """)
    assert "no TC kernel builder is registered in this process: load the op library with " \
           "tfx_vec.tc_ops.tf_op.load_op_library()" in proc.stdout, proc.stderr[-3000:]


def test_builder_requests_are_decoded_from_the_node_alone():
    """What the builder sees is the node's attributes and the run's shapes: nothing else."""
    gd = _saxpy_graph()
    (node,) = [n for n in gd.node if n.op == "TcKernel"]
    req = op_builder.request_for(node, [(5,), (5,), ()])
    assert req == op_builder.OpRequest("TcKernel", SAXPY, "saxpy", "", "{}",
                                       ("float", "float", "float"), ("float",),
                                       ((5,), (5,), ()))


# -- the GPU op: PTX from attributes is code too ------------------------------------------------
def _cuda_node(**attrs) -> "tf.compat.v1.NodeDef":
    """A TcCudaKernel NodeDef for tmm on (4, 3) x (5, 3), with ``attrs`` overriding."""
    node = tf.compat.v1.NodeDef(op="TcCudaKernel", name="crafted")
    node.attr["Tin"].list.type.extend([tf.float32.as_datatype_enum] * 2)
    node.attr["Tout"].list.type.append(tf.float32.as_datatype_enum)
    for name, value in {**dict(tc=TMM, entry="tmm", options="", scalars="{}", derivative="",
                               cuda_arch="compute_75"), **attrs}.items():
        node.attr[name].s = value.encode()
    node.attr["_concrete_input_shapes"].list.shape.extend(
        tf.TensorShape(s).as_proto() for s in [(4, 3), (5, 3)])
    return node


def test_a_crafted_gpu_op_request_gets_a_clear_error_and_runs_nothing(tmp_path):
    """What the GPU op asks the builder (it runs only on a GPU; the request is the same here):
    code, shell commands and traversal in its attributes are refused before nvcc runs."""
    marker = tmp_path / "marker"
    cases = [({"tc": _fill("{c}", marker)}, "TcSyntaxError"),
             ({"cuda_arch": f"compute_75 -Xcompiler -DX=$(touch {marker})"},
              "cuda_arch .* is not a GPU architecture"),
             ({"entry": "../../x"}, "TcNameError"),
             ({"options": '{"map_to_threads": [4096, 4096]}'}, "TcOptionsError")]
    for attrs, message in cases:
        reply = tf.compat.v1.NodeDef.FromString(
            op_builder.serve(_cuda_node(**attrs).SerializeToString()))
        error = reply.attr["error"].s.decode()
        assert re.search(message, error) and error.startswith("TcCudaKernel tc_"), error
    assert not marker.exists()


def test_the_gpu_op_carries_no_ptx():
    """A node in the old format (PTX, kernel names, launch sizes; no TC) does not import."""
    require(tf_op.cuda_include_dir() is not None, "CUDA's cuda.h (a CUDA toolkit)")
    tf_op.load_cuda_op_library()
    node = _cuda_node()
    for name in ("tc", "options"):
        del node.attr[name]
    node.attr["module"].s = b".version 8.0\n.target sm_75\n"
    node.attr["input_shapes"].list.shape.extend(tf.TensorShape(s).as_proto()
                                                for s in [(4, 3), (5, 3)])
    node.attr["output_shapes"].list.shape.add().CopyFrom(tf.TensorShape((4, 5)).as_proto())
    node.input.extend(["a", "b"])
    graph = tf.compat.v1.GraphDef()
    for name in "ab":
        graph.node.add(name=name, op="Placeholder").attr["dtype"].type = \
            tf.float32.as_datatype_enum
    graph.node.append(node)
    with tf.Graph().as_default(), pytest.raises(ValueError, match="NodeDef missing attrs 'tc', "
                                                                  "'options' from Op<name="
                                                                  "TcCudaKernel"):
        tf.graph_util.import_graph_def(graph, name="")
