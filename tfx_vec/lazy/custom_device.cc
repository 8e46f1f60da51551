// The native half of tfx_vec.lazy's custom device: a thin bridge from TensorFlow's eager C API
// (TFE_RegisterCustomDevice) to Python.  Every op TensorFlow places on the device reaches
// Execute(), which hands (op type, canonical attrs, inputs) to the Python recorder; the
// recorder answers with output specs (payload, dtype, dims) that become custom-device tensor
// handles carrying the payload, or with ordinary tensors.  Reading a value off the device
// (.numpy(), float(), a copy to the CPU) calls CopyFromDevice(), which asks Python to force
// the payload.  All policy lives in Python (custom_device.py); this file only moves handles.
//
// Also here: run_on_host (execute the op being recorded on a physical device, for host ops and
// folding), the Python-state check of recorded Keras calls (same_state) and two queries of
// TensorFlow's XLA op registry (which ops have XLA kernels, which inputs XLA needs as
// compile-time constants).

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tensorflow/c/eager/c_api.h"
#include "tensorflow/c/eager/c_api_experimental.h"

// Exported by TensorFlow's lib_pywrap_tensorflow_common.so (python/eager/pywrap_tensor.h).
TFE_TensorHandle* EagerTensor_Handle(const PyObject* o);
PyObject* EagerTensorFromHandle(TFE_TensorHandle* handle, const bool is_packed);
bool EagerTensor_CheckExact(const PyObject* o);

namespace tensorflow {
// Declared here rather than by including xla_op_registry.h (which pulls in most of XLA).
class XlaOpRegistry {
 public:
  static std::vector<std::string> GetAllRegisteredOps();
  static const std::unordered_set<std::string>* CompileTimeConstantInputArgNames(
      const std::string& op);
};
}  // namespace tensorflow

namespace {

bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

struct Device {
  std::string name;
  PyObject* execute;      // (op type, attrs bytes, inputs tuple, op capsule) -> output specs
  PyObject* to_device;    // (EagerTensor) -> spec
  PyObject* from_device;  // (payload) -> EagerTensor on the host
  std::unordered_map<std::string, PyObject*> op_names;  // interned op type strings
};

struct Payload {
  PyObject* obj;
  std::vector<int64_t> dims;
};

int NumDims(void* data, TF_Status*) {
  return static_cast<int>(static_cast<Payload*>(data)->dims.size());
}

int64_t Dim(void* data, int i, TF_Status*) { return static_cast<Payload*>(data)->dims[i]; }

void Deallocate(void* data) {
  Payload* p = static_cast<Payload*>(data);
  if (Py_IsInitialized() && !Finalizing()) {
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(p->obj);
    PyGILState_Release(g);
  }
  delete p;
}

// Leaves the Python exception set: TensorFlow's status-to-exception conversion keeps a pending
// Python error, so the user sees the recorder's own exception (LazyError, ValueError...).  The
// status carries its text too, for paths that do not.
void FailFromPython(TF_Status* s) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  std::string msg = "tfx_vec.lazy device callback failed";
  if (value != nullptr) {
    PyObject* text = PyObject_Str(value);
    if (text != nullptr) {
      const char* utf8 = PyUnicode_AsUTF8(text);
      if (utf8 != nullptr) msg = utf8;
      Py_DECREF(text);
    }
    PyErr_Clear();
  }
  PyErr_Restore(type, value, tb);
  TF_SetStatus(s, TF_INVALID_ARGUMENT, msg.c_str());
}

Payload* PayloadOf(const Device* dev, TFE_TensorHandle* h, TF_Status* s) {
  const char* dn = TFE_TensorHandleDeviceName(h, s);
  if (dn == nullptr || dev->name != dn) return nullptr;
  return static_cast<Payload*>(TFE_TensorHandleDevicePointer(h, s));
}

