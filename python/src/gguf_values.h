// gguf_values.h: GGUF metadata values as Python objects, shared by the bindings that expose
// metadata (GGUFFile.metadata, Model.metadata).
#pragma once

#include <nanobind/nanobind.h>

#include "gguf/gguf.h"

// Scalars as int/float/bool, strings as str (broken UTF-8 shown as U+FFFD), arrays as lists.
nanobind::object gguf_value_to_python(const ember::GGUFValue& v);
