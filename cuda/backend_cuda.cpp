// cuda/backend_cuda.cpp: the CUDA backend's devices, memory, stream and capabilities (the ops
// are in the files named as their CPU twins). The CUDA runtime is linked statically and opens
// the driver on first use; cuda_devices() first checks that the driver library exists at all,
// so that a machine without one gets a plain reason rather than a runtime error code.
#include "cuda/backend_cuda.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/device.h"

namespace ember {

namespace {

constexpr size_t kArenaBytes = size_t{16} << 20;  // host tables of one step (ids, positions, block tables)

// The driver library the runtime will open; EMBER_CUDA_DRIVER overrides it (tests point it at a
// missing file to see the no-driver path on a machine with a GPU).
const char* driver_library() {
  const char* env = std::getenv("EMBER_CUDA_DRIVER");
  return env && *env ? env : "libcuda.so.1";
}

void require_driver() {
  const char* lib = driver_library();
  void* handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw Unsupported(cat("cuda: no NVIDIA driver (", lib, " not found)"));
  dlclose(handle);
}

std::string version_text(int v) { return cat(v / 1000, ".", v % 1000 / 10); }

// cudaGetDeviceCount's failure as a reason a person can act on.
[[noreturn]] void no_devices(cudaError_t e) {
  cudaGetLastError();  // the runtime keeps the error; clear it for later calls
  if (e == cudaErrorInsufficientDriver) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    throw Unsupported(cat("cuda: the NVIDIA driver supports CUDA ", version_text(driver),
                          ", older than this build's runtime (CUDA ", version_text(runtime),
                          "); update the driver"));
  }
  if (e == cudaErrorNoDevice) throw Unsupported("cuda: the NVIDIA driver lists no devices");
  throw Unsupported(
      cat("cuda: the driver cannot list devices: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

BackendDevice describe(int index) {
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties", index);
  BackendDevice d;
  d.backend = "cuda";
  d.index = index;
  d.name = cat(prop.name, " (compute ", prop.major, ".", prop.minor, ")");
  d.type = prop.integrated ? "integrated" : "discrete";
  d.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  d.memory_free_bytes = d.memory_bytes;
  int previous = 0;
  cudaGetDevice(&previous);
  if (cudaSetDevice(index) == cudaSuccess) {
    const cudaError_t image = cuda::probe_kernel_image();
    if (image == cudaErrorNoKernelImageForDevice || image == cudaErrorInvalidDeviceFunction) {
      d.unusable = cat("compute capability ", prop.major, ".", prop.minor, ": this build has kernels for ",
                       EMBER_CUDA_ARCHITECTURES,
                       " only (rebuild with -C cmake.define.CMAKE_CUDA_ARCHITECTURES=", prop.major,
                       prop.minor, ")");
    } else if (image != cudaSuccess) {
      d.unusable = cat("the device fails: ", cudaGetErrorName(image), " (", cudaGetErrorString(image), ")");
    }
    size_t free_bytes = 0, total_bytes = 0;
    if (d.unusable.empty() && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      d.memory_free_bytes = static_cast<int64_t>(free_bytes);
    }
    cudaGetLastError();
  }
  cudaSetDevice(previous);
  return d;
}

}  // namespace

std::vector<BackendDevice> cuda_devices() {
  require_driver();
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) no_devices(e);
  std::vector<BackendDevice> out;
  for (int i = 0; i < n; ++i) out.push_back(describe(i));
  return out;
}

CudaBackend::CudaBackend(int index) : index_(index) {
  const std::vector<BackendDevice> devices = cuda_devices();
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    throw Unsupported(cat("[backend] 'cuda:", index, "': this machine has ", devices.size(), " CUDA device",
                          devices.size() == 1 ? "" : "s"));
  }
  const BackendDevice& d = devices[static_cast<size_t>(index)];
  if (!d.unusable.empty()) throw Unsupported(cat("[backend] cuda:", index, " (", d.name, "): ", d.unusable));
  device_label_ = d.name;
  memory_bytes_ = d.memory_bytes;
  use();
  cudaStream_t stream = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", index_);
  stream_ = stream;
  void* host = nullptr;
  void* device = nullptr;
  cuda::check(cudaMallocHost(&host, kArenaBytes), "cudaMallocHost of the argument arena", index_);
  host_arena_ = static_cast<uint8_t*>(host);
  cuda::check(cudaMalloc(&device, kArenaBytes), "cudaMalloc of the argument arena", index_);
  device_arena_ = static_cast<uint8_t*>(device);
}

CudaBackend::~CudaBackend() {
  // No throwing here: errors of the last step were reported by its finish().
  cudaSetDevice(index_);
  if (stream_) cudaStreamSynchronize(stream_);
  act_.reset();
  for (const auto& [base, n_bytes] : allocations_) cudaFree(reinterpret_cast<void*>(base));
  if (device_arena_) cudaFree(device_arena_);
  if (host_arena_) cudaFreeHost(host_arena_);
  if (stream_) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

void CudaBackend::use() const { cuda::check(cudaSetDevice(index_), "cudaSetDevice", index_); }

std::string CudaBackend::device_name() const { return cat("cuda:", index_, " (", device_label_, ")"); }

std::optional<DeviceMemory> CudaBackend::device_memory() const {
  use();
  size_t free_bytes = 0, total_bytes = 0;
  cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", index_);
  DeviceMemory m;
  m.total_bytes = static_cast<int64_t>(total_bytes);
  m.free_bytes = static_cast<int64_t>(free_bytes);
  return m;
}

bool CudaBackend::supports(Op op, DType dtype) const {
  switch (op) {
    case Op::matmul:
    case Op::get_rows:
      switch (dtype) {
        case DType::f32:
        case DType::f16:
        case DType::bf16:
        case DType::q4_0:
        case DType::q4_1:
        case DType::q5_0:
        case DType::q5_1:
        case DType::q8_0:
        case DType::iq4_nl:
        case DType::q2_k:
        case DType::q3_k:
        case DType::q4_k:
        case DType::q5_k:
        case DType::q6_k: return true;
        default: return false;
      }
    case Op::store_kv:
    case Op::attention: return dtype == DType::f16 || dtype == DType::q8_0;
    case Op::swiglu_oai:
    case Op::attention_sinks: return false;  // no kernels yet: Model::load refuses gpt-oss
    default: return dtype == DType::f32;
  }
}

void CudaBackend::launched(const char* what) {
  pending_ = true;
  cuda::check(cudaGetLastError(), what, index_);
}

void CudaBackend::finish(const char* what) {
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (pending_) ++n_submissions_;
  pending_ = false;
  arena_used_ = 0;
  cuda::check(e, what, index_);
  cuda::check(cudaGetLastError(), what, index_);
}

void CudaBackend::synchronize() {
  if (!pending_) return;
  use();
  finish("synchronize (a kernel of this step failed)");
}

Buffer CudaBackend::alloc(size_t n_bytes) {
  use();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, n_bytes == 0 ? 256 : n_bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error(cat("[cuda] out of device memory allocating ", n_bytes, " bytes on ", device_name(), " (",
                    free_bytes, " of ", total_bytes, " bytes free; ", cudaGetErrorName(e), ")"));
  }
  allocations_.emplace(reinterpret_cast<uintptr_t>(p), n_bytes);
  return Buffer(this, p, n_bytes, true);
}

void CudaBackend::free_buffer(void* data, size_t) {
  const auto it = allocations_.find(reinterpret_cast<uintptr_t>(data));
  if (it == allocations_.end()) return;
  allocations_.erase(it);
  cudaSetDevice(index_);
  cudaFree(data);  // waits for the work queued before it, which may still read the memory
  cudaGetLastError();
}

Buffer CudaBackend::wrap_host(const void* data, size_t n_bytes) {
  Buffer b = alloc(n_bytes);
  upload(b, 0, data, n_bytes);
  return b;
}

Buffer CudaBackend::prepare_matmul_weight(DType wtype, const void* data, int64_t n_in, int64_t n_out) {
  // The kernels read the file's layout.
  return wrap_host(data, static_cast<size_t>(row_bytes(wtype, n_in) * n_out));
}

void CudaBackend::upload(const Buffer& dst, size_t offset, const void* src, size_t n_bytes) {
  use();
  if (n_bytes) {
    cuda::check(cudaMemcpyAsync(dst.as<uint8_t>() + offset, src, n_bytes, cudaMemcpyHostToDevice, stream_),
                "upload (cudaMemcpyAsync)", index_);
  }
  finish("upload");
}

void CudaBackend::download(const Buffer& src, size_t offset, void* dst, size_t n_bytes) {
  use();
  if (n_bytes) {
    cuda::check(cudaMemcpyAsync(dst, src.as<uint8_t>() + offset, n_bytes, cudaMemcpyDeviceToHost, stream_),
                "download (cudaMemcpyAsync)", index_);
  }
  finish("download (a kernel of this step failed)");
}

const void* CudaBackend::argument_bytes(const void* p, size_t n_bytes) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  auto it = allocations_.upper_bound(u);
  if (it != allocations_.begin()) {
    --it;
    if (u - it->first <= it->second) return p;  // this backend's device memory
  }
  if (n_bytes > kArenaBytes) {
    throw std::logic_error(
        cat("[cuda] an op's host table of ", n_bytes, " bytes exceeds the argument arena"));
  }
  if (arena_used_ + n_bytes > kArenaBytes) finish("argument arena flush");  // frees the arena
  const size_t at = arena_used_;
  if (n_bytes) {
    std::memcpy(host_arena_ + at, p, n_bytes);
    cuda::check(
        cudaMemcpyAsync(device_arena_ + at, host_arena_ + at, n_bytes, cudaMemcpyHostToDevice, stream_),
        "argument copy (cudaMemcpyAsync)", index_);
    pending_ = true;
  }
  arena_used_ = (at + n_bytes + 255) / 256 * 256;
  return device_arena_ + at;
}

// Never called: supports() answers no, and Model::load refuses the models that need it.
void CudaBackend::swiglu_oai(const float*, const float*, int64_t, float, float, float*) {
  std::fprintf(stderr, "ember: the cuda backend has no swiglu_oai op (a caller skipped supports())\n");
  std::abort();
}

}  // namespace ember
