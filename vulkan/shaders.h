// vulkan/shaders.h: the SPIR-V of vulkan/shaders/*.comp, compiled by glslc at build time and
// embedded (CMake generates shaders_spirv.cpp), looked up by name: "<file>" or, for a shader
// compiled once per weight or KV type, "<file>_<type>" (e.g. "matmul_vec_q4_0").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ember::vk {

struct EmbeddedShader {
  const char* name;
  const uint32_t* code;
  size_t n_bytes;
};

const EmbeddedShader* find_shader(std::string_view name);

}  // namespace ember::vk
