// engine/request.cpp: names of request states, for messages, events and /slots.
#include "engine/request.h"

namespace ember {

std::string_view to_string(RequestStatus status) {
  switch (status) {
    case RequestStatus::waiting: return "waiting";
    case RequestStatus::running: return "running";
    case RequestStatus::preempted: return "preempted";
    case RequestStatus::finished: return "finished";
  }
  return "?";
}

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

}  // namespace ember
