// vulkan/device.cpp: loader, device selection, memory and the command stream.
#include "vulkan/device.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "vulkan/shaders.h"

namespace ember::vk {

namespace {

// Tokens (Buffer::data() of device memory) start here: above every user-space address of the
// 64-bit platforms ember runs on (x86-64 and AArch64 use at most 57 bits, tags aside), so no host
// pointer is ever mistaken for one. Tokens are never dereferenced on the host.
constexpr uintptr_t kTokenBase = uintptr_t{1} << 58;
constexpr size_t kTokenAlign = size_t{1} << 16;  // gaps between allocations: off-by-one bugs fault
constexpr size_t kArenaBytes = size_t{16} << 20;
constexpr size_t kStagingBytes = size_t{32} << 20;
constexpr uint32_t kPushBytes = 128;  // the minimum every device guarantees

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw Error(cat("[vulkan] ", what, " failed (VkResult ", static_cast<int>(r), ")"));
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

bool has_extension(const Api& api, VkPhysicalDevice d, const char* name) {
  uint32_t n = 0;
  api.vkEnumerateDeviceExtensionProperties(d, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  api.vkEnumerateDeviceExtensionProperties(d, nullptr, &n, exts.data());
  for (const VkExtensionProperties& e : exts) {
    if (std::strcmp(e.extensionName, name) == 0) return true;
  }
  return false;
}

// The largest device-local heap, and its budget left.
void heap_sizes(const Api& api, VkPhysicalDevice d, bool budget, int64_t* total, int64_t* free) {
  VkPhysicalDeviceMemoryBudgetPropertiesEXT b{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 p{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  if (budget) p.pNext = &b;
  api.vkGetPhysicalDeviceMemoryProperties2(d, &p);
  *total = 0;
  *free = 0;
  for (uint32_t i = 0; i < p.memoryProperties.memoryHeapCount; ++i) {
    const VkMemoryHeap& h = p.memoryProperties.memoryHeaps[i];
    if (!(h.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) || static_cast<int64_t>(h.size) <= *total) continue;
    *total = static_cast<int64_t>(h.size);
    *free = budget ? static_cast<int64_t>(b.heapBudget[i]) - static_cast<int64_t>(b.heapUsage[i]) : *total;
  }
}

}  // namespace

Api::~Api() {
  if (instance != VK_NULL_HANDLE && vkDestroyInstance) vkDestroyInstance(instance, nullptr);
  if (library) dlclose(library);
}

std::shared_ptr<Api> open_api() {
  auto api = std::make_shared<Api>();
  // EMBER_VULKAN_LOADER names another loader library (a path, or a soname).
  const char* loader = std::getenv("EMBER_VULKAN_LOADER");
  const std::string name = loader && *loader ? loader : "libvulkan.so.1";
  api->library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->library) {
    throw Unsupported(cat("[vulkan] no Vulkan loader (", name,
                          ") on this system; install your GPU driver's Vulkan support (Debian/Ubuntu: "
                          "libvulkan1 and mesa-vulkan-drivers)"));
  }
  api->vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(
      dlsym(api->library, "vkGetInstanceProcAddr"));
  if (!api->vkGetInstanceProcAddr) throw Unsupported("[vulkan] libvulkan has no vkGetInstanceProcAddr");
  auto create = reinterpret_cast<PFN_vkCreateInstance>(
      api->vkGetInstanceProcAddr(nullptr, "vkCreateInstance"));
  auto version = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(
      api->vkGetInstanceProcAddr(nullptr, "vkEnumerateInstanceVersion"));
  uint32_t instance_version = VK_API_VERSION_1_0;
  if (version) version(&instance_version);
  if (instance_version < VK_API_VERSION_1_2) {
    throw Unsupported(cat("[vulkan] the Vulkan loader is version ", VK_API_VERSION_MAJOR(instance_version),
                          ".", VK_API_VERSION_MINOR(instance_version), "; ember needs 1.2"));
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "ember";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pApplicationInfo = &app;
  const VkResult r = create(&info, nullptr, &api->instance);
  if (r != VK_SUCCESS) {
    throw Unsupported(cat("[vulkan] no Vulkan driver answered (vkCreateInstance: VkResult ",
                          static_cast<int>(r), "); install one (Debian/Ubuntu: mesa-vulkan-drivers)"));
  }
#define EMBER_VK_LOAD(name)                                                                   \
  api->name = reinterpret_cast<PFN_##name>(api->vkGetInstanceProcAddr(api->instance, #name)); \
  if (!api->name) throw Unsupported("[vulkan] the loader lacks " #name);
  EMBER_VK_INSTANCE_FUNCTIONS(EMBER_VK_LOAD)
#undef EMBER_VK_LOAD
  return api;
}

std::vector<PhysicalDeviceInfo> physical_devices(const Api& api) {
  uint32_t n = 0;
  api.vkEnumeratePhysicalDevices(api.instance, &n, nullptr);
  std::vector<VkPhysicalDevice> handles(n);
  api.vkEnumeratePhysicalDevices(api.instance, &n, handles.data());
  std::vector<PhysicalDeviceInfo> out;
  for (VkPhysicalDevice d : handles) {
    PhysicalDeviceInfo info;
    info.handle = d;
    VkPhysicalDeviceProperties props;
    api.vkGetPhysicalDeviceProperties(d, &props);
    info.name = props.deviceName;
    info.type = type_name(props.deviceType);
    heap_sizes(api, d, has_extension(api, d, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME), &info.memory_bytes,
               &info.memory_free_bytes);
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    f11.pNext = &f12;
    VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    f.pNext = &f11;
    if (props.apiVersion < VK_API_VERSION_1_2) {
      info.unusable = "Vulkan 1.2 is needed";
    } else {
      api.vkGetPhysicalDeviceFeatures2(d, &f);
      if (!f12.bufferDeviceAddress) info.unusable = "no bufferDeviceAddress";
      if (!f11.storageBuffer16BitAccess) info.unusable = "no storageBuffer16BitAccess";
    }
    if (props.limits.maxPushConstantsSize < kPushBytes) info.unusable = "push constants under 128 bytes";
    out.push_back(std::move(info));
  }
  return out;
}

Device::Device(std::shared_ptr<Api> api, int index) : api_(std::move(api)), next_token_(kTokenBase) {
  const std::vector<PhysicalDeviceInfo> devices = physical_devices(*api_);
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    throw Unsupported(cat("[vulkan] no device ", index, ": ", devices.size(), " Vulkan device(s) found"));
  }
  info_ = devices[index];
  if (!info_.unusable.empty()) {
    throw Unsupported(
        cat("[vulkan] device ", index, " (", info_.name, ") cannot run ember: ", info_.unusable));
  }
  const Api& a = *api_;
  VkPhysicalDevice pd = info_.handle;

  uint32_t n_families = 0;
  a.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n_families, nullptr);
  std::vector<VkQueueFamilyProperties> families(n_families);
  a.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n_families, families.data());
  bool found = false;
  for (uint32_t i = 0; i < n_families && !found; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      queue_family_ = i;
      found = true;
    }
  }
  if (!found) throw Unsupported(cat("[vulkan] device ", index, " (", info_.name, ") has no compute queue"));

