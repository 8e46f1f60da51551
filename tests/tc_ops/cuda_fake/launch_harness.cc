// Drives tc_cuda_launch.h (what TcCudaKernel runs) against a driver library given on the
// command line.  Usage: harness DRIVER MODULE_FILE ENTRY TOKEN...; tokens are
// k:NAME:gx:gy:gz:bx:by:bz (a kernel), a:PTR (an argument), z:PTR:BYTES (a buffer to zero),
// t:BYTES (a temporary's size, for CheckLaunch).  Runs the launcher twice.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tc_cuda_launch.h"

int main(int argc, char** argv) {
  using tfx_vec_tc::CudaDriver;
  CudaDriver* cu = CudaDriver::Load(argv[1]);
  if (!cu->error.empty()) {
    std::printf("driver: %s\n", cu->error.c_str());
    return 0;
  }
  std::ifstream file(argv[2]);
  std::stringstream module;
  module << file.rdbuf();
  std::vector<std::string> kernels;
  std::vector<int64_t> grid, block, temps;
  std::vector<CUdeviceptr> args;
  std::vector<std::pair<CUdeviceptr, size_t>> zeroed;
  for (int i = 4; i < argc; ++i) {
    std::vector<std::string> f;
    std::stringstream tok(argv[i]);
    for (std::string part; std::getline(tok, part, ':');) f.push_back(part);
    if (f[0] == "k") {
      kernels.push_back(f[1]);
      for (int d = 0; d < 3; ++d) grid.push_back(std::stoll(f[2 + d]));
      for (int d = 0; d < 3; ++d) block.push_back(std::stoll(f[5 + d]));
    } else if (f[0] == "a") {
      args.push_back(std::stoull(f[1]));
    } else if (f[0] == "z") {
      zeroed.emplace_back(std::stoull(f[1]), std::stoull(f[2]));
    } else if (f[0] == "t") {
      temps.push_back(std::stoll(f[1]));
    }
  }
  absl::Status s = tfx_vec_tc::CheckLaunch(argv[3], kernels, grid, block, temps);
  std::printf("check: %s\n", s.ToString().c_str());
  if (!s.ok()) return 0;
  tfx_vec_tc::CudaLauncher launcher(argv[3], module.str(), kernels, grid, block);
  for (int run = 0; run < 2; ++run) {
    s = launcher.Run(*cu, reinterpret_cast<CUstream>(0x5000), args, zeroed);
    std::printf("run %d: %s\n", run, s.ToString().c_str());
    std::fflush(stdout);
  }
  return 0;
}
