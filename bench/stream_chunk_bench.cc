// One OpenAI stream chunk of the usual shape (a token of text), as a provider sends per token:
// read through ReadTextChunk (Boost.JSON) and through ParseJson, the full path's parser.
//
//   ./build/bench/keel_bench --benchmark_filter=Chunk
#include <benchmark/benchmark.h>

#include <string>

#include "keel/common/json_util.h"
#include "keel/model/openai_wire.h"

namespace {

const std::string kChunk =
    R"({"id":"chatcmpl-8abc123def456ghi789","object":"chat.completion.chunk",)"
    R"("created":1700000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0123456789",)"
    R"("choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]})";

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
