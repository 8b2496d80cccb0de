// Data layer: HDF5 validation, epoch order, per-rank loader slices, Fashion-MNIST preparation.
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
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

// Just enough HDF5 writing to build test files (intermediate groups created on demand).
class H5Writer {
 public:
  explicit H5Writer(const std::string& path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(file_ >= 0);
  }
  ~H5Writer() { H5Fclose(file_); }
  // dcpl: dataset creation properties (H5P_DEFAULT: contiguous).
  void dataset(const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
               const void* data, hid_t dcpl = H5P_DEFAULT) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    hid_t ds = H5Dcreate2(file_, name.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT);
    REQUIRE(ds >= 0);
    REQUIRE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(lcpl);
  }
  void int_attr(const char* name, int64_t v) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(file_, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    H5Aclose(a);
    H5Sclose(space);
  }
  void fixed_str_attr(const char* name, const std::string& v) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, v.size() + 1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(file_, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(a, type, v.c_str()) >= 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }

 private:
  hid_t file_;
};

// Sample i's pixel p: a row identifies its sample.
uint8_t pixel(int64_t i, int64_t p) { return uint8_t((i * 31 + p * 7 + 3) % 251); }
int64_t label_of(int64_t i, int classes) { return (i * 7 + 2) % classes; }

struct Synth {
  int64_t n_train = 37, n_test = 23;
  std::vector<hsize_t> sample = {4, 3};  // (H, W) or (C, H, W)
  bool f32 = false;
  int classes = 5;
  bool classes_attr = true;
};

int64_t sample_elems(const Synth& s) {
  int64_t e = 1;
  for (auto d : s.sample) e *= int64_t(d);
  return e;
}

void write_split(H5Writer& w, const std::string& split, int64_t n, const Synth& s) {
  int64_t e = sample_elems(s);
  std::vector<hsize_t> dims{hsize_t(n)};
  dims.insert(dims.end(), s.sample.begin(), s.sample.end());
  std::vector<uint8_t> u8(n * e);
  std::vector<float> f32(n * e);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < e; ++p) {
      u8[i * e + p] = pixel(i, p);
      f32[i * e + p] = float(pixel(i, p)) / 255.0f;
    }
  if (s.f32)
    w.dataset("/" + split + "/images", H5T_NATIVE_FLOAT, dims, f32.data());
  else
    w.dataset("/" + split + "/images", H5T_NATIVE_UINT8, dims, u8.data());
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = label_of(i, s.classes);
  w.dataset("/" + split + "/labels", H5T_NATIVE_INT64, {hsize_t(n)}, labels.data());
}

void write_synth(const std::string& path, const Synth& s) {
  H5Writer w(path);
  write_split(w, "train", s.n_train, s);
  if (s.n_test) write_split(w, "test", s.n_test, s);
  if (s.classes_attr) w.int_attr("classes", s.classes);
}

// Checks that a batch holds exactly the samples `ids`, in that order.
void check_batch(const Loader::Batch& b, const std::vector<int64_t>& ids, const Synth& s) {
  int64_t e = sample_elems(s);
  REQUIRE(b.x.dim(0) == int64_t(ids.size()));
  REQUIRE(b.y.size() == ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    CHECK(b.y[k] == label_of(ids[k], s.classes));
    for (int64_t p = 0; p < e; ++p)
      if (b.x[k * e + p] != float(pixel(ids[k], p)) / 255.0f) {
        FAIL(fmt::format("batch {}/{} row {} (sample {}) pixel {} differs", b.epoch, b.index, k,
                         ids[k], p));
      }
  }
}

struct Copy {
  std::vector<float> x;
  std::vector<int32_t> y;
  strata::Shape shape;
  int64_t epoch, index, first;
  bool operator==(const Copy&) const = default;
};
Copy copy(const Loader::Batch& b) {
  return {std::vector<float>(b.x.data(), b.x.data() + b.x.size()), b.y, b.x.shape, b.epoch,
          b.index, b.first_sample};
}

}  // namespace