// An output spec from Python: an EagerTensor (returned as it is) or (payload, dtype, dims).
TFE_TensorHandle* FromSpec(TFE_Context* ctx, Device* dev, PyObject* spec, TF_Status* s) {
  if (EagerTensor_CheckExact(spec)) {
    return TFE_TensorHandleCopySharingTensor(EagerTensor_Handle(spec), s);
  }
  PyObject *obj, *dims;
  int dtype;
  if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "OiO", &obj, &dtype, &dims)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "bad output spec");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(dims, "dims must be a sequence");
  if (seq == nullptr) return nullptr;
  Payload* p = new Payload;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  p->dims.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    p->dims.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i)));
  }
  Py_DECREF(seq);
  Py_INCREF(obj);
  p->obj = obj;
  TFE_CustomDeviceTensorHandle methods;
  methods.num_dims = NumDims;
  methods.dim = Dim;
  methods.deallocator = Deallocate;
  methods.summarize = nullptr;
  return TFE_NewCustomDeviceTensorHandle(ctx, dev->name.c_str(), static_cast<TF_DataType>(dtype),
                                         p, methods, s);
}

// A Python view of an op input: the payload of one of our handles, else an EagerTensor.
PyObject* InputObject(const Device* dev, TFE_TensorHandle* h, TF_Status* s) {
  Payload* p = PayloadOf(dev, h, s);
  if (p != nullptr) {
    Py_INCREF(p->obj);
    return p->obj;
  }
  return EagerTensorFromHandle(TFE_TensorHandleCopySharingTensor(h, s), false);
}

