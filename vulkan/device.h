// vulkan/device.h: the Vulkan loader (libvulkan is opened at run time, so a build with the
// Vulkan backend still runs where no loader is installed), one logical device with one compute
// queue, device memory, and the command stream every op records into.
//
// Memory model. Each alloc() is one VkBuffer usable by shaders through its device address
// (buffer_device_address: shaders get 64-bit addresses in push constants, no descriptor sets).
// The Buffer the backend hands out does not hold that address: its data() is a token in a range
// no host pointer occupies (kTokenBase and up), so that model code can do pointer arithmetic
// (x + r * n_cols) on device memory as on host memory, and the backend tells a device pointer
// from a host pointer by looking it up (resolve()).
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ember::vk {

// The entry points ember uses, loaded from libvulkan with vkGetInstanceProcAddr.
#define EMBER_VK_INSTANCE_FUNCTIONS(X)        \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceMemoryProperties2)     \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkDestroyDevice)                          \
  X(vkGetDeviceQueue)                         \
  X(vkCreateBuffer)                           \
  X(vkDestroyBuffer)                          \
  X(vkGetBufferMemoryRequirements)            \
  X(vkAllocateMemory)                         \
  X(vkFreeMemory)                             \
  X(vkBindBufferMemory)                       \
  X(vkMapMemory)                              \
  X(vkGetBufferDeviceAddress)                 \
  X(vkCreateShaderModule)                     \
  X(vkDestroyShaderModule)                    \
  X(vkCreatePipelineLayout)                   \
  X(vkDestroyPipelineLayout)                  \
  X(vkCreateComputePipelines)                 \
  X(vkDestroyPipeline)                        \
  X(vkCreateCommandPool)                      \
  X(vkDestroyCommandPool)                     \
  X(vkAllocateCommandBuffers)                 \
  X(vkBeginCommandBuffer)                     \
  X(vkEndCommandBuffer)                       \
  X(vkResetCommandBuffer)                     \
  X(vkCmdBindPipeline)                        \
  X(vkCmdPushConstants)                       \
  X(vkCmdDispatch)                            \
  X(vkCmdPipelineBarrier)                     \
  X(vkCmdCopyBuffer)                          \
  X(vkCreateFence)                            \
  X(vkDestroyFence)                           \
  X(vkResetFences)                            \
  X(vkWaitForFences)                          \
  X(vkQueueSubmit)                            \
  X(vkDeviceWaitIdle)

struct Api {
  void* library = nullptr;  // dlopen handle of libvulkan
  VkInstance instance = VK_NULL_HANDLE;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
#define EMBER_VK_DECLARE(name) PFN_##name name = nullptr;
  EMBER_VK_INSTANCE_FUNCTIONS(EMBER_VK_DECLARE)
#undef EMBER_VK_DECLARE

  Api() = default;
  Api(const Api&) = delete;
  Api& operator=(const Api&) = delete;
  ~Api();
};

// Opens libvulkan and creates an instance; throws Unsupported saying why not (no loader, no
// driver, an instance below Vulkan 1.2).
std::shared_ptr<Api> open_api();

// What ember needs of a device, and whether one has it.
struct PhysicalDeviceInfo {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  std::string name;
  std::string type;               // "discrete", "integrated", "virtual", "cpu", "other"
  int64_t memory_bytes = 0;       // the largest device-local heap
  int64_t memory_free_bytes = 0;  // its budget left (VK_EXT_memory_budget), else memory_bytes
  std::string unusable;           // empty: ember can run on it; else why not
};
std::vector<PhysicalDeviceInfo> physical_devices(const Api& api);

// One allocation: a buffer with its memory and device address.
struct Allocation {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkDeviceAddress address = 0;
  uint8_t* mapped = nullptr;  // host pointer when the memory is host visible and coherent
  size_t n_bytes = 0;
};

// A pointer an op was given, resolved: in an allocation (device) or not (host memory).
struct Resolved {
  const Allocation* allocation = nullptr;  // nullptr: a host pointer
  size_t offset = 0;
  VkDeviceAddress address() const { return allocation->address + offset; }
};

// The compute pipelines of the embedded SPIR-V shaders, by name, created on first use.
struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  uint32_t local_size_x = 0;
};

class Device {
 public:
  // Device `index` of physical_devices(); throws Unsupported naming it and why it is unusable.
  Device(std::shared_ptr<Api> api, int index);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const PhysicalDeviceInfo& info() const { return info_; }
  int64_t memory_free_bytes() const;

  // --- memory ---
  void* allocate(size_t n_bytes);  // the token of a new allocation (see the file comment)
  void release(void* token);
  // p in an allocation (device memory) or not (host memory).
  Resolved resolve(const void* p) const;
  // The device address of p, which must be device memory; throws std::logic_error otherwise.
  VkDeviceAddress device_address(const void* p) const;
  // The device address of n_bytes read from p: p's own when it is device memory, else a copy of
  // the host bytes in this step's argument arena (small per-op tables: ids, positions, block
  // tables, RoPE frequencies), made now, so the caller may reuse its memory at once.
  VkDeviceAddress argument(const void* p, size_t n_bytes);

  // Host <-> device copies; both finish (and finish the commands recorded before) on return.
  void write(const Resolved& dst, const void* src, size_t n_bytes);
  void read(const Resolved& src, void* dst, size_t n_bytes);

  // --- the command stream ---
  // Records one dispatch of `shader` with push constants, then a barrier that makes its writes
  // visible to everything recorded after it.
  void dispatch(const char* shader, const void* push, uint32_t push_bytes, uint32_t groups_x,
                uint32_t groups_y = 1, uint32_t groups_z = 1);
  // Records copies within the allocation holding p (device memory): region i copies
  // n_bytes[i] from p + src[i] to p + dst[i] (non-overlapping), then a barrier that makes the
  // writes visible to everything recorded after it.
  void copy_within(const void* p, const VkBufferCopy* regions, uint32_t n_regions);
  // Submits what was recorded (one submission) and waits for it (one wait); no-op when empty.
  void submit_and_wait();
  int64_t n_submissions() const { return n_submissions_; }

 private:
  Allocation make_allocation(size_t n_bytes, bool host_visible);
  void free_allocation(Allocation& a);
  void begin_recording();
  const Pipeline& pipeline(const char* shader);
  void copy(VkBuffer src, size_t src_offset, VkBuffer dst, size_t dst_offset, size_t n_bytes);
  void record_copy(VkBuffer src, VkBuffer dst, const VkBufferCopy* regions, uint32_t n_regions);

  std::shared_ptr<Api> api_;
  PhysicalDeviceInfo info_;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  uint32_t device_memory_type_ = 0;  // device local (and host visible where the device has that)
  uint32_t host_memory_type_ = 0;    // host visible and coherent: arena and staging
  bool device_memory_mapped_ = false;
  bool has_memory_budget_ = false;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer commands_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
  bool recording_ = false;
  int64_t n_submissions_ = 0;

  std::map<uintptr_t, Allocation> allocations_;  // by token
  uintptr_t next_token_;
  Allocation arena_;  // host-visible arguments of the step being recorded
  size_t arena_used_ = 0;
  Allocation staging_;  // host-visible bounce buffer for write/read of non-mapped memory
  std::map<std::string, Pipeline> pipelines_;
};

}  // namespace ember::vk