TEST_CASE("epoch_order is a seeded permutation", "[data]") {
  auto a = strata::epoch_order(1000, 42, 0);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);
  CHECK(a != iota);
  CHECK(strata::epoch_order(1000, 42, 0) == a);
  CHECK(strata::epoch_order(1000, 42, 1) != a);
  CHECK(strata::epoch_order(1000, 43, 0) != a);
  CHECK(strata::epoch_order(0, 1, 0).empty());
  CHECK(strata::epoch_order(1, 1, 5) == std::vector<int64_t>{0});
}

TEST_CASE("open_dataset reads shapes, classes and provenance", "[data]") {
  TempDir tmp;
  Synth s;
  s.sample = {2, 4, 3};
  s.f32 = true;
  std::string path = tmp.file("ok.h5");
  write_synth(path, s);
  auto info = strata::open_dataset(path);
  CHECK(info.path == path);
  CHECK(info.classes == 5);
  CHECK(info.train.n == 37);
  CHECK(info.train.sample_shape == strata::Shape{2, 4, 3});
  CHECK_FALSE(info.train.images_u8);
  CHECK(info.has_test);
  CHECK(info.test.n == 23);
  CHECK(info.source_sha256.empty());

  SECTION("classes defaults to max(train label) + 1; fixed-length string attribute") {
    Synth t;
    t.classes_attr = false;
    t.n_test = 0;
    std::string p2 = tmp.file("noattr.h5");
    {
      H5Writer w(p2);
      write_split(w, "train", t.n_train, t);
      w.fixed_str_attr("source_sha256", "abc123");
    }
    auto i2 = strata::open_dataset(p2);
    CHECK(i2.classes == 5);
    CHECK_FALSE(i2.has_test);
    CHECK(i2.train.sample_shape == strata::Shape{1, 4, 3});
    CHECK(i2.train.images_u8);
    CHECK(i2.source_sha256 == "abc123");
  }
}

TEST_CASE("rank slices concatenate to the single-rank batch", "[data]") {
  TempDir tmp;
  Synth s;
  std::string path = tmp.file("ranks.h5");
  write_synth(path, s);
  auto info = strata::open_dataset(path);
  const uint64_t seed = 7;

  auto check = [&](const std::string& split, int64_t G, bool shuffle, std::vector<int> all_ranks) {
    Loader one(info, split, G, 0, 1, shuffle, seed);
    int64_t n = split == "train" ? s.n_train : s.n_test;
    int64_t nb = one.batches_per_epoch();
    CHECK(nb == (shuffle ? n / G : (n + G - 1) / G));
    // Reference: two epochs from one rank, checked against the expected sample ids.
    std::vector<Copy> ref;
    for (int64_t e = 0; e < 2; ++e) {
      std::vector<int64_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      if (shuffle) order = strata::epoch_order(n, seed, e);
      for (int64_t i = 0; i < nb; ++i) {
        const auto& b = one.next();
        CHECK(b.epoch == e);
        CHECK(b.index == i);
        int64_t end = std::min(n, (i + 1) * G);
        check_batch(b, std::vector<int64_t>(order.begin() + i * G, order.begin() + end), s);
        ref.push_back(copy(b));
      }
    }
    for (int R : all_ranks) {
      INFO("split " << split << ", global batch " << G << ", ranks " << R);
      std::vector<std::unique_ptr<Loader>> loaders;  // all ranks at once: R reader threads
      for (int r = 0; r < R; ++r)
        loaders.push_back(std::make_unique<Loader>(info, split, G, r, R, shuffle, seed));
      for (const Copy& want : ref) {
        Copy got{{}, {}, {0}, want.epoch, want.index, 0};
        int64_t g = want.shape[0];
        for (int r = 0; r < R; ++r) {
          const auto& b = loaders[r]->next();
          REQUIRE(b.epoch == want.epoch);
          REQUIRE(b.index == want.index);
          CHECK(b.first_sample == r * g / R);
          CHECK(b.x.dim(0) == (r + 1) * g / R - r * g / R);
          CHECK(b.x.shape.size() == 4);
          got.x.insert(got.x.end(), b.x.data(), b.x.data() + b.x.size());
          got.y.insert(got.y.end(), b.y.begin(), b.y.end());
          got.shape[0] += b.x.dim(0);
        }
        got.shape.insert(got.shape.end(), want.shape.begin() + 1, want.shape.end());
        CHECK(got == want);
      }
    }
  };

  SECTION("training, even and uneven splits") {
    check("train", 8, true, {1, 2, 3, 4});
    check("train", 10, true, {3});
  }
  SECTION("evaluation: in order, partial last batch, a rank with no samples") {
    check("test", 10, false, {1, 2, 3, 4});  // last batch has 3 samples: rank 0 of 4 gets none
    check("test", 4, false, {4});
  }
  SECTION("float32 (N, C, H, W) images") {
    Synth f;
    f.f32 = true;
    f.sample = {2, 3, 2};
    std::string p2 = tmp.file("f32.h5");
    write_synth(p2, f);
    auto i2 = strata::open_dataset(p2);
    Loader l(i2, "train", 6, 1, 2, true, 3);
    const auto& b = l.next();
    CHECK(b.x.shape == strata::Shape{3, 2, 3, 2});
    auto order = strata::epoch_order(f.n_train, 3, 0);
    check_batch(b, {order[3], order[4], order[5]}, f);
  }
}