// Reads a varint at *pos; false at a malformed buffer.
bool Varint(const unsigned char* data, size_t size, size_t* pos, uint64_t* out) {
  *out = 0;
  for (int shift = 0; shift < 64 && *pos < size; shift += 7) {
    unsigned char b = data[(*pos)++];
    *out |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// The op's attrs as a NameAttrList without its name and with its map entries sorted: protobuf
// serializes maps in no fixed order, and these bytes key the recorder's caches.
PyObject* CanonicalAttrs(const TFE_Op* op, TF_Status* s) {
  TF_Buffer* buf = TF_NewBuffer();
  TFE_OpAttrsSerialize(TFE_OpGetAttrs(op), buf, s);
  const unsigned char* data = static_cast<const unsigned char*>(buf->data);
  size_t size = buf->length, pos = 0;
  std::vector<std::string> entries;
  bool ok = TF_GetCode(s) == TF_OK;
  while (ok && pos < size) {
    size_t start = pos;
    uint64_t tag, len;
    ok = Varint(data, size, &pos, &tag) && (tag & 7) == 2 && Varint(data, size, &pos, &len) &&
         pos + len <= size;
    if (!ok) break;
    pos += len;
    if ((tag >> 3) == 2) entries.emplace_back(reinterpret_cast<const char*>(data + start),
                                              pos - start);
  }
  TF_DeleteBuffer(buf);
  if (!ok) {
    PyErr_SetString(PyExc_RuntimeError, "tfx_vec.lazy: unreadable op attributes");
    return nullptr;
  }
  std::sort(entries.begin(), entries.end());
  std::string joined;
  for (const std::string& e : entries) joined += e;
  return PyBytes_FromStringAndSize(joined.data(), joined.size());
}

// What Python may use during one Execute() call to run the very op on a physical device.
struct OpRef {
  const TFE_Op* op;
  int max_outputs;
};

const char kOpCapsule[] = "tfx_vec.lazy.op";

PyObject* OpName(Device* dev, const char* name) {
  auto it = dev->op_names.find(name);
  if (it != dev->op_names.end()) return it->second;
  PyObject* str = PyUnicode_InternFromString(name);
  dev->op_names.emplace(name, str);
  return str;
}

void Execute(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs, TF_Status* s,
             void* info) {
  Device* dev = static_cast<Device*>(info);
  PyGILState_STATE g = PyGILState_Ensure();
  const char* name = TFE_OpGetName(op, s);
  int n = TFE_OpGetFlatInputCount(op, s);
  PyObject* inputs = PyTuple_New(n);
  for (int i = 0; i < n; ++i) {
    PyTuple_SET_ITEM(inputs, i, InputObject(dev, TFE_OpGetFlatInput(op, i, s), s));
  }
  PyObject* result = nullptr;
  PyObject* attrs = CanonicalAttrs(op, s);
  if (attrs != nullptr) {
    OpRef ref{op, *num_outputs};
    PyObject* cap = PyCapsule_New(&ref, kOpCapsule, nullptr);
    result = PyObject_CallFunctionObjArgs(dev->execute, OpName(dev, name), attrs, inputs, cap,
                                          nullptr);
    PyCapsule_SetName(cap, "tfx_vec.lazy.op (expired)");  // OpRef dies with this frame
    Py_DECREF(cap);
    Py_DECREF(attrs);
  }
  Py_DECREF(inputs);
  PyObject* seq = result == nullptr ? nullptr
                                    : PySequence_Fast(result, "the recorder returns a sequence");
  Py_XDECREF(result);
  if (seq == nullptr) {
    FailFromPython(s);
    PyGILState_Release(g);
    return;
  }
  Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
  if (k > *num_outputs) {
    PyErr_Format(PyExc_RuntimeError, "tfx_vec.lazy: %s recorded %zd outputs, expected %d", name,
                 k, *num_outputs);
    FailFromPython(s);
  } else {
    TFE_Context* ctx = TFE_OpGetContext(op, s);
    int made = 0;
    for (; made < k; ++made) {
      outputs[made] = FromSpec(ctx, dev, PySequence_Fast_GET_ITEM(seq, made), s);
      if (outputs[made] == nullptr || TF_GetCode(s) != TF_OK) break;
    }
    if (made < k) {
      for (int i = 0; i < made; ++i) TFE_DeleteTensorHandle(outputs[i]);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, TF_Message(s));
      FailFromPython(s);
    } else {
      *num_outputs = static_cast<int>(k);
    }
  }
  Py_DECREF(seq);
  PyGILState_Release(g);
}

TFE_TensorHandle* CopyToDevice(TFE_Context* ctx, TFE_TensorHandle* h, TF_Status* s,
                               void* info) {
  Device* dev = static_cast<Device*>(info);
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject* t = EagerTensorFromHandle(TFE_TensorHandleCopySharingTensor(h, s), false);
  PyObject* spec = PyObject_CallFunctionObjArgs(dev->to_device, t, nullptr);
  Py_DECREF(t);
  TFE_TensorHandle* out = nullptr;
  if (spec != nullptr) {
    out = FromSpec(ctx, dev, spec, s);
    Py_DECREF(spec);
  }
  if (out == nullptr) FailFromPython(s);
  PyGILState_Release(g);
  return out;
}

TFE_TensorHandle* CopyFromDevice(TFE_Context* ctx, TFE_TensorHandle* h, const char* target,
                                 TF_Status* s, void* info) {
  Device* dev = static_cast<Device*>(info);
  PyGILState_STATE g = PyGILState_Ensure();
  Payload* p = PayloadOf(dev, h, s);
  PyObject* t = p == nullptr ? nullptr
                             : PyObject_CallFunctionObjArgs(dev->from_device, p->obj, nullptr);
  TFE_TensorHandle* out = nullptr;
  if (t != nullptr && EagerTensor_CheckExact(t)) {
    out = TFE_TensorHandleCopySharingTensor(EagerTensor_Handle(t), s);
  } else if (t != nullptr || !PyErr_Occurred()) {
    PyErr_SetString(PyExc_TypeError, "tfx_vec.lazy: forcing did not give a tensor");
  }
  Py_XDECREF(t);
  if (out == nullptr) FailFromPython(s);
  PyGILState_Release(g);
  if (out != nullptr && target != nullptr && std::strstr(target, "CPU:0") == nullptr) {
    TFE_TensorHandle* moved = TFE_TensorHandleCopyToDevice(out, ctx, target, s);
    TFE_DeleteTensorHandle(out);
    out = moved;
  }
  return out;
}

void DeleteDevice(void* info) {
  Device* dev = static_cast<Device*>(info);
  if (Py_IsInitialized() && !Finalizing()) {
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(dev->execute);
    Py_XDECREF(dev->to_device);
    Py_XDECREF(dev->from_device);
    for (auto& item : dev->op_names) Py_DECREF(item.second);
    PyGILState_Release(g);
  }
  delete dev;
}

// ---- module functions ----------------------------------------------------------------------

PyObject* Capsules(PyObject*, PyObject* args) {
  const char* name;
  PyObject *execute, *to_device, *from_device;
  if (!PyArg_ParseTuple(args, "sOOO", &name, &execute, &to_device, &from_device)) return nullptr;
  Py_INCREF(execute);
  Py_INCREF(to_device);
  Py_INCREF(from_device);
  Device* dev = new Device{name, execute, to_device, from_device, {}};
  TFE_CustomDevice* cd = new TFE_CustomDevice;
  cd->copy_tensor_to_device = CopyToDevice;
  cd->copy_tensor_from_device = CopyFromDevice;
  cd->execute = Execute;
  cd->delete_device = DeleteDevice;
  PyObject* device = PyCapsule_New(cd, "TFE_CustomDevice", [](PyObject* c) {
    delete static_cast<TFE_CustomDevice*>(PyCapsule_GetPointer(c, "TFE_CustomDevice"));
  });
  // TensorFlow takes ownership of the device info (and clears this capsule's destructor).
  PyObject* device_info = PyCapsule_New(dev, "TFE_CustomDevice_DeviceInfo", [](PyObject* c) {
    DeleteDevice(PyCapsule_GetPointer(c, "TFE_CustomDevice_DeviceInfo"));
  });
  return Py_BuildValue("NN", device, device_info);
}

PyObject* RunOnHost(PyObject*, PyObject* args) {
  PyObject *cap, *inputs;
  const char* device;
  if (!PyArg_ParseTuple(args, "OOs", &cap, &inputs, &device)) return nullptr;
  OpRef* ref = static_cast<OpRef*>(PyCapsule_GetPointer(cap, kOpCapsule));
  if (ref == nullptr) return nullptr;  // expired: used outside its Execute() call
  PyObject* seq = PySequence_Fast(inputs, "inputs must be a sequence");
  if (seq == nullptr) return nullptr;
  TF_Status* s = TF_NewStatus();
  TFE_Context* ctx = TFE_OpGetContext(ref->op, s);
  TFE_Op* op = TFE_NewOp(ctx, TFE_OpGetName(ref->op, s), s);
  if (TF_GetCode(s) == TF_OK) {
    TFE_OpSetDevice(op, device, s);
    TFE_OpAddAttrs(op, TFE_OpGetAttrs(ref->op));
  }
  for (Py_ssize_t i = 0; TF_GetCode(s) == TF_OK && i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    if (!EagerTensor_CheckExact(item)) {
      TF_SetStatus(s, TF_INVALID_ARGUMENT, "run_on_host takes EagerTensors");
      break;
    }
    TFE_OpAddInput(op, EagerTensor_Handle(item), s);
  }
  Py_DECREF(seq);
  std::vector<TFE_TensorHandle*> outs(ref->max_outputs);
  int n = ref->max_outputs;
  if (TF_GetCode(s) == TF_OK) {
    Py_BEGIN_ALLOW_THREADS
    TFE_Execute(op, outs.data(), &n, s);
    Py_END_ALLOW_THREADS
  }
  if (op != nullptr) TFE_DeleteOp(op);
  if (TF_GetCode(s) != TF_OK) {
    // (code, message): the Python side raises TensorFlow's exception class for the code
    // (OutOfRangeError ends a tf.data iteration, for one).
    if (!PyErr_Occurred()) {
      PyObject* err = Py_BuildValue("(is)", static_cast<int>(TF_GetCode(s)), TF_Message(s));
      PyErr_SetObject(PyExc_RuntimeError, err);
      Py_XDECREF(err);
    }
    TF_DeleteStatus(s);
    return nullptr;
  }
  TF_DeleteStatus(s);
  PyObject* res = PyList_New(n);
  for (int i = 0; i < n; ++i) PyList_SET_ITEM(res, i, EagerTensorFromHandle(outs[i], false));
  return res;
}

PyObject* GetPayload(PyObject*, PyObject* args) {
  PyObject* t;
  const char* name;
  if (!PyArg_ParseTuple(args, "Os", &t, &name)) return nullptr;
  PyObject* out = Py_None;
  if (EagerTensor_CheckExact(t)) {
    TF_Status* s = TF_NewStatus();
    TFE_TensorHandle* h = EagerTensor_Handle(t);
    const char* dn = TFE_TensorHandleDeviceName(h, s);
    if (dn != nullptr && std::strcmp(dn, name) == 0) {
      out = static_cast<Payload*>(TFE_TensorHandleDevicePointer(h, s))->obj;
    }
    TF_DeleteStatus(s);
  }
  Py_INCREF(out);
  return out;
}

// A device tensor made outside an Execute() call (a recorded gradient's results).
PyObject* MakeTensor(PyObject*, PyObject* args) {
  PyObject *ctx_capsule, *spec;
  const char* name;
  if (!PyArg_ParseTuple(args, "OsO", &ctx_capsule, &name, &spec)) return nullptr;
  TFE_Context* ctx = static_cast<TFE_Context*>(PyCapsule_GetPointer(ctx_capsule, nullptr));
  if (ctx == nullptr) return nullptr;
  // The device info is only needed for its name here.
  Device dev{name, nullptr, nullptr, nullptr, {}};
  TF_Status* s = TF_NewStatus();
  TFE_TensorHandle* h = FromSpec(ctx, &dev, spec, s);
  PyObject* out = nullptr;
  if (h != nullptr && TF_GetCode(s) == TF_OK) {
    out = EagerTensorFromHandle(h, false);
  } else if (!PyErr_Occurred()) {
    PyErr_SetString(PyExc_RuntimeError, TF_Message(s));
  }
  TF_DeleteStatus(s);
  return out;
}

PyObject* HandleId(PyObject*, PyObject* t) {
  if (!EagerTensor_CheckExact(t)) {
    PyErr_SetString(PyExc_TypeError, "handle_id takes an EagerTensor");
    return nullptr;
  }
  return PyLong_FromVoidPtr(EagerTensor_Handle(t));
}

PyObject* XlaOps(PyObject*, PyObject*) {
  std::vector<std::string> ops = tensorflow::XlaOpRegistry::GetAllRegisteredOps();
  PyObject* out = PyList_New(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    PyList_SET_ITEM(out, i, PyUnicode_FromString(ops[i].c_str()));
  }
  return out;
}

PyObject* ConstantArgs(PyObject*, PyObject* args) {
  const char* op;
  if (!PyArg_ParseTuple(args, "s", &op)) return nullptr;
  const std::unordered_set<std::string>* names =
      tensorflow::XlaOpRegistry::CompileTimeConstantInputArgNames(op);
  PyObject* out = PyList_New(0);
  if (names != nullptr) {
    for (const std::string& n : *names) {
      PyObject* str = PyUnicode_FromString(n.c_str());
      PyList_Append(out, str);
      Py_DECREF(str);
    }
  }
  return out;
}

// units.Snapshot.same: whether a recorded Keras call's Python state is what the snapshot
// kept.  The comparisons are Python's (names by equality, everything else by identity), made in
// one C loop: in Python each element costs a call, and a model's state is hundreds of them.

// The items of `iterable` against expected[*pos, ...] by identity, advancing *pos: 1 the same,
// 0 not, -1 an error.  A list, tuple, dict or set whose type iterates as the built-in does (a
// subclass that does not override __iter__: Keras' tracked containers) is read directly;
// anything else through its iterator, as Python's loop would.
int SameItems(PyObject* iterable, PyObject* expected, Py_ssize_t* pos) {
  const Py_ssize_t n = PyList_GET_SIZE(expected);
  const getiterfunc iter = Py_TYPE(iterable)->tp_iter;
  if ((PyList_Check(iterable) && iter == PyList_Type.tp_iter) ||
      (PyTuple_Check(iterable) && iter == PyTuple_Type.tp_iter)) {
    const Py_ssize_t m = PySequence_Fast_GET_SIZE(iterable);
    if (*pos + m > n) return 0;
    PyObject** items = PySequence_Fast_ITEMS(iterable);
    for (Py_ssize_t i = 0; i < m; ++i) {
      if (items[i] != PyList_GET_ITEM(expected, *pos + i)) return 0;
    }
    *pos += m;
    return 1;
  }
  if (PyDict_Check(iterable) && iter == PyDict_Type.tp_iter) {
    Py_ssize_t it = 0;
    PyObject *key, *value;
    while (PyDict_Next(iterable, &it, &key, &value)) {
      if (*pos >= n || key != PyList_GET_ITEM(expected, *pos)) return 0;
      ++*pos;
    }
    return 1;
  }
#if PY_VERSION_HEX < 0x030D0000   // _PySet_NextEntry is internal from Python 3.13
  if (PyAnySet_Check(iterable) && iter == PySet_Type.tp_iter) {
    Py_ssize_t it = 0;
    PyObject* key;
    Py_hash_t hash;
    while (_PySet_NextEntry(iterable, &it, &key, &hash)) {
      if (*pos >= n || key != PyList_GET_ITEM(expected, *pos)) return 0;
      ++*pos;
    }
    return 1;
  }
#endif
  PyObject* it = PyObject_GetIter(iterable);
  if (it == nullptr) return -1;
  int same = 1;
  PyObject* item;
  while ((item = PyIter_Next(it)) != nullptr) {
    const bool ok = *pos < n && item == PyList_GET_ITEM(expected, *pos);
    Py_DECREF(item);
    ++*pos;
    if (!ok) {
      same = 0;
      break;
    }
  }
  Py_DECREF(it);
  return PyErr_Occurred() ? -1 : same;
}

// A dict's values against expected[*pos, ...] (see SameItems): read directly when its type's
// values() is dict's own, else by calling it.
int SameValues(PyObject* mapping, PyObject* expected, Py_ssize_t* pos) {
  static PyObject* name = PyUnicode_InternFromString("values");
  static PyObject* dict_values = _PyType_Lookup(&PyDict_Type, name);  // borrowed, immortal type
  if (PyDict_Check(mapping) && _PyType_Lookup(Py_TYPE(mapping), name) == dict_values) {
    const Py_ssize_t n = PyList_GET_SIZE(expected);
    Py_ssize_t it = 0;
    PyObject *key, *value;
    while (PyDict_Next(mapping, &it, &key, &value)) {
      if (*pos >= n || value != PyList_GET_ITEM(expected, *pos)) return 0;
      ++*pos;
    }
    return 1;
  }
  PyObject* values = PyObject_CallMethodNoArgs(mapping, name);
  if (values == nullptr) return -1;
  const int same = SameItems(values, expected, pos);
  Py_DECREF(values);
  return same;
}

// Whether len(o) equals the int `expected`: 1, 0, or -1 on an error.
int SameSize(PyObject* o, PyObject* expected) {
  const Py_ssize_t n = PyObject_Size(o);
  if (n < 0) return -1;
  const Py_ssize_t e = PyLong_AsSsize_t(expected);
  if (e == -1 && PyErr_Occurred()) return -1;
  return n == e;
}

// 1 the same, 0 not, -1 an error (see SameState).
int SameStateImpl(PyObject* objects, PyObject* types, PyObject* sizes, PyObject* keys,
                  PyObject* values, PyObject* containers, PyObject* container_sizes,
                  PyObject* contents, PyObject* mappings, PyObject* mapping_values) {
  const Py_ssize_t n = PyList_GET_SIZE(objects);
  if (PyList_GET_SIZE(types) != n || PyList_GET_SIZE(sizes) != n) return 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(PyList_GET_ITEM(objects, i))) !=
        PyList_GET_ITEM(types, i)) {
      return 0;
    }
  }
  const Py_ssize_t n_keys = PyList_GET_SIZE(keys);
  if (PyList_GET_SIZE(values) != n_keys) return 0;
  static PyObject* dict_name = PyUnicode_InternFromString("__dict__");
  Py_ssize_t k = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* d = PyObject_GetAttr(PyList_GET_ITEM(objects, i), dict_name);  // vars()
    if (d == nullptr) return -1;
    int same = PyDict_Check(d) ? SameSize(d, PyList_GET_ITEM(sizes, i)) : 0;
    Py_ssize_t it = 0;
    PyObject *key, *value;
    while (same == 1 && PyDict_Next(d, &it, &key, &value)) {
      if (k >= n_keys || value != PyList_GET_ITEM(values, k)) {
        same = 0;
        break;
      }
      same = PyObject_RichCompareBool(key, PyList_GET_ITEM(keys, k), Py_EQ);
      ++k;
    }
    Py_DECREF(d);
    if (same != 1) return same;
  }
  if (k != n_keys) return 0;
  // The values are the snapshot's objects: its containers are the ones in the attributes.
  const Py_ssize_t n_containers = PyList_GET_SIZE(containers);
  if (PyList_GET_SIZE(container_sizes) != n_containers) return 0;
  for (Py_ssize_t i = 0; i < n_containers; ++i) {
    const int same = SameSize(PyList_GET_ITEM(containers, i), PyList_GET_ITEM(container_sizes, i));
    if (same != 1) return same;
  }
  Py_ssize_t pos = 0;
  for (Py_ssize_t i = 0; i < n_containers; ++i) {
    const int same = SameItems(PyList_GET_ITEM(containers, i), contents, &pos);
    if (same != 1) return same;
  }
  if (pos != PyList_GET_SIZE(contents)) return 0;
  pos = 0;
  for (Py_ssize_t i = 0, m = PyList_GET_SIZE(mappings); i < m; ++i) {
    const int same = SameValues(PyList_GET_ITEM(mappings, i), mapping_values, &pos);
    if (same != 1) return same;
  }
  return pos == PyList_GET_SIZE(mapping_values);
}