  has_memory_budget_ = has_extension(a, pd, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  const char* extensions[] = {VK_EXT_MEMORY_BUDGET_EXTENSION_NAME};
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = queue_family_;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  f12.bufferDeviceAddress = VK_TRUE;
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.storageBuffer16BitAccess = VK_TRUE;
  f11.pNext = &f12;
  VkDeviceCreateInfo create{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  create.pNext = &f11;
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue;
  create.enabledExtensionCount = has_memory_budget_ ? 1 : 0;
  create.ppEnabledExtensionNames = extensions;
  check(a.vkCreateDevice(pd, &create, nullptr, &device_), "vkCreateDevice");
  a.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

  // Memory types: device memory is device local, and mapped too where it is also host visible
  // (integrated GPUs, lavapipe) unless EMBER_VULKAN_STAGING=1 asks for the discrete-GPU path
  // (copies through a staging buffer), which tests use to cover it.
  VkPhysicalDeviceMemoryProperties mp;
  a.vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  const char* staging = std::getenv("EMBER_VULKAN_STAGING");
  const bool force_staging = staging && std::strcmp(staging, "1") == 0;
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                     VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int device_type = -1, mapped_type = -1, host_type = -1;
  for (uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
    if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && device_type < 0) device_type = static_cast<int>(i);
    if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && (f & host) == host && mapped_type < 0)
      mapped_type = static_cast<int>(i);
    if ((f & host) == host && host_type < 0) host_type = static_cast<int>(i);
  }
  if (device_type < 0 || host_type < 0) {
    throw Unsupported(
        cat("[vulkan] device ", index, " (", info_.name, ") lacks device-local or host-visible memory"));
  }
  device_memory_mapped_ = mapped_type >= 0 && !force_staging;
  device_memory_type_ = static_cast<uint32_t>(device_memory_mapped_ ? mapped_type : device_type);
  host_memory_type_ = static_cast<uint32_t>(host_type);

