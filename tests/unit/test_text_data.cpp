// Text data for causal language models: prepare_text (byte tokenizer), token files in
// open_dataset, set_context's windows and the Loader's (x, y) token batches.
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "data/data.h"
#include "data/prepare.h"
#include "strata/error.h"
#include "skip.h"
#include "test_util.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using strata::Loader;
using strata::test::TempDir;
using strata::test::run_command;
using strata::test::user_error;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  REQUIRE(f.good());
}

// Text-like bytes with an uneven byte distribution (so the entropy is not log 256), every
// byte value present at least once in a long enough text (for the uint8 range).
std::string synthetic_text(size_t n, uint64_t seed) {
  const std::string words[] = {"the ", "quick ", "brown ", "fox ", "jumps\n", "%\n", "over ",
                               "lazy ", "dogs.\n", "\xc3\xa9t\xc3\xa9 "};
  std::string s;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  while (s.size() < n) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    if (x % 97 == 0) s += char(x >> 40);  // now and then any byte at all
    else s += words[(x >> 32) % 10];
  }
  s.resize(n);
  return s;
}

// The split prepare.h documents: the last round(f * size) bytes of each input are val.
void expected_split(const std::vector<std::string>& texts, double f, std::string* train,
                    std::string* val) {
  for (const auto& t : texts) {
    size_t v = size_t(std::llround(f * double(t.size())));
    *train += t.substr(0, t.size() - v);
    *val += t.substr(t.size() - v);
  }
}

// Entropy computed another way than prepare's: ln N - (1/N) sum c ln c, counts in a map.
double entropy_nats(const std::string& s) {
  std::map<unsigned char, double> count;
  for (unsigned char c : s) count[c] += 1;
  double n = double(s.size()), sum = 0;
  for (auto& [b, c] : count) sum += c * std::log(c);
  return std::log(n) - sum / n;
}

// Raw HDF5 reads of what prepare_text wrote.
struct H5File {
  hid_t f;
  explicit H5File(const std::string& path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(f >= 0);
  }
  ~H5File() { H5Fclose(f); }
  std::string bytes(const char* name, bool* u8_1d) {
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    REQUIRE(ds >= 0);
    hid_t type = H5Dget_type(ds), space = H5Dget_space(ds), dcpl = H5Dget_create_plist(ds);
    hsize_t n = 0;
    *u8_1d = H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) == 1 &&
             H5Tget_sign(type) == H5T_SGN_NONE && H5Sget_simple_extent_ndims(space) == 1 &&
             H5Pget_layout(dcpl) == H5D_CONTIGUOUS;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    std::string out(n, '\0');
    REQUIRE(H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(ds);
    return out;
  }
  std::string str(const char* name) {
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    REQUIRE(a >= 0);
    hid_t mem = H5Tcopy(H5T_C_S1);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5T_CSET_UTF8);
    char* p = nullptr;
    REQUIRE(H5Aread(a, mem, &p) >= 0);
    std::string s = p;
    H5free_memory(p);
    H5Tclose(mem);
    H5Aclose(a);
    return s;
  }
  double num(const char* name) {
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    REQUIRE(a >= 0);
    double v = 0;
    REQUIRE(H5Aread(a, H5T_NATIVE_DOUBLE, &v) >= 0);
    H5Aclose(a);
    return v;
  }
};

// Writes a token file: /train/tokens and (n_val > 0) /val/tokens of dtype `type`, token i of a
// split = tok(i, vocab); vocab_attr < 0 writes no vocab attribute.
int64_t tok(int64_t i, int64_t vocab) { return (i * 7 + 3 + i / 13) % vocab; }

void write_token_file(const std::string& path, hid_t type, int64_t n_train, int64_t n_val,
                      int64_t vocab, int64_t vocab_attr, bool kind_attr = true) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(f >= 0);
  auto split = [&](const char* name, int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = tok(i, vocab);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hsize_t dims = hsize_t(n);
    hid_t space = H5Screate_simple(1, &dims, nullptr);
    hid_t ds = H5Dcreate2(f, name, type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(ds >= 0);
    if (n > 0) REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(lcpl);
  };
  split("/train/tokens", n_train);
  if (n_val > 0) split("/val/tokens", n_val);
  hid_t scalar = H5Screate(H5S_SCALAR);
  if (vocab_attr >= 0) {
    hid_t a = H5Acreate2(f, "vocab", H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &vocab_attr);
    H5Aclose(a);
  }
  if (kind_attr) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 7);
    hid_t a = H5Acreate2(f, "kind", t, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, "tokens");
    H5Aclose(a);
    H5Tclose(t);
  }
  H5Sclose(scalar);
  H5Fclose(f);
}