// same_state(objects, types, sizes, keys, values, containers, container_sizes, contents,
// mappings, mapping_values) -> bool: the objects' types are `types`, their __dict__ sizes
// `sizes`, their attribute names (in order, by equality) `keys` and values (by identity)
// `values`; then the containers' sizes and their items (by identity, flattened) `contents`,
// and the mappings' values() `mapping_values`.  Every argument is a list.
PyObject* SameState(PyObject*, PyObject* args) {
  PyObject* a[10];
  if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!O!O!", &PyList_Type, &a[0], &PyList_Type,
                        &a[1], &PyList_Type, &a[2], &PyList_Type, &a[3], &PyList_Type, &a[4],
                        &PyList_Type, &a[5], &PyList_Type, &a[6], &PyList_Type, &a[7],
                        &PyList_Type, &a[8], &PyList_Type, &a[9])) {
    return nullptr;
  }
  const int same = SameStateImpl(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
  if (same < 0) return nullptr;
  return PyBool_FromLong(same);
}

PyMethodDef kMethods[] = {
    {"capsules", Capsules, METH_VARARGS,
     "capsules(name, execute, to_device, from_device) -> (device, device_info) for "
     "context.register_custom_device"},
    {"run_on_host", RunOnHost, METH_VARARGS,
     "run_on_host(op, inputs, device) -> outputs: run the op being recorded on a device"},
    {"payload", GetPayload, METH_VARARGS,
     "payload(tensor, device_name) -> the payload of a tensor on that device, else None"},
    {"handle_id", HandleId, METH_O, "handle_id(tensor) -> identity of its tensor handle"},
    {"make_tensor", MakeTensor, METH_VARARGS,
     "make_tensor(context, device_name, (payload, dtype, dims)) -> a tensor on the device"},
    {"xla_ops", XlaOps, METH_NOARGS, "xla_ops() -> op types with an XLA kernel"},
    {"constant_args", ConstantArgs, METH_VARARGS,
     "constant_args(op) -> input args XLA needs as compile-time constants"},
    {"same_state", SameState, METH_VARARGS,
     "same_state(objects, types, sizes, keys, values, containers, container_sizes, contents, "
     "mappings, mapping_values) -> whether a units.Snapshot's state is unchanged"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_tfx_vec_lazy_device", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__tfx_vec_lazy_device() { return PyModule_Create(&kModule); }
