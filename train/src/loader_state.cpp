// The loader's position as JSON, for te-train's checkpoints (te/train/loader.h).

#include <nlohmann/json.hpp>

#include "te/error.h"
#include "te/train/loader.h"

namespace te::train {

std::string DataLoader::state_json() const {
  const nlohmann::json j = {{"epoch", position_.epoch},
                            {"step", position_.step},
                            {"seed", options_.seed},
                            {"units", num_units()},
                            {"seq_len", options_.seq_len},
                            {"packed", options_.packed},
                            {"pack_align", options_.pack_align},
                            {"global_batch", options_.batch_size * options_.dp_size}};
  return j.dump();
}

void DataLoader::load_state_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    TE_FAIL("the data position is not JSON (", e.what(), "); pass what state_json() gave");
  }
  auto field = [&](const char* name) -> const nlohmann::json& {
    TE_CHECK(j.is_object() && j.contains(name), "the data position has no \"", name,
             "\"; pass what state_json() gave");
    return j[name];
  };
  auto same = [&](const char* name, const nlohmann::json& now) {
    TE_CHECK(field(name) == now, "the data position was saved with ", name, " ", field(name).dump(),
             ", this run has ", now.dump(), " (", file_.path(),
             "); resume with the data and options of the checkpoint's run",
             std::string(name) == "pack_align"
                 ? " (te-train: --pack-align " + field(name).dump() + ")"
                 : "");
  };
  same("seq_len", options_.seq_len);
  same("packed", options_.packed);
  if (options_.packed) {  // (a position saved before slots were aligned: slots of 1)
    if (!j.contains("pack_align")) j["pack_align"] = 1;
    same("pack_align", options_.pack_align);
  }
  same("global_batch", options_.batch_size * options_.dp_size);
  same("seed", options_.seed);
  same("units", num_units());
  seek({field("epoch").get<int64_t>(), field("step").get<int64_t>()});
}

}  // namespace te::train