// Checks that batch b holds exactly the windows `ids` (of a split whose token i is
// tok(i, vocab)), in that order: x[k, t] = token[id*T + t], y[k*T + t] = token[id*T + t + 1].
void check_windows(const Loader::Batch& b, const std::vector<int64_t>& ids, int64_t T,
                   int64_t vocab) {
  REQUIRE(b.x.shape == strata::Shape{int64_t(ids.size()), T});
  REQUIRE(b.y.size() == ids.size() * size_t(T));
  for (size_t k = 0; k < ids.size(); ++k)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t at = ids[k] * T + t;
      if (b.x[int64_t(k) * T + t] != float(tok(at, vocab)) ||
          b.y[k * size_t(T) + size_t(t)] != tok(at + 1, vocab))
        FAIL(fmt::format("batch {}/{} window {} (sample {}) position {} differs", b.epoch, b.index,
                         k, ids[k], t));
    }
}

struct Copy {
  std::vector<float> x;
  std::vector<int32_t> y;
  int64_t rows, epoch, index, first;
  bool operator==(const Copy&) const = default;
};
Copy copy(const Loader::Batch& b) {
  return {std::vector<float>(b.x.data(), b.x.data() + b.x.size()), b.y, b.x.dim(0), b.epoch,
          b.index, b.first_sample};
}

// Sets STRATA_DATA_CACHE_MB for the scope (0: the Loader streams from the file).
struct CacheMiB {
  std::string old;
  bool had;
  explicit CacheMiB(const char* v) {
    const char* e = std::getenv("STRATA_DATA_CACHE_MB");
    had = e != nullptr;
    if (had) old = e;
    ::setenv("STRATA_DATA_CACHE_MB", v, 1);
  }
  ~CacheMiB() {
    if (had) ::setenv("STRATA_DATA_CACHE_MB", old.c_str(), 1);
    else ::unsetenv("STRATA_DATA_CACHE_MB");
  }
};

}  // namespace