  VkCommandPoolCreateInfo pool{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = queue_family_;
  check(a.vkCreateCommandPool(device_, &pool, nullptr, &command_pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo cb{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cb.commandPool = command_pool_;
  cb.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cb.commandBufferCount = 1;
  check(a.vkAllocateCommandBuffers(device_, &cb, &commands_), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fence{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(a.vkCreateFence(device_, &fence, nullptr, &fence_), "vkCreateFence");
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushBytes};
  VkPipelineLayoutCreateInfo layout{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout.pushConstantRangeCount = 1;
  layout.pPushConstantRanges = &range;
  check(a.vkCreatePipelineLayout(device_, &layout, nullptr, &pipeline_layout_), "vkCreatePipelineLayout");
  arena_ = make_allocation(kArenaBytes, /*host_visible=*/true);
}

Device::~Device() {
  const Api& a = *api_;
  a.vkDeviceWaitIdle(device_);
  for (auto& [token, alloc] : allocations_) free_allocation(alloc);
  free_allocation(arena_);
  free_allocation(staging_);
  for (auto& [name, p] : pipelines_) a.vkDestroyPipeline(device_, p.pipeline, nullptr);
  a.vkDestroyPipelineLayout(device_, pipeline_layout_, nullptr);
  a.vkDestroyFence(device_, fence_, nullptr);
  a.vkDestroyCommandPool(device_, command_pool_, nullptr);
  a.vkDestroyDevice(device_, nullptr);
}

int64_t Device::memory_free_bytes() const {
  int64_t total = 0, free = 0;
  heap_sizes(*api_, info_.handle, has_memory_budget_, &total, &free);
  return free;
}

Allocation Device::make_allocation(size_t n_bytes, bool host_visible) {
  const Api& a = *api_;
  Allocation out;
  out.n_bytes = n_bytes;
  VkBufferCreateInfo b{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  b.size = n_bytes == 0 ? 4 : n_bytes;
  b.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
            VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  b.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(a.vkCreateBuffer(device_, &b, nullptr, &out.buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  a.vkGetBufferMemoryRequirements(device_, out.buffer, &req);
  const uint32_t type = host_visible ? host_memory_type_ : device_memory_type_;
  if (!(req.memoryTypeBits & (1u << type))) {
    a.vkDestroyBuffer(device_, out.buffer, nullptr);
    throw Error("[vulkan] the device's buffers cannot use the chosen memory type");
  }
  VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo m{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  m.pNext = &flags;
  m.allocationSize = req.size;
  m.memoryTypeIndex = type;
  const VkResult r = a.vkAllocateMemory(device_, &m, nullptr, &out.memory);
  if (r != VK_SUCCESS) {
    a.vkDestroyBuffer(device_, out.buffer, nullptr);
    throw Error(cat("[vulkan] out of device memory allocating ", n_bytes, " bytes on ", info_.name,
                    " (VkResult ", static_cast<int>(r), ")"));
  }
  check(a.vkBindBufferMemory(device_, out.buffer, out.memory, 0), "vkBindBufferMemory");
  if (host_visible || device_memory_mapped_) {
    void* p = nullptr;
    check(a.vkMapMemory(device_, out.memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
    out.mapped = static_cast<uint8_t*>(p);
  }
  VkBufferDeviceAddressInfo addr{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  addr.buffer = out.buffer;
  out.address = a.vkGetBufferDeviceAddress(device_, &addr);
  return out;
}

void Device::free_allocation(Allocation& alloc) {
  if (alloc.buffer != VK_NULL_HANDLE) api_->vkDestroyBuffer(device_, alloc.buffer, nullptr);
  if (alloc.memory != VK_NULL_HANDLE) api_->vkFreeMemory(device_, alloc.memory, nullptr);  // unmaps too
  alloc = Allocation{};
}

void* Device::allocate(size_t n_bytes) {
  const uintptr_t token = next_token_;
  allocations_.emplace(token, make_allocation(n_bytes, /*host_visible=*/false));
  next_token_ += (n_bytes + 2 * kTokenAlign - 1) / kTokenAlign * kTokenAlign;
  return reinterpret_cast<void*>(token);
}

void Device::release(void* token) {
  const auto it = allocations_.find(reinterpret_cast<uintptr_t>(token));
  if (it == allocations_.end()) return;
  submit_and_wait();  // recorded commands may still use it
  free_allocation(it->second);
  allocations_.erase(it);
}

Resolved Device::resolve(const void* p) const {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  if (u < kTokenBase) return {};
  auto it = allocations_.upper_bound(u);
  if (it == allocations_.begin()) return {};
  --it;
  if (u - it->first > it->second.n_bytes) return {};
  return {&it->second, u - it->first};
}

VkDeviceAddress Device::device_address(const void* p) const {
  const Resolved r = resolve(p);
  if (!r.allocation)
    throw std::logic_error("[vulkan] an op was given host memory where it writes device memory");
  return r.address();
}

VkDeviceAddress Device::argument(const void* p, size_t n_bytes) {
  const Resolved r = resolve(p);
  if (r.allocation) return r.address();
  if (n_bytes > kArenaBytes) throw std::logic_error("[vulkan] an op's host argument exceeds the arena");
  if (arena_used_ + n_bytes > kArenaBytes) submit_and_wait();  // frees the arena
  const size_t at = arena_used_;
  if (n_bytes) std::memcpy(arena_.mapped + at, p, n_bytes);
  arena_used_ = (at + n_bytes + 63) / 64 * 64;
  return arena_.address + at;
}

void Device::begin_recording() {
  if (recording_) return;
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(api_->vkBeginCommandBuffer(commands_, &begin), "vkBeginCommandBuffer");
  recording_ = true;
}

void Device::submit_and_wait() {
  if (!recording_) {
    arena_used_ = 0;
    return;
  }
  const Api& a = *api_;
  check(a.vkEndCommandBuffer(commands_), "vkEndCommandBuffer");
  recording_ = false;
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &commands_;
  check(a.vkQueueSubmit(queue_, 1, &submit, fence_), "vkQueueSubmit");
  check(a.vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  check(a.vkResetFences(device_, 1, &fence_), "vkResetFences");
  check(a.vkResetCommandBuffer(commands_, 0), "vkResetCommandBuffer");
  arena_used_ = 0;
  ++n_submissions_;
}

const Pipeline& Device::pipeline(const char* shader) {
  const auto it = pipelines_.find(shader);
  if (it != pipelines_.end()) return it->second;
  const EmbeddedShader* spirv = find_shader(shader);
  if (!spirv) throw std::logic_error(cat("[vulkan] no embedded shader '", shader, "'"));
  const Api& a = *api_;
  VkShaderModuleCreateInfo m{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  m.codeSize = spirv->n_bytes;
  m.pCode = spirv->code;
  VkShaderModule module;
  check(a.vkCreateShaderModule(device_, &m, nullptr, &module), "vkCreateShaderModule");
  VkComputePipelineCreateInfo c{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  c.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  c.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  c.stage.module = module;
  c.stage.pName = "main";
  c.layout = pipeline_layout_;
  Pipeline p;
  const VkResult r = a.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &c, nullptr, &p.pipeline);
  a.vkDestroyShaderModule(device_, module, nullptr);
  check(r, "vkCreateComputePipelines");
  return pipelines_.emplace(shader, p).first->second;
}

void Device::dispatch(const char* shader, const void* push, uint32_t push_bytes, uint32_t groups_x,
                      uint32_t groups_y, uint32_t groups_z) {
  if (groups_x == 0 || groups_y == 0 || groups_z == 0) return;
  const Pipeline& p = pipeline(shader);
  begin_recording();
  const Api& a = *api_;
  a.vkCmdBindPipeline(commands_, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  a.vkCmdPushConstants(commands_, pipeline_layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  a.vkCmdDispatch(commands_, groups_x, groups_y, groups_z);
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                          VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  a.vkCmdPipelineBarrier(commands_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                         &barrier, 0, nullptr, 0, nullptr);
}

void Device::copy_within(const void* p, const VkBufferCopy* regions, uint32_t n_regions) {
  if (n_regions == 0) return;
  const Resolved r = resolve(p);
  if (!r.allocation) throw std::logic_error("[vulkan] copy_within of host memory");
  std::vector<VkBufferCopy> at(regions, regions + n_regions);
  for (VkBufferCopy& c : at) {
    c.srcOffset += r.offset;
    c.dstOffset += r.offset;
  }
  record_copy(r.allocation->buffer, r.allocation->buffer, at.data(), n_regions);
}

void Device::copy(VkBuffer src, size_t src_offset, VkBuffer dst, size_t dst_offset, size_t n_bytes) {
  const VkBufferCopy region{src_offset, dst_offset, n_bytes};
  record_copy(src, dst, &region, 1);
}

void Device::record_copy(VkBuffer src, VkBuffer dst, const VkBufferCopy* regions, uint32_t n_regions) {
  begin_recording();
  api_->vkCmdCopyBuffer(commands_, src, dst, n_regions, regions);
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                          VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT;
  api_->vkCmdPipelineBarrier(
      commands_, VK_PIPELINE_STAGE_TRANSFER_BIT,
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT, 0,
      1, &barrier, 0, nullptr, 0, nullptr);
}

void Device::write(const Resolved& dst, const void* src, size_t n_bytes) {
  if (dst.allocation->mapped) {
    submit_and_wait();  // commands recorded earlier may read this memory
    std::memcpy(dst.allocation->mapped + dst.offset, src, n_bytes);
    return;
  }
  if (staging_.buffer == VK_NULL_HANDLE) staging_ = make_allocation(kStagingBytes, /*host_visible=*/true);
  for (size_t done = 0; done < n_bytes; done += kStagingBytes) {
    const size_t n = std::min(kStagingBytes, n_bytes - done);
    submit_and_wait();  // the staging buffer is free again
    std::memcpy(staging_.mapped, static_cast<const uint8_t*>(src) + done, n);
    copy(staging_.buffer, 0, dst.allocation->buffer, dst.offset + done, n);
  }
  submit_and_wait();
}

void Device::read(const Resolved& src, void* dst, size_t n_bytes) {
  if (src.allocation->mapped) {
    submit_and_wait();
    std::memcpy(dst, src.allocation->mapped + src.offset, n_bytes);
    return;
  }
  if (staging_.buffer == VK_NULL_HANDLE) staging_ = make_allocation(kStagingBytes, /*host_visible=*/true);
  for (size_t done = 0; done < n_bytes; done += kStagingBytes) {
    const size_t n = std::min(kStagingBytes, n_bytes - done);
    copy(src.allocation->buffer, src.offset + done, staging_.buffer, 0, n);
    submit_and_wait();
    std::memcpy(static_cast<uint8_t*>(dst) + done, staging_.mapped, n);
  }
}

}  // namespace ember::vk
