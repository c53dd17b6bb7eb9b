// Training data: byte-level tokens from a seeded synthetic stream, UTF-8 text files or
// modded-nanogpt .bin shards, a held-out validation stream, and the batches of a step.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace mixbench {

constexpr int64_t kByteBos = 256;  // byte-level tokenizer: bytes 0..255 and BOS = 256 (vocab 257)

struct Corpus {
  at::Tensor train, val;      // 1-D int64 token streams
  bool byte_level = true;     // tokens are bytes (bpb exact: 1 byte per token, 0 for BOS)
  int64_t bos = kByteBos;
  int64_t max_token = 0;
  std::string source, hash;   // description, FNV hash of the source description/content
  std::string order;          // how the training stream is ordered (data_order)
};
// Seeded synthetic byte stream: BOS-prefixed documents of key=value facts, filler words, queries
// that recall earlier facts and verbatim copies of earlier spans (long-range structure). With
// probe_T > 0 every second document is instead a capability probe (suites/train_eval.h) of the
// suite for length probe_T, kinds in turn, drawn from the run seed's stream (the held-out probes
// use another).
Corpus synthetic_corpus(uint64_t seed, int64_t train_bytes, int64_t val_bytes, int64_t probe_T = 0);
std::string synthetic_document(uint64_t seed, int64_t index);  // one document (bytes, no BOS)
// UTF-8 text file or folder (files in sorted path order), each document BOS-prefixed; the last
// tenth of the stream is held out for validation.
Corpus text_corpus(const std::string& path);
// modded-nanogpt .bin shard(s); InputError on a bad magic/version or a truncated file.
at::Tensor read_bin_shard(const std::string& path);
Corpus bin_corpus(const std::string& path);
// The seed's data order for a file corpus: the training stream's documents (each from its BOS to the
// next; text before the first BOS is one more) concatenated in a permutation drawn from the seed, so
// that every stretch of a run reads the corpus's mixture rather than the neighbouring documents of
// one source (a corpus stored by source, as the built-in one is by package, would otherwise train
// each seed on a different slice of it). A stream without BOS marks is rotated to an offset drawn
// from the seed. Validation is left as it is.
void shuffle_train_documents(Corpus& c, uint64_t seed);
// The data order that load_corpus gives `data` (recorded by training and leaderboard reports: runs
// with another order are not comparable).
std::string data_order(const std::string& data);
// The built-in real-text corpus (ci/fetch_text.sh): DIR/train.bin and DIR/val.bin, byte tokens with
// BOS = 256 before each document, described by DIR/manifest.json. InputError naming the folder and
// ci/fetch_text.sh when it is missing or incomplete.
Corpus builtin_text_corpus(const std::string& dir);
// Where `--data text` looks: $MIXBENCH_DATA_DIR/text (or $MIXBENCH_DATA_DIR itself when it holds
// manifest.json) when the variable is set, else ./data/text.
std::string builtin_text_dir();
// "synthetic" (with probes for length probe_T, 0 = none; at least train_tokens long so that a
// run reads no byte twice; its content is drawn from the seed), "text" (the built-in corpus) or a path
// (in the seed's order, shuffle_train_documents)
Corpus load_corpus(const std::string& data, uint64_t seed, int64_t probe_T = 0, int64_t train_tokens = 0);

// Rows of T+1 tokens starting at stream offset `pos` (wrapping): inputs [B,T], targets [B,T].
void get_batch(const at::Tensor& stream, int64_t pos, int64_t B, int64_t T, at::Tensor& x, at::Tensor& y);

}  // namespace mixbench