TEST_CASE("prepare_text: bytes, split, attributes, entropy", "[data][prepare][text]") {
  TempDir tmp;
  const std::vector<std::string> texts = {synthetic_text(20011, 1), synthetic_text(7003, 2)};
  const std::vector<std::string> inputs = {tmp.file("alpha.txt"), tmp.file("beta")};
  for (size_t i = 0; i < texts.size(); ++i) write_bytes(inputs[i], texts[i]);
  const std::string out = tmp.file("text.h5");
  const auto r = strata::prepare_text(inputs, out, 0.1);

  std::string train, val;
  expected_split(texts, 0.1, &train, &val);
  CHECK(val.size() == 2001 + 700);
  CHECK(r.train_tokens == int64_t(train.size()));
  CHECK(r.val_tokens == int64_t(val.size()));
  CHECK(r.vocab == 256);
  // Two ways of summing ~256 terms of size ~1 in double: they agree to a few ulps of H (~4);
  // 1e-12 is far above that and far below any real difference in the counts (>= 1e-5).
  const double h = entropy_nats(train);
  CHECK(r.unigram_entropy_nats == Approx(h).epsilon(1e-12));
  CHECK(h > 1.0);
  CHECK(h < std::log(256.0));

  {
    H5File f(out);
    bool u8_1d = false;
    CHECK(f.bytes("/train/tokens", &u8_1d) == train);
    CHECK(u8_1d);
    CHECK(f.bytes("/val/tokens", &u8_1d) == val);
    CHECK(u8_1d);
    CHECK(f.str("kind") == "tokens");
    CHECK(f.str("tokenizer") == "bytes");
    CHECK(f.num("vocab") == 256);
    CHECK(f.num("train_tokens") == double(train.size()));
    CHECK(f.num("val_tokens") == double(val.size()));
    CHECK(f.num("val_fraction") == 0.1);
    CHECK(f.num("unigram_entropy_nats") == r.unigram_entropy_nats);
    CHECK(f.str("source") == inputs[0] + " " + inputs[1]);
    CHECK(f.str("created_by").rfind("strata ", 0) == 0);
    CHECK(f.str("created_at").size() == 20);  // 2026-01-02T03:04:05Z
    CHECK(f.str("sha256_alpha.txt") == strata::sha256_file(inputs[0]));
    CHECK(f.str("sha256_beta") == strata::sha256_file(inputs[1]));
    // source_sha256 is what `sha256sum NAMES | sha256sum` prints in the inputs' directory.
    CHECK(f.str("source_sha256") ==
          run_command(fmt::format("cd '{}' && sha256sum alpha.txt beta | sha256sum | cut -d' ' -f1",
                                  tmp.path.string())));
  }

  auto info = strata::open_dataset(out);
  CHECK(info.tokens);
  CHECK(info.vocab == 256);
  CHECK(info.classes == 256);
  CHECK(info.has_test);
  CHECK(info.train.tokens == int64_t(train.size()));
  CHECK(info.test.tokens == int64_t(val.size()));
  CHECK(info.train.dataset == "/train/tokens");
  CHECK(info.test.dataset == "/val/tokens");
  CHECK(info.train.n == 0);  // no samples before set_context
  CHECK(info.unigram_entropy_nats == r.unigram_entropy_nats);
  CHECK_FALSE(info.source_sha256.empty());

  // The windows are the bytes: x = text[i*T, i*T + T), y the same shifted by one.
  strata::set_context(info, 64);
  CHECK(info.context == 64);
  CHECK(info.train.n == (int64_t(train.size()) - 1) / 64);
  CHECK(info.test.n == (int64_t(val.size()) - 1) / 64);
  CHECK(info.train.sample_shape == strata::Shape{64});
  Loader l(info, "test", 5, 0, 1, false, 0);
  const auto& b = l.next();
  REQUIRE(b.x.shape == strata::Shape{5, 64});
  for (int64_t k = 0; k < 5 * 64; ++k) {
    CHECK(b.x[k] == float(static_cast<unsigned char>(val[size_t(k)])));
    CHECK(b.y[size_t(k)] == int32_t(static_cast<unsigned char>(val[size_t(k) + 1])));
  }

  // Nothing but inputs and output is left in the directory.
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(tmp.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"alpha.txt", "beta", "text.h5"});

  SECTION("bad inputs name the file and leave no output") {
    std::string bad_out = tmp.file("bad.h5");
    write_bytes(tmp.file("empty.txt"), "");
    write_bytes(tmp.file("small.txt"), synthetic_text(5000, 3));
    fs::create_directories(tmp.path / "sub");
    write_bytes(tmp.file("sub/beta"), "other");
    auto prep_err = [&](std::vector<std::string> in, double f = 0.1) {
      return user_error([&] { strata::prepare_text(in, bad_out, f); });
    };
    CHECK_THAT(prep_err({inputs[0], tmp.file("nope.txt")}),
               Contains("nope.txt: cannot open (No such file or directory)"));
    CHECK_THAT(prep_err({tmp.file("empty.txt")}), Contains("empty.txt: is empty"));
    CHECK_THAT(prep_err({tmp.path.string()}), Contains(tmp.path.string() + ": is a directory"));
    CHECK_THAT(prep_err({inputs[1], tmp.file("sub/beta")}),
               Contains("sub/beta: has the same file name as input") && Contains(inputs[1]));
    CHECK_THAT(prep_err({inputs[0]}, 0.0), Contains("--val_fraction 0"));
    CHECK_THAT(prep_err({inputs[0]}, 1.0), Contains("--val_fraction 1"));
    CHECK_THAT(prep_err({inputs[0]}, std::nan("")), Contains("--val_fraction"));
    CHECK_THAT(prep_err({}), Contains("no --input"));
    // 5000 bytes at 0.1: 500 val tokens, under the 1025 a context of 1024 needs.
    CHECK_THAT(prep_err({tmp.file("small.txt")}),
               Contains("bad.h5: the val split would hold 500 tokens") && Contains("1025"));
    CHECK_THAT(prep_err({tmp.file("small.txt")}, 0.9),
               Contains("the train split would hold 500 tokens"));
    bad_out = (tmp.path / "no_such_dir" / "x.h5").string();
    CHECK_THAT(prep_err({inputs[0]}), Contains("x.h5: output directory") && Contains("no_such_dir"));
    CHECK_FALSE(fs::exists(tmp.file("bad.h5")));
    for (auto& e : fs::directory_iterator(tmp.path))
      CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("token files: dtypes, vocab, set_context", "[data][text]") {
  TempDir tmp;
  const std::string path = tmp.file("tok.h5");
  hid_t type = H5T_STD_U8LE;
  int64_t vocab = 251;
  SECTION("uint8") {}
  SECTION("uint16") {
    type = H5T_STD_U16LE;
    vocab = 50257;
  }
  SECTION("int32, big-endian on disk") {
    type = H5T_STD_I32BE;
    vocab = 1 << 20;
  }
  write_token_file(path, type, 1000, 300, vocab, vocab);
  auto info = strata::open_dataset(path);
  CHECK(info.tokens);
  CHECK(info.vocab == vocab);
  CHECK(info.classes == vocab);
  CHECK(info.train.tokens == 1000);
  CHECK(info.test.tokens == 300);
  CHECK(info.unigram_entropy_nats == 0);  // absent
  CHECK(info.source_sha256.empty());

  strata::set_context(info, 16);
  CHECK(info.train.n == 999 / 16);
  CHECK(info.test.n == 299 / 16);
  CHECK(info.test.sample_shape == strata::Shape{16});
  // Training order: window ids of the epoch permutation.
  Loader l(info, "train", 8, 0, 1, true, 3);
  auto order = strata::epoch_order(info.train.n, 3, 0);
  check_windows(l.next(), std::vector<int64_t>(order.begin(), order.begin() + 8), 16, vocab);
  // The last whole window ends at token 62*16 = 992: in range, and the one after is not used.
  Loader v(info, "train", 62, 0, 1, false, 0);
  std::vector<int64_t> all(62);
  std::iota(all.begin(), all.end(), 0);
  check_windows(v.next(), all, 16, vocab);

  SECTION("a split shorter than context + 1 tokens") {
    auto i2 = strata::open_dataset(path);
    CHECK_THAT(user_error([&] { strata::set_context(i2, 300); }),
               Contains("tok.h5: /val/tokens has 300 tokens; model.context = 300 needs at least 301"));
    CHECK_THAT(user_error([&] { strata::set_context(i2, 1000); }),
               Contains("tok.h5: /train/tokens has 1000 tokens; model.context = 1000"));
    CHECK_THAT(user_error([&] { strata::set_context(i2, 0); }), Contains("model.context = 0"));
    strata::set_context(i2, 299);  // exactly one window in val
    CHECK(i2.test.n == 1);
  }
}

TEST_CASE("token batches: ranks, partial batches, seek, streaming", "[data][text]") {
  TempDir tmp;
  const std::string path = tmp.file("tok.h5");
  const int64_t T = 8, vocab = 256;
  write_token_file(path, H5T_STD_U8LE, 8 * 41 + 5, 8 * 23 + 1, vocab, -1, /*kind_attr=*/false);
  auto info = strata::open_dataset(path);  // recognised by /train/tokens alone
  REQUIRE(info.tokens);
  CHECK(info.vocab == 256);  // max(train token) + 1: tok() reaches 255
  strata::set_context(info, T);
  REQUIRE(info.train.n == 41);
  REQUIRE(info.test.n == 23);

  auto check = [&](const std::string& split, int64_t G, bool shuffle, std::vector<int> all_ranks,
                   const char* cache_mib) {
    CacheMiB cache(cache_mib);
    const int64_t n = split == "train" ? 41 : 23;
    Loader one(info, split, G, 0, 1, shuffle, 5);
    const int64_t nb = one.batches_per_epoch();
    CHECK(nb == (shuffle ? n / G : (n + G - 1) / G));
    std::vector<Copy> ref;
    for (int64_t e = 0; e < 2; ++e) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      if (shuffle) order = strata::epoch_order(n, 5, e);
      for (int64_t i = 0; i < nb; ++i) {
        const auto& b = one.next();
        CHECK(b.epoch == e);
        CHECK(b.index == i);
        const int64_t end = std::min(n, (i + 1) * G);
        check_windows(b, std::vector<int64_t>(order.begin() + i * G, order.begin() + end), T,
                      vocab);
        ref.push_back(copy(b));
      }
    }
    for (int R : all_ranks) {
      INFO("split " << split << ", global batch " << G << ", ranks " << R << ", cache "
                    << cache_mib);
      std::vector<std::unique_ptr<Loader>> loaders;
      for (int r = 0; r < R; ++r)
        loaders.push_back(std::make_unique<Loader>(info, split, G, r, R, shuffle, 5));
      for (const Copy& want : ref) {
        Copy got{{}, {}, 0, want.epoch, want.index, 0};
        for (int r = 0; r < R; ++r) {
          const auto& b = loaders[size_t(r)]->next();
          REQUIRE(b.epoch == want.epoch);
          REQUIRE(b.index == want.index);
          CHECK(b.first_sample == r * want.rows / R);
          CHECK(b.x.dim(0) == (r + 1) * want.rows / R - r * want.rows / R);
          CHECK(b.x.rank() == 2);
          CHECK(b.y.size() == size_t(b.x.dim(0) * T));
          got.x.insert(got.x.end(), b.x.data(), b.x.data() + b.x.size());
          got.y.insert(got.y.end(), b.y.begin(), b.y.end());
          got.rows += b.x.dim(0);
        }
        CHECK(got == want);
      }
    }
  };
  for (const char* cache : {"512", "0"}) {
    check("train", 8, true, {1, 2, 3}, cache);
    check("train", 10, true, {2}, cache);
    check("test", 10, false, {1, 2, 4}, cache);  // last batch of 3: rank 0 of 4 gets none
    check("test", 23, false, {2}, cache);        // one batch: consecutive windows, one run
  }

  SECTION("seek then next gives the batch iteration reaches (memory and streaming)") {
    for (const char* cache : {"512", "0"}) {
      CacheMiB c(cache);
      Loader a(info, "train", 8, 1, 2, true, 11);
      const int64_t nb = a.batches_per_epoch();
      REQUIRE(nb == 5);
      std::vector<Copy> seq;
      for (int64_t k = 0; k < 3 * nb; ++k) seq.push_back(copy(a.next()));
      Loader b(info, "train", 8, 1, 2, true, 11);
      b.seek(1, 3);
      CHECK(copy(b.next()) == seq[size_t(nb + 3)]);
      CHECK(copy(b.next()) == seq[size_t(nb + 4)]);
      CHECK(copy(b.next()) == seq[size_t(2 * nb)]);
      b.seek(0, 1);
      CHECK(copy(b.next()) == seq[1]);
      CHECK_THAT(user_error([&] { b.seek(0, nb); }),
                 Contains("tok.h5") && Contains("/train/tokens"));
    }
  }
  SECTION("the batch must fit the windows; no /val/tokens") {
    CHECK_THAT(user_error([&] { Loader(info, "train", 42, 0, 1, true, 0); }),
               Contains("global batch 42 exceeds the 41 samples") && Contains("/train/tokens") &&
                   Contains("model.context = 8"));
    const std::string p2 = tmp.file("noval.h5");
    write_token_file(p2, H5T_STD_U8LE, 100, 0, vocab, 256);
    auto i2 = strata::open_dataset(p2);
    CHECK_FALSE(i2.has_test);
    strata::set_context(i2, 4);
    CHECK_THAT(user_error([&] { Loader(i2, "test", 4, 0, 1, false, 0); }),
               Contains("noval.h5: has no /val/tokens split"));
  }
}