TEST_CASE("large batches read the right rows (many hyperslab runs)", "[data]") {
  TempDir tmp;
  Synth s;
  s.n_train = 1000;
  s.n_test = 0;
  s.sample = {3, 2};
  std::string path = tmp.file("large.h5");
  write_synth(path, s);
  auto info = strata::open_dataset(path);
  for (int R : {1, 3}) {
    for (int r = 0; r < R; ++r) {
      Loader l(info, "train", 500, r, R, true, 5);
      for (int64_t e = 0; e < 2; ++e) {
        auto order = strata::epoch_order(s.n_train, 5, e);
        for (int64_t i = 0; i < 2; ++i) {
          int64_t lo = i * 500 + r * 500 / R, hi = i * 500 + (r + 1) * 500 / R;
          check_batch(l.next(), std::vector<int64_t>(order.begin() + lo, order.begin() + hi), s);
        }
      }
    }
  }
}

TEST_CASE("seek then next gives the batch iteration reaches", "[data]") {
  TempDir tmp;
  Synth s;
  std::string path = tmp.file("seek.h5");
  write_synth(path, s);
  auto info = strata::open_dataset(path);
  Loader a(info, "train", 8, 1, 3, true, 11);
  int64_t nb = a.batches_per_epoch();
  REQUIRE(nb == 4);
  std::vector<Copy> seq;
  for (int64_t k = 0; k < 3 * nb; ++k) seq.push_back(copy(a.next()));
  CHECK(seq[nb].epoch == 1);  // wraps into the next epoch
  CHECK(seq[nb].index == 0);

  Loader b(info, "train", 8, 1, 3, true, 11);
  b.seek(1, 2);
  CHECK(copy(b.next()) == seq[nb + 2]);
  CHECK(copy(b.next()) == seq[nb + 3]);
  CHECK(copy(b.next()) == seq[2 * nb]);
  b.seek(0, 1);  // backwards, with a prefetch in flight
  CHECK(copy(b.next()) == seq[1]);
  b.seek(2, 3);
  b.seek(1, 0);  // the last seek wins
  CHECK(copy(b.next()) == seq[nb]);
  CHECK(copy(b.next()) == seq[nb + 1]);

  CHECK_THAT(user_error([&] { b.seek(0, nb); }), Contains("seek.h5") && Contains("/train"));
}

