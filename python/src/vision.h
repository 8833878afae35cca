// vision.h: ember._core.VisionModel's object, shared by vision.cpp (which binds it) and
// engine.cpp (an engine's projector, whose config Python's preprocessing reads).
#pragma once

#include <memory>

#include "vision/vision_model.h"

struct PyVisionModel {
  std::shared_ptr<ember::VisionModel> model;
  // An engine's projector runs on the engine's thread only: encode() is refused here.
  bool engine_owned = false;
};
