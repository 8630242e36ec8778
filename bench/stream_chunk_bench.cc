// What a provider's stream sends per token: an OpenAI chunk of the usual shape and an Anthropic
// text_delta event, read through ReadTextChunk and ReadTextDelta (Boost.JSON, quick_json.h) and
// through ParseJson, the full path's parser.
//
//   ./build/bench/keel_bench --benchmark_filter=Chunk
#include <benchmark/benchmark.h>

#include <string>

#include "keel/common/json_util.h"
#include "keel/model/anthropic_wire.h"
#include "keel/model/openai_wire.h"

namespace {

const std::string kChunk =
    R"({"id":"chatcmpl-8abc123def456ghi789","object":"chat.completion.chunk",)"
    R"("created":1700000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0123456789",)"
    R"("choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]})";

const std::string kDelta =
    R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" hello"}})";

void BM_ChunkReadTextDelta(benchmark::State& state) {
  for (auto _ : state) {
    auto delta = keel::model::anthropic::ReadTextDelta(kDelta, "content_block_delta");
    benchmark::DoNotOptimize(delta);
  }
}

void BM_ChunkParseJsonDelta(benchmark::State& state) {
  for (auto _ : state) {
    auto parsed = keel::ParseJson(kDelta);
    benchmark::DoNotOptimize(parsed);
  }
}

void BM_ChunkReadTextChunk(benchmark::State& state) {
  for (auto _ : state) {
    auto chunk = keel::model::openai::ReadTextChunk(kChunk);
    benchmark::DoNotOptimize(chunk);
  }
}

void BM_ChunkParseJson(benchmark::State& state) {
  for (auto _ : state) {
    auto parsed = keel::ParseJson(kChunk);
    benchmark::DoNotOptimize(parsed);
  }
}

}  // namespace

BENCHMARK(BM_ChunkReadTextChunk);
BENCHMARK(BM_ChunkParseJson);
BENCHMARK(BM_ChunkReadTextDelta);
BENCHMARK(BM_ChunkParseJsonDelta);