TEST_CASE("bad data files raise UserError naming file and dataset", "[data]") {
  TempDir tmp;
  Synth s;
  auto open_err = [&](const std::string& name) {
    return user_error([&] { strata::open_dataset(tmp.file(name)); });
  };
  auto labels = [&](int64_t n, int classes) {
    std::vector<int64_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = label_of(i, classes);
    return v;
  };
  std::vector<uint8_t> img(37 * 12, 1);

  CHECK_THAT(open_err("missing.h5"), Contains("missing.h5") && Contains("cannot open") &&
                                         Contains("No such file or directory"));
  {
    std::ofstream(tmp.file("text.h5")) << "not hdf5\n";
    CHECK_THAT(open_err("text.h5"), Contains("text.h5: not an HDF5 file"));
  }
  {
    H5Writer w(tmp.file("nolabels.h5"));
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
  }
  CHECK_THAT(open_err("nolabels.h5"), Contains("nolabels.h5: missing dataset /train/labels"));
  {
    H5Writer w(tmp.file("notrain.h5"));
    w.dataset("/other", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
  }
  CHECK_THAT(open_err("notrain.h5"), Contains("notrain.h5: missing dataset /train/images"));
  {
    H5Writer w(tmp.file("f64.h5"));
    std::vector<double> d(37 * 12);
    w.dataset("/train/images", H5T_NATIVE_DOUBLE, {37, 4, 3}, d.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {37}, labels(37, 5).data());
  }
  CHECK_THAT(open_err("f64.h5"),
             Contains("f64.h5: /train/images has dtype float64; expected uint8 or float32"));
  {
    H5Writer w(tmp.file("flabels.h5"));
    std::vector<float> l(37);
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_FLOAT, {37}, l.data());
  }
  CHECK_THAT(open_err("flabels.h5"),
             Contains("flabels.h5: /train/labels has dtype float32") && Contains("integer"));
  {
    H5Writer w(tmp.file("rows.h5"));
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {36}, labels(36, 5).data());
  }
  CHECK_THAT(open_err("rows.h5"),
             Contains("rows.h5: /train/labels has 36 rows but /train/images has 37"));
  {
    H5Writer w(tmp.file("range.h5"));
    auto l = labels(37, 5);
    l[3] = 5;
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {37}, l.data());
    w.int_attr("classes", 5);
  }
  CHECK_THAT(open_err("range.h5"),
             Contains("range.h5: /train/labels[3] = 5 is out of range [0, 5)"));
  {
    H5Writer w(tmp.file("negative.h5"));
    auto l = labels(37, 5);
    l[36] = -1;
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {37}, l.data());
  }
  CHECK_THAT(open_err("negative.h5"), Contains("negative.h5: /train/labels[36] = -1"));
  {
    H5Writer w(tmp.file("rank2.h5"));
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 12}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {37}, labels(37, 5).data());
  }
  CHECK_THAT(open_err("rank2.h5"),
             Contains("rank2.h5: /train/images has shape (37, 12); expected (N, H, W)"));
  {
    H5Writer w(tmp.file("testshape.h5"));
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {37}, labels(37, 5).data());
    w.dataset("/test/images", H5T_NATIVE_UINT8, {6, 3, 4}, img.data());
    w.dataset("/test/labels", H5T_NATIVE_INT64, {6}, labels(6, 5).data());
  }
  CHECK_THAT(open_err("testshape.h5"),
             Contains("testshape.h5: /test/images has sample shape (1, 3, 4) but /train/images "
                      "has (1, 4, 3)"));
  {
    H5Writer w(tmp.file("testlabels.h5"));
    auto l = labels(6, 5);
    l[2] = 9;
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {37}, labels(37, 5).data());
    w.dataset("/test/images", H5T_NATIVE_UINT8, {6, 4, 3}, img.data());
    w.dataset("/test/labels", H5T_NATIVE_INT64, {6}, l.data());
  }
  CHECK_THAT(open_err("testlabels.h5"),
             Contains("testlabels.h5: /test/labels[2] = 9 is out of range [0, 5)"));
  {
    H5Writer w(tmp.file("testnolabels.h5"));
    w.dataset("/train/images", H5T_NATIVE_UINT8, {37, 4, 3}, img.data());
    w.dataset("/train/labels", H5T_NATIVE_INT64, {37}, labels(37, 5).data());
    w.dataset("/test/images", H5T_NATIVE_UINT8, {6, 4, 3}, img.data());
  }
  CHECK_THAT(open_err("testnolabels.h5"),
             Contains("testnolabels.h5: missing dataset /test/labels"));

  // Loader arguments the user controls.
  write_synth(tmp.file("ok.h5"), s);
  auto info = strata::open_dataset(tmp.file("ok.h5"));
  CHECK_THAT(user_error([&] { Loader l(info, "train", 3, 0, 4, true, 0); }),
             Contains("global batch 3") && Contains("4 ranks"));
  CHECK_THAT(user_error([&] { Loader l(info, "train", 38, 0, 1, true, 0); }),
             Contains("ok.h5") && Contains("38") && Contains("/train"));
  Synth no_test;
  no_test.n_test = 0;
  write_synth(tmp.file("notest.h5"), no_test);
  auto info2 = strata::open_dataset(tmp.file("notest.h5"));
  CHECK_THAT(user_error([&] { Loader l(info2, "test", 4, 0, 1, false, 0); }),
             Contains("notest.h5: has no /test split"));
}

