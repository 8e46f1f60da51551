// One generic TensorFlow op, "TcKernel", that runs a compiled Tensor Comprehension.
//
// The kernel travels in the op's attributes as C source text plus its hash, so a graph (or a
// SavedModel) carries everything needed to rebuild it: on first use the op looks for
// <cache>/<hash>.so, checks that <cache>/<hash>.c holds exactly the source attribute (a binary is
// never loaded unless it was built from the cached source), compiles it with the compiler and flags
// of the attributes when missing, dlopens it and calls
//     extern "C" void tc_<entry>(void* const* args)
// with the input buffers in order, then the output buffers.  No Python runs at execution time.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tc_op_common.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TcKernel") TFX_VEC_TC_OP_SIGNATURE
    .Attr("source: string")
    .Attr("source_hash: string")
    .Attr("compiler: string = 'cc'")
    .Attr("compile_flags: string = '-O3 -fPIC -shared'");

namespace {

typedef void (*TcFn)(void* const*);

std::string CacheDir() {
  const char* env = std::getenv("TFX_VEC_CACHE_DIR");
  std::string dir;
  if (env && *env) {
    dir = env;
  } else {
    const char* home = std::getenv("HOME");
    dir = std::string(home && *home ? home : "/tmp") + "/.cache/tfx_vec";
  }
  dir += "/kernels";
  // mkdir -p
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);
  return dir;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

bool IsSafeToken(const std::string& s) {
  for (char ch : s)
    if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '_')) return false;
  return !s.empty();
}

Status WriteAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f) return errors::Internal("TcKernel: cannot write ", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return errors::Internal("TcKernel: cannot rename ", tmp, " to ", path);
  return OkStatus();
}

// Compiles (if needed) and loads the kernel; returns its entry point.
Status LoadKernel(const std::string& source, const std::string& hash, const std::string& entry,
                  const std::string& compiler, const std::string& flags, TcFn* fn) {
  static std::mutex mu;
  static std::unordered_map<std::string, TcFn>* loaded = new std::unordered_map<std::string, TcFn>;
  std::lock_guard<std::mutex> lock(mu);
  std::string key = hash + ":" + entry;
  auto it = loaded->find(key);
  if (it != loaded->end()) {
    *fn = it->second;
    return OkStatus();
  }
  if (!IsSafeToken(hash) || !IsSafeToken(entry))
    return errors::InvalidArgument("TcKernel: bad source_hash or entry name '", hash, "', '",
                                   entry, "'");
  std::string dir = CacheDir();
  std::string c_path = dir + "/" + hash + ".c", so_path = dir + "/" + hash + ".so";
  std::string cached;
  bool fresh = ReadFile(c_path, &cached) && cached == source && access(so_path.c_str(), R_OK) == 0;
  if (!fresh) {
    std::string tag = std::to_string(getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(&key));
    std::string tmp_c = dir + "/" + hash + ".build" + tag + ".c";
    std::string tmp_so = dir + "/" + hash + ".build" + tag + ".so";
    TF_RETURN_IF_ERROR(WriteAtomically(tmp_c, source));
    std::string cmd = compiler + " " + flags + " -o '" + tmp_so + "' '" + tmp_c + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return errors::Internal("TcKernel: cannot run ", cmd);
    std::string log;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) log += buf;
    int rc = pclose(p);
    if (rc != 0) {
      std::remove(tmp_c.c_str());
      return errors::Internal("TcKernel: compiling kernel tc_", entry, " failed (", cmd, "):\n",
                              log);
    }
    // The .so goes in place before the .c: a reader that sees the new .c finds the matching .so.
    if (std::rename(tmp_so.c_str(), so_path.c_str()) != 0 ||
        std::rename(tmp_c.c_str(), c_path.c_str()) != 0)
      return errors::Internal("TcKernel: cannot install ", so_path);
  }
  // RTLD_LOCAL + a path that embeds the source hash: two kernels never share symbols.
  void* handle = dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return errors::Internal("TcKernel: dlopen(", so_path, ") failed: ", dlerror());
  std::string sym = "tc_" + entry;
  void* f = dlsym(handle, sym.c_str());
  if (!f) return errors::NotFound("TcKernel: symbol ", sym, " not found in ", so_path);
  *fn = reinterpret_cast<TcFn>(f);
  (*loaded)[key] = *fn;
  return OkStatus();
}

class TcKernelOp : public OpKernel {
 public:
  explicit TcKernelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_shapes", &in_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("entry", &entry_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("source", &source_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("source_hash", &hash_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("compiler", &compiler_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("compile_flags", &flags_));
    OP_REQUIRES_OK(ctx, LoadKernel(source_, hash_, entry_, compiler_, flags_, &fn_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<void*> args;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& t = ctx->input(i);
      OP_REQUIRES_OK(ctx, tfx_vec_tc::CheckInputShape(entry_, i, t, in_shapes_));
      args.push_back(const_cast<char*>(t.tensor_data().data()));
    }
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      TensorShape shape;
      OP_REQUIRES_OK(ctx, tfx_vec_tc::OutputShape(entry_, i, shapes_[i], &shape));
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shape, &out));
      args.push_back(const_cast<char*>(out->tensor_data().data()));
    }
    fn_(args.data());
  }

 private:
  std::vector<PartialTensorShape> in_shapes_, shapes_;
  std::string entry_, source_, hash_, compiler_, flags_;
  TcFn fn_ = nullptr;
};

REGISTER_KERNEL_BUILDER(Name("TcKernel").Device(DEVICE_CPU), TcKernelOp);

}  // namespace
