// What a user writes against layers/trainer.hpp and nothing else: an engine and a device
// of their own that add to the trace's `nerve` metadata. Compiled, never run (tests/headers):
// the metadata is a JSON object the override fills, so the header must define it, not
// only declare it.
#include "layers/trainer.hpp"

namespace {

struct user_engine : nerve::layers::train_engine {
  void trace_metadata(nlohmann::json& extra) const override { extra["engine"] = "user_engine"; }
};

struct user_device : nerve::layers::device_handle {
  void trace_metadata(nlohmann::json& extra) const override { extra["device"] = {{"name", "mine"}, {"ordinal", 0}}; }
};

}  // namespace
