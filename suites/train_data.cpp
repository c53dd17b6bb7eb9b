#include "suites/train_data.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "harness/config.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "suites/train_eval.h"

namespace mixbench {

namespace fs = std::filesystem;

namespace {
const char* kWords[] = {"the", "a", "river", "stone", "light", "blue", "runs", "over", "under", "small",
                        "green", "house", "quiet", "fast", "and", "of", "tree", "sky", "old", "new",
                        "cold", "warm", "bird", "sings", "wind", "moves", "near", "far", "red", "road",
                        "sand", "glass"};

at::Tensor bytes_to_tokens(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong)).clone();
}
}  // namespace

std::string synthetic_document(uint64_t seed, int64_t index) {
  std::mt19937_64 rng(splitmix64(splitmix64(seed) ^ uint64_t(index)));
  auto uni = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  std::vector<std::pair<std::string, std::string>> facts;
  const int64_t n_facts = uni(3, 8);
  std::string doc = "facts:";
  for (int64_t i = 0; i < n_facts; ++i) {
    std::string k, v;
    for (int64_t j = 0, n = uni(3, 5); j < n; ++j) k += char('a' + uni(0, 25));
    for (int64_t j = 0, n = uni(2, 4); j < n; ++j) v += char('0' + uni(0, 9));
    facts.emplace_back(k, v);
    doc += " " + k + "=" + v + ";";
  }
  doc += "\n";
  for (int64_t s = 0, n = uni(8, 16); s < n; ++s) {
    const int64_t kind = uni(0, 2);
    if (kind == 0) {  // filler sentence
      for (int64_t w = 0, nw = uni(4, 10); w < nw; ++w) doc += std::string(w ? " " : "") + kWords[uni(0, 31)];
      doc += ".\n";
    } else if (kind == 1) {  // recall a fact stated at the top
      const auto& f = facts[size_t(uni(0, n_facts - 1))];
      doc += "what is " + f.first + "? " + f.second + ".\n";
    } else {  // verbatim copy of an earlier span
      const int64_t len = std::min<int64_t>(uni(16, 48), int64_t(doc.size()));
      const int64_t start = uni(0, int64_t(doc.size()) - len);
      const std::string span = doc.substr(size_t(start), size_t(len));
      doc += "copy: " + span + "\n";
    }
  }
  return doc;
}

Corpus synthetic_corpus(uint64_t seed, int64_t train_bytes, int64_t val_bytes, int64_t probe_T) {
  Corpus c;
  const std::vector<ProbeSpec> probes = probe_T > 0 ? probe_suite(probe_T) : std::vector<ProbeSpec>{};
  auto build = [&](uint64_t s, int64_t n) {
    std::vector<int64_t> v;
    v.reserve(size_t(n + 1024));
    for (int64_t i = 0; int64_t(v.size()) < n; ++i) {
      v.push_back(kByteBos);
      if (!probes.empty() && i % 2 == 1) {
        const int64_t k = i / 2;
        const ProbeSeq p = probes[size_t(k % int64_t(probes.size()))].make(s, k / int64_t(probes.size()));
        v.insert(v.end(), p.tokens.begin(), p.tokens.end());
        continue;
      }
      for (unsigned char ch : synthetic_document(s, i)) v.push_back(ch);
    }
    v.resize(size_t(n));
    return bytes_to_tokens(v);
  };
  c.train = build(seed, train_bytes);
  c.val = build(seed ^ 0x7A11D47AC0FFEEull, val_bytes);
  c.byte_level = true;
  c.max_token = kByteBos;
  c.source = fmt::format("synthetic(seed={},train_bytes={},val_bytes={})", seed, train_bytes, val_bytes);
  if (probe_T > 0) c.source += fmt::format("+probes(T={})", probe_T);
  c.hash = fnv1a_hex("synthetic-v1:" + c.source);
  return c;
}

namespace {
std::vector<std::string> list_files(const std::string& path, const std::string& ext) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(fmt::format("data path '{}' does not exist", path));
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(path))
      if (e.is_regular_file() && (ext.empty() || e.path().extension() == ext)) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  if (files.empty()) throw InputError(fmt::format("data folder '{}' holds no {} files", path, ext.empty() ? "" : ext));
  return files;
}