TEST_CASE("a read error in the loader thread reaches next()", "[data]") {
  TempDir tmp;
  // Images stored in an external raw file, which disappears before the first read.
  std::string raw = tmp.file("images.raw"), path = tmp.file("external.h5");
  Synth s;
  int64_t bytes = s.n_train * sample_elems(s);
  std::vector<uint8_t> img(bytes, 7);
  {
    H5Writer w(path);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    REQUIRE(H5Pset_external(dcpl, raw.c_str(), 0, hsize_t(bytes)) >= 0);
    w.dataset("/train/images", H5T_NATIVE_UINT8, {hsize_t(s.n_train), 4, 3}, img.data(), dcpl);
    H5Pclose(dcpl);
    std::vector<int64_t> l(s.n_train, 1);
    w.dataset("/train/labels", H5T_NATIVE_INT64, {hsize_t(s.n_train)}, l.data());
  }
  auto info = strata::open_dataset(path);
  {
    Loader ok(info, "train", 8, 0, 1, true, 0);
    CHECK(ok.next().x[0] == 7.0f / 255.0f);
  }
  fs::remove(raw);
  Loader l(info, "train", 8, 0, 1, true, 0);
  CHECK_THROWS_WITH(l.next(), Contains("external.h5") && Contains("H5Dread"));
  CHECK_THROWS_WITH(l.next(), Contains("external.h5"));  // retried, fails again
  l.seek(0, 1);
  CHECK_THROWS(l.next());
}

namespace {

// Writes an IDX file of unsigned bytes, gzip'ed; data_bytes < product(dims) truncates it.
void write_idx_gz(const std::string& path, std::vector<uint32_t> dims, const std::vector<uint8_t>& data,
                  uint8_t magic_type = 0x08) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f);
  std::vector<uint8_t> head{0, 0, magic_type, uint8_t(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) head.push_back(uint8_t(d >> s));
  gzwrite(f, head.data(), unsigned(head.size()));
  if (!data.empty()) gzwrite(f, data.data(), unsigned(data.size()));
  gzclose(f);
}

// A tiny Fashion-MNIST-shaped source directory: 6 train and 3 test images of 4x5.
void write_sources(const fs::path& dir) {
  fs::create_directories(dir);
  auto images = [](int n) {
    std::vector<uint8_t> v(n * 20);
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < 20; ++p) v[i * 20 + p] = pixel(i, p);
    return v;
  };
  auto labels = [](int n) {
    std::vector<uint8_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = uint8_t(label_of(i, 10));
    return v;
  };
  write_idx_gz((dir / "train-images-idx3-ubyte.gz").string(), {6, 4, 5}, images(6));
  write_idx_gz((dir / "train-labels-idx1-ubyte.gz").string(), {6}, labels(6));
  write_idx_gz((dir / "t10k-images-idx3-ubyte.gz").string(), {3, 4, 5}, images(3));
  write_idx_gz((dir / "t10k-labels-idx1-ubyte.gz").string(), {3}, labels(3));
}

const std::array<const char*, 4> kSources = {
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz"};

// What prepare.h documents source_sha256 to be: sha256sum's listing of the four, hashed.
std::string combined_sha(const fs::path& dir) {
  TempDir tmp;
  std::string listing;
  for (const char* f : kSources) listing += strata::sha256_file((dir / f).string()) + "  " + f + "\n";
  std::ofstream(tmp.file("listing")) << listing;
  return strata::sha256_file(tmp.file("listing"));
}

}  // namespace

