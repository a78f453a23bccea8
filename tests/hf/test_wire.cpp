// te::gen::wire: what ranks send one another. Every field of each message type survives the trip
// (each set to a value unlike its default, so a field the codec dropped would come back default);
// a field added to a type but not to its Fields<T> list fails to compile (the static_asserts
// below hold the list lengths to the member counts); bad bytes are refused by field.

#include <gtest/gtest.h>

#include <limits>

#include "../expect_error.h"
#include "te/gen/wire.h"

namespace te::gen {
namespace {

template <class T>
constexpr std::size_t listed() {
  return std::tuple_size_v<decltype(wire::Fields<T>::list())>;
}
static_assert(listed<SamplingOptions>() == wire::detail::member_count<SamplingOptions>());
static_assert(listed<GenerateOptions>() == wire::detail::member_count<GenerateOptions>());
static_assert(listed<TokenEvent>() == wire::detail::member_count<TokenEvent>());
static_assert(listed<EngineStats>() == wire::detail::member_count<EngineStats>());
// The counter itself, on a type whose count is known.
struct Four {
  int64_t a = 0;
  std::string b;
  std::vector<std::pair<int64_t, float>> c;
  double d = 0;
};
static_assert(wire::detail::member_count<Four>() == 4);

TEST(Wire, EveryGenerateOptionsFieldRoundTrips) {
  GenerateOptions o;
  o.max_tokens = 123;
  o.sampling.temperature = 0.1 + 0.2;  // not a short decimal: bits must survive
  o.sampling.top_k = 41;
  o.sampling.top_p = 0.95;
  o.sampling.min_p = 0.05;
  o.sampling.repetition_penalty = 1.3;
  o.sampling.presence_penalty = -0.5;
  o.sampling.frequency_penalty = 1.75;
  o.sampling.seed = std::numeric_limits<uint64_t>::max() - 5;
  o.stop_token_ids = {2, 49152, -1};
  o.top_logprobs = 7;
  o.stop = {"\n\n", "\u00e9"};
  const GenerateOptions back = wire::from_bytes<GenerateOptions>(wire::to_bytes(o));
  EXPECT_EQ(back.max_tokens, 123);
  EXPECT_EQ(back.sampling.temperature, 0.1 + 0.2);
  EXPECT_EQ(back.sampling.top_k, 41);
  EXPECT_EQ(back.sampling.top_p, 0.95);
  EXPECT_EQ(back.sampling.min_p, 0.05);
  EXPECT_EQ(back.sampling.repetition_penalty, 1.3);
  EXPECT_EQ(back.sampling.presence_penalty, -0.5);
  EXPECT_EQ(back.sampling.frequency_penalty, 1.75);
  EXPECT_EQ(back.sampling.seed, std::numeric_limits<uint64_t>::max() - 5);
  EXPECT_EQ(back.stop_token_ids, (std::vector<int64_t>{2, 49152, -1}));
  EXPECT_EQ(back.top_logprobs, 7);
  EXPECT_EQ(back.stop, (std::vector<std::string>{"\n\n", "\u00e9"}));
}

TEST(Wire, TokenEventsAndStatsRoundTrip) {
  std::vector<TokenEvent> events(2);
  events[0] = {5, 17, -0.125f, {{17, -0.125f}, {3, -2.5f}}, ""};
  events[1] = {6, 2, -1e-7f, {}, "stop"};
  events[1].text = "the text before \xC3";
  const auto back = wire::from_bytes<std::vector<TokenEvent>>(wire::to_bytes(events));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].request, 5);
  EXPECT_EQ(back[0].token, 17);
  EXPECT_EQ(back[0].logprob, -0.125f);
  EXPECT_EQ(back[0].top_logprobs, events[0].top_logprobs);
  EXPECT_EQ(back[1].logprob, -1e-7f);
  EXPECT_EQ(back[1].finish_reason, "stop");
  EXPECT_EQ(back[1].text, "the text before \xC3");
  EngineStats s{1, 2, 3, 4, 5, 6, 7, 8};
  const EngineStats t = wire::from_bytes<EngineStats>(wire::to_bytes(s));
  EXPECT_EQ(std::vector<int64_t>({t.running, t.waiting, t.blocks_used, t.blocks_free,
                                  t.preemptions, t.steps, t.prefill_tokens, t.decode_tokens}),
            std::vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(Wire, BadBytesAreRefusedByField) {
  // 0x1c is a reserved CBOR initial byte (a text that happens to be valid CBOR would not do).
  EXPECT_ERROR(wire::from_bytes<GenerateOptions>(std::string("\x1c", 1), "rank 0's commands"),
               "wire: rank 0's commands is not CBOR (1 bytes)");
  EXPECT_ERROR(wire::from_bytes<GenerateOptions>(std::string("\x62" "a", 2)),
               "wire: message is not CBOR (2 bytes)");  // a 2-byte text cut short
  auto cbor = [](const nlohmann::json& j) {
    const std::vector<std::uint8_t> b = nlohmann::json::to_cbor(j);
    return std::string(b.begin(), b.end());
  };
  nlohmann::json j = wire::encode(GenerateOptions{});
  j["sampling"].erase("top_p");
  EXPECT_ERROR(wire::from_bytes<GenerateOptions>(cbor(j)),
               "wire: message.sampling.top_p is missing");
  j = wire::encode(GenerateOptions{});
  j["stop_token_ids"] = nlohmann::json::array({1, "two"});
  EXPECT_ERROR(wire::from_bytes<GenerateOptions>(cbor(j)),
               "wire: message.stop_token_ids[1] holds string, not the field's type");
  j = wire::encode(GenerateOptions{});
  j["max_tokens"] = 1.5;
  EXPECT_ERROR(wire::from_bytes<GenerateOptions>(cbor(j)),
               "wire: message.max_tokens holds number, not the field's type");
}

}  // namespace
}  // namespace te::gen