void split_corpus(Corpus& c, const at::Tensor& all) {
  const int64_t n = all.size(0);
  const int64_t nval = std::max<int64_t>(n / 10, 1);
  if (n - nval < 2) throw InputError(fmt::format("data '{}' is too short ({} tokens)", c.source, n));
  c.train = all.slice(0, 0, n - nval).clone();
  c.val = all.slice(0, n - nval).clone();
  c.max_token = all.max().item<int64_t>();
}
}  // namespace

Corpus text_corpus(const std::string& path) {
  Corpus c;
  c.source = path;
  std::vector<int64_t> v;
  std::string hash_text = "text-v1";
  for (const auto& f : list_files(path, "")) {
    const std::string text = read_file(f);
    v.push_back(kByteBos);
    for (unsigned char ch : text) v.push_back(ch);
    hash_text += "\n" + f + ":" + fnv1a_hex(text);
  }
  c.hash = fnv1a_hex(hash_text);
  c.byte_level = true;
  split_corpus(c, bytes_to_tokens(v));
  return c;
}

at::Tensor read_bin_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot open shard '{}'", path));
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  if (in.gcount() != sizeof(header))
    throw InputError(fmt::format("shard '{}' is truncated: the 1024-byte header is incomplete", path));
  if (header[0] != 20240520)
    throw InputError(fmt::format("shard '{}' has magic {} (expected 20240520): not a modded-nanogpt .bin shard", path, header[0]));
  if (header[1] != 1) throw InputError(fmt::format("shard '{}' has version {} (expected 1)", path, header[1]));
  const int64_t n = header[2];
  if (n < 0) throw InputError(fmt::format("shard '{}' declares a negative token count", path));
  std::vector<uint16_t> tok{};
  tok.resize(size_t(n));
  in.read(reinterpret_cast<char*>(tok.data()), std::streamsize(n * 2));
  if (in.gcount() != std::streamsize(n * 2))
    throw InputError(fmt::format("shard '{}' is truncated: header declares {} tokens, file holds {}", path, n,
                                 int64_t(in.gcount()) / 2));
  at::Tensor t = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = tok[size_t(i)];
  return t;
}

Corpus bin_corpus(const std::string& path) {
  Corpus c;
  c.source = path;
  c.byte_level = false;
  c.bos = 50256;  // GPT-2 end-of-text, which prefixes each document in the shards
  std::vector<at::Tensor> train, val;
  std::string hash_text = "bin-v1";
  for (const auto& f : list_files(path, ".bin")) {
    at::Tensor t = read_bin_shard(f);
    hash_text += "\n" + f + ":" + std::to_string(t.size(0));
    (fs::path(f).filename().string().find("val") != std::string::npos ? val : train).push_back(t);
  }
  c.hash = fnv1a_hex(hash_text);
  if (train.empty()) throw InputError(fmt::format("data '{}' holds only validation shards", path));
  if (val.empty()) {
    split_corpus(c, at::cat(train));
  } else {
    c.train = at::cat(train);
    c.val = at::cat(val);
    c.max_token = std::max(c.train.max().item<int64_t>(), c.val.max().item<int64_t>());
  }
  return c;
}

void shuffle_train_documents(Corpus& c, uint64_t seed) {
  c.order = data_order("file");
  const at::Tensor stream = c.train.contiguous();
  const int64_t N = stream.size(0);
  const at::Tensor marks = (stream == c.bos).nonzero().flatten().contiguous();
  const uint64_t r = splitmix64(seed ^ 0x0D0C5EEDull);
  if (marks.size(0) == 0) {  // no documents to permute: a rotation
    const int64_t start = N > 0 ? int64_t(r % uint64_t(N)) : 0;
    c.train = at::cat({stream.slice(0, start), stream.slice(0, 0, start)});
    return;
  }
  const int64_t* m = marks.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> docs;  // [begin, end)
  docs.reserve(size_t(marks.size(0)) + 1);
  if (m[0] > 0) docs.emplace_back(0, m[0]);
  for (int64_t i = 0; i < marks.size(0); ++i) docs.emplace_back(m[i], i + 1 < marks.size(0) ? m[i + 1] : N);
  // Fisher–Yates with the generator's raw draws (std::shuffle's algorithm is the library's choice)
  std::mt19937_64 rng(r);
  for (size_t i = docs.size(); i > 1; --i) std::swap(docs[i - 1], docs[size_t(rng() % uint64_t(i))]);
  at::Tensor out = at::empty_like(stream);
  const int64_t* src = stream.data_ptr<int64_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  int64_t o = 0;
  for (const auto& [a, b] : docs) {
    std::memcpy(dst + o, src + a, size_t(b - a) * sizeof(int64_t));
    o += b - a;
  }
  c.train = out;
}