TEST_CASE("sha256_file", "[data][prepare]") {
  TempDir tmp;
  std::ofstream(tmp.file("abc")) << "abc";
  CHECK(strata::sha256_file(tmp.file("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::ofstream(tmp.file("empty")).flush();
  CHECK(strata::sha256_file(tmp.file("empty")) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK_THAT(user_error([&] { strata::sha256_file(tmp.file("nope")); }),
             Contains("nope: cannot open (No such file or directory)"));
}

TEST_CASE("prepare_fashion_mnist on synthetic IDX files", "[data][prepare]") {
  TempDir tmp;
  fs::path src = tmp.path / "src";
  write_sources(src);
  std::string out = tmp.file("fm.h5");
  strata::prepare_fashion_mnist(src.string(), out);

  auto info = strata::open_dataset(out);
  CHECK(info.classes == 10);
  CHECK(info.train.n == 6);
  CHECK(info.test.n == 3);
  CHECK(info.train.sample_shape == strata::Shape{1, 4, 5});
  CHECK(info.train.images_u8);
  CHECK(info.source_sha256 == combined_sha(src));
  Synth s;
  s.sample = {4, 5};
  s.classes = 10;
  Loader l(info, "test", 3, 0, 1, false, 0);
  check_batch(l.next(), {0, 1, 2}, s);
  // Nothing but the output is left in the directory.
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(tmp.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"fm.h5", "src"});

  SECTION("bad inputs name the file and leave no output") {
    std::string bad_out = tmp.file("bad.h5");
    auto prep_err = [&] {
      return user_error([&] { strata::prepare_fashion_mnist(src.string(), bad_out); });
    };
    SECTION("missing file") {
      fs::remove(src / "t10k-labels-idx1-ubyte.gz");
      CHECK_THAT(prep_err(), Contains("t10k-labels-idx1-ubyte.gz: cannot open"));
    }
    SECTION("bad magic") {
      write_idx_gz((src / "train-labels-idx1-ubyte.gz").string(), {6}, std::vector<uint8_t>(6),
                   0x0D);
      CHECK_THAT(prep_err(), Contains("train-labels-idx1-ubyte.gz: bad IDX magic 00000d01"));
    }
    SECTION("wrong number of dimensions") {
      write_idx_gz((src / "train-images-idx3-ubyte.gz").string(), {6, 20},
                   std::vector<uint8_t>(120));
      CHECK_THAT(prep_err(), Contains("train-images-idx3-ubyte.gz: bad IDX magic"));
    }
    SECTION("truncated data") {
      write_idx_gz((src / "t10k-images-idx3-ubyte.gz").string(), {3, 4, 5},
                   std::vector<uint8_t>(50));
      CHECK_THAT(prep_err(), Contains("t10k-images-idx3-ubyte.gz: truncated") &&
                                 Contains("60 bytes of data, found 50"));
    }
    SECTION("truncated gzip stream") {
      auto path = src / "train-images-idx3-ubyte.gz";
      fs::resize_file(path, fs::file_size(path) / 2);
      CHECK_THAT(prep_err(), Contains("train-images-idx3-ubyte.gz"));
    }
    SECTION("counts differ") {
      write_idx_gz((src / "t10k-labels-idx1-ubyte.gz").string(), {2}, std::vector<uint8_t>(2));
      CHECK_THAT(prep_err(), Contains("t10k-labels-idx1-ubyte.gz: has 2 labels but") &&
                                 Contains("t10k-images-idx3-ubyte.gz has 3 images"));
    }
    SECTION("label out of range") {
      write_idx_gz((src / "train-labels-idx1-ubyte.gz").string(), {6}, {0, 1, 2, 10, 4, 5});
      CHECK_THAT(prep_err(),
                 Contains("train-labels-idx1-ubyte.gz: label[3] = 10 is out of range [0, 10)"));
    }
    SECTION("output directory missing") {
      bad_out = (tmp.path / "no_such_dir" / "x.h5").string();
      CHECK_THAT(prep_err(), Contains("x.h5: output directory") && Contains("no_such_dir") &&
                                 Contains("does not exist"));
    }
    CHECK_FALSE(fs::exists(bad_out));
    for (auto& e : fs::directory_iterator(tmp.path))
      CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  }
}

namespace {
const char* kFashionDir = "/usr/share/datasets/fashion-mnist";
}

TEST_CASE("prepare_fashion_mnist on the Debian files", "[data][prepare]") {
  if (!fs::is_directory(kFashionDir))
    STRATA_SKIP(kFashionDir << " is absent (apt install dataset-fashion-mnist)");
  TempDir tmp;
  std::string out = tmp.file("fashion-mnist.h5");
  strata::prepare_fashion_mnist(kFashionDir, out);
  auto info = strata::open_dataset(out);
  CHECK(info.classes == 10);
  CHECK(info.train.n == 60000);
  CHECK(info.test.n == 10000);
  CHECK(info.train.sample_shape == strata::Shape{1, 28, 28});
  CHECK(info.test.sample_shape == strata::Shape{1, 28, 28});

  // Digests agree with coreutils.
  for (const char* f : kSources) {
    std::string path = fmt::format("{}/{}", kFashionDir, f);
    CHECK(strata::sha256_file(path) ==
          run_command(fmt::format("sha256sum '{}' | cut -d' ' -f1", path)));
  }
  CHECK(info.source_sha256 ==
        run_command(fmt::format("cd '{}' && sha256sum {} {} {} {} | sha256sum | cut -d' ' -f1",
                                kFashionDir, kSources[0], kSources[1], kSources[2], kSources[3])));

  // First labels and pixels agree with Python's own reading of the IDX files (a part skipped,
  // and said so, where there is no Python: tests/skip_reasons.py lists it).
  if (!fs::exists("/usr/bin/python3")) {
    std::printf("skipped: labels and pixels against Python's reading: no /usr/bin/python3\n");
  } else {
    std::string py = run_command(fmt::format(
        "/usr/bin/python3 -c \"import gzip; l=gzip.open('{0}/t10k-labels-idx1-ubyte.gz').read()"
        "[8:]; i=gzip.open('{0}/t10k-images-idx3-ubyte.gz').read()[16:]; "
        "print(' '.join(str(b) for b in l[:5]), sum(i[:784]), sum(i[784:1568]))\"",
        kFashionDir));
    Loader l(info, "test", 5, 0, 1, false, 0);
    const auto& b = l.next();
    std::string mine;
    for (int32_t y : b.y) mine += fmt::format("{} ", y);
    for (int k = 0; k < 2; ++k) {
      long sum = 0;
      for (int p = 0; p < 784; ++p) sum += std::lround(b.x[k * 784 + p] * 255.0f);
      mine += fmt::format("{}{}", sum, k ? "" : " ");
    }
    CHECK(mine == py);
  }
}

// Hidden benchmark: `strata_unit_tests "[bench]"`. The consumer does no work, so the time per
// next() is the reader's time per batch (hyperslab read + un-permute + convert) plus hand-off.
TEST_CASE("loader batch read time on Fashion-MNIST", "[.][bench]") {
  if (!fs::is_directory(kFashionDir))
    STRATA_SKIP(kFashionDir << " is absent (apt install dataset-fashion-mnist)");
  TempDir tmp;
  std::string out = tmp.file("fashion-mnist.h5");
  strata::prepare_fashion_mnist(kFashionDir, out);
  auto info = strata::open_dataset(out);
  for (int64_t G : {64, 256, 1024}) {
    Loader l(info, "train", G, 0, 1, true, 1);
    int64_t reps = std::max<int64_t>(l.batches_per_epoch(), 2000);
    l.next();  // warm up (first epoch order, page cache)
    std::vector<double> us(reps);
    for (auto& t : us) {
      auto t0 = std::chrono::steady_clock::now();
      l.next();
      t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    double mean = std::accumulate(us.begin(), us.end(), 0.0) / double(reps);
    std::sort(us.begin(), us.end());
    WARN(fmt::format("global batch {}: per batch median {:.0f} us, min {:.0f} us, mean {:.0f} us "
                     "({} batches)",
                     G, us[reps / 2], us[0], mean, reps));
  }
}