TEST_CASE("bad token files raise UserError naming file and dataset", "[data][text]") {
  TempDir tmp;
  auto open_err = [&](const std::string& name) {
    return user_error([&] { strata::open_dataset(tmp.file(name)); });
  };
  write_token_file(tmp.file("f32.h5"), H5T_IEEE_F32LE, 100, 0, 50, 50);
  CHECK_THAT(open_err("f32.h5"),
             Contains("f32.h5: /train/tokens has dtype float32; expected uint8, uint16 or int32"));
  write_token_file(tmp.file("i64.h5"), H5T_STD_I64LE, 100, 0, 50, 50);
  CHECK_THAT(open_err("i64.h5"), Contains("i64.h5: /train/tokens has dtype int64"));
  write_token_file(tmp.file("range.h5"), H5T_STD_U16LE, 100, 40, 300, 256);
  CHECK_THAT(open_err("range.h5"),
             Contains("range.h5: /train/tokens[") && Contains("is out of range [0, 256)"));
  // No vocab attribute: max(train) + 1, and val is checked against it.
  write_token_file(tmp.file("valrange.h5"), H5T_STD_U8LE, 10, 40, 200, -1);
  CHECK_THAT(open_err("valrange.h5"),
             Contains("valrange.h5: /val/tokens[") &&
                 Contains(fmt::format("is out of range [0, {})", tok(9, 200) + 1)));
  write_token_file(tmp.file("bigvocab.h5"), H5T_STD_I32LE, 100, 0, 50, (int64_t(1) << 24) + 1);
  CHECK_THAT(open_err("bigvocab.h5"), Contains("bigvocab.h5: root attribute vocab = 16777217"));
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    hid_t f = H5Fcreate(tmp.file("kind.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 7);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "kind", t, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, "tokens");
    H5Aclose(a);
    hsize_t dims[2] = {10, 10};
    hid_t sp = H5Screate_simple(2, dims, nullptr);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t d = H5Dcreate2(f, "/val/tokens", H5T_STD_U8LE, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Pclose(lcpl);
    H5Sclose(sp);
    H5Sclose(s);
    H5Tclose(t);
    H5Fclose(f);
  }
  CHECK_THAT(open_err("kind.h5"), Contains("kind.h5: missing dataset /train/tokens"));
  write_token_file(tmp.file("empty.h5"), H5T_STD_U8LE, 0, 0, 50, 50);
  CHECK_THAT(open_err("empty.h5"), Contains("empty.h5: /train/tokens has no tokens"));
  // An image file is not cut into windows.
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    hid_t f = H5Fcreate(tmp.file("img.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    std::vector<uint8_t> img(4 * 3 * 3, 1), lab(4, 0);
    hsize_t di[3] = {4, 3, 3}, dl = 4;
    hid_t si = H5Screate_simple(3, di, nullptr), sl = H5Screate_simple(1, &dl, nullptr);
    hid_t a = H5Dcreate2(f, "/train/images", H5T_STD_U8LE, si, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    hid_t b = H5Dcreate2(f, "/train/labels", H5T_STD_U8LE, sl, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(a, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, img.data());
    H5Dwrite(b, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, lab.data());
    H5Dclose(a);
    H5Dclose(b);
    H5Sclose(si);
    H5Sclose(sl);
    H5Pclose(lcpl);
    H5Fclose(f);
  }
  auto info = strata::open_dataset(tmp.file("img.h5"));
  CHECK_FALSE(info.tokens);
  CHECK_THAT(user_error([&] { strata::set_context(info, 4); }),
             Contains("img.h5: holds images, not tokens"));
}

namespace {
const char* kFortunesDir = "/usr/share/games/fortunes";
}

TEST_CASE("prepare_text on Debian's fortunes", "[data][prepare][text]") {
  if (!fs::is_directory(kFortunesDir))
    STRATA_SKIP(kFortunesDir << " is absent (apt install fortunes)");
  // The text files: not the .dat indexes nor the .u8 links to the same texts.
  std::vector<std::string> inputs;
  for (auto& e : fs::directory_iterator(kFortunesDir)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && !e.is_symlink() && ext != ".dat" && ext != ".u8")
      inputs.push_back(e.path().string());
  }
  std::sort(inputs.begin(), inputs.end());
  REQUIRE(inputs.size() > 10);
  TempDir tmp;
  const std::string out = tmp.file("fortunes.h5");
  const auto r = strata::prepare_text(inputs, out, 0.1);
  int64_t total = 0;
  for (const auto& p : inputs) total += int64_t(fs::file_size(p));
  CHECK(r.train_tokens + r.val_tokens == total);
  CHECK(double(r.val_tokens) == Approx(0.1 * double(total)).margin(double(inputs.size())));
  // English text: between 4 and 5 bits per byte of unigram entropy.
  CHECK(r.unigram_entropy_nats > 4 * std::log(2.0));
  CHECK(r.unigram_entropy_nats < 5 * std::log(2.0));
  auto info = strata::open_dataset(out);
  std::string names;
  for (const auto& p : inputs) names += " " + fs::path(p).filename().string();
  CHECK(info.source_sha256 == run_command(fmt::format(
                                  "cd '{}' && sha256sum{} | sha256sum | cut -d' ' -f1",
                                  kFortunesDir, names)));
  strata::set_context(info, 256);
  CHECK(info.test.n == (r.val_tokens - 1) / 256);
}