std::string data_order(const std::string& data) {
  return data == "synthetic" ? "synthetic: drawn from the seed" : "documents permuted by the seed";
}

std::string builtin_text_dir() {
  const char* env = std::getenv("MIXBENCH_DATA_DIR");
  if (env == nullptr || *env == '\0') return "data/text";
  std::error_code ec;
  if (fs::exists(fs::path(env) / "manifest.json", ec)) return env;
  return (fs::path(env) / "text").string();
}

Corpus builtin_text_corpus(const std::string& dir) {
  const std::string fix = "run ci/fetch_text.sh to download and build it (or ci/fetch_text.sh --unpack where "
                          "its archive text.tar.xz was copied beside the folder), or set MIXBENCH_DATA_DIR";
  std::error_code ec;
  for (const char* f : {"manifest.json", "train.bin", "val.bin"})
    if (!fs::is_regular_file(fs::path(dir) / f, ec))
      throw InputError(fmt::format("--data text: the built-in text corpus is missing {} in '{}': {}", f, dir, fix));
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_file((fs::path(dir) / "manifest.json").string()));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("--data text: '{}/manifest.json' is not JSON ({}): {}", dir, e.what(), fix));
  }
  Corpus c;
  c.source = "text(" + dir + ")";
  c.byte_level = true;
  c.bos = kByteBos;
  c.train = read_bin_shard((fs::path(dir) / "train.bin").string());
  c.val = read_bin_shard((fs::path(dir) / "val.bin").string());
  if (c.train.size(0) < 2 || c.val.size(0) < 2) throw InputError(fmt::format("--data text: '{}' holds an empty shard", dir));
  c.max_token = std::max(c.train.max().item<int64_t>(), c.val.max().item<int64_t>());
  if (c.max_token > kByteBos)
    throw InputError(fmt::format("--data text: '{}' holds token {}, not bytes and BOS ({})", dir, c.max_token, kByteBos));
  // the shards' SHA-256 as the manifest records them, and their lengths
  const nlohmann::json files = manifest.value("files", nlohmann::json::object());
  c.hash = fnv1a_hex(fmt::format("builtin-text-v1\n{}\n{}:{}", files.dump(), c.train.size(0), c.val.size(0)));
  return c;
}

Corpus load_corpus(const std::string& data, uint64_t seed, int64_t probe_T, int64_t train_tokens) {
  if (data == "synthetic") {
    Corpus c = synthetic_corpus(seed, std::max(int64_t(1) << 21, train_tokens), int64_t(1) << 16, probe_T);
    c.order = data_order(data);
    return c;
  }
  if (data == "text") {
    Corpus c = builtin_text_corpus(builtin_text_dir());
    shuffle_train_documents(c, seed);
    return c;
  }
  std::error_code ec;
  bool bin = fs::path(data).extension() == ".bin";
  if (fs::is_directory(data, ec))
    for (const auto& e : fs::recursive_directory_iterator(data))
      bin = bin || (e.is_regular_file() && e.path().extension() == ".bin");
  Corpus c = bin ? bin_corpus(data) : text_corpus(data);
  shuffle_train_documents(c, seed);
  return c;
}

void get_batch(const at::Tensor& stream, int64_t pos, int64_t B, int64_t T, at::Tensor& x, at::Tensor& y) {
  const int64_t N = stream.size(0);
  if (N < T + 1) throw InputError(fmt::format("token stream of {} tokens is shorter than one row of {}", N, T + 1));
  at::Tensor off = at::arange(B * (T + 1), at::TensorOptions().dtype(at::kLong)) + pos;
  at::Tensor rows = stream.index_select(0, at::remainder(off, N)).view({B, T + 1});
  x = rows.slice(1, 0, T).contiguous();
  y = rows.slice(1, 1).contiguous();
}

}  // namespace mixbench
