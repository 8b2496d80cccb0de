// The per-rank batch loader (data.h).
#include "data/data.h"

#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/parse.h"
#include "data/h5_datasets.h"
#include "data/token_source.h"
#include "strata/error.h"
#include "strata/kernels_cpu.h"
#include "strata/rng.h"

namespace strata {
namespace {

// Splits up to this many MiB of image data per rank are read into memory whole (see Loader);
// STRATA_DATA_CACHE_MB overrides it (0: always read batch by batch from the file).
constexpr int64_t kDefaultCacheMiB = 512;

int64_t cache_budget_bytes() {
  // MiB; 0 disables the cache. At most 1 TiB, so the byte count cannot overflow.
  return env_int("STRATA_DATA_CACHE_MB", 0, int64_t(1) << 20).value_or(kDefaultCacheMiB) << 20;
}

}  // namespace

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(size_t(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), int64_t(0));
  Rng rng(hash_combine(seed, uint64_t(epoch)));
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(uint64_t(i) + 1)]);
  return order;
}

// The whole split in memory, on huge pages where the kernel gives them (transparent huge
// pages in "madvise" mode, Debian's default): a shuffled batch gathers rows scattered over
// tens of MB, and on 4 KiB pages each row also missed the TLB. A split under 4 MiB stays on
// small pages (the TLB covers it; a huge page would add up to 2 MiB to the resident set).
namespace {
class RowMemory {
 public:
  void allocate(size_t n) {
    release();
    constexpr size_t kHuge = size_t(2) << 20;
    const bool huge = n >= 2 * kHuge;
    const size_t cap = huge ? (n + kHuge - 1) / kHuge * kHuge : std::max<size_t>(n, 1);
    void* p = huge ? std::aligned_alloc(kHuge, cap) : std::malloc(cap);
    if (!p) throw std::bad_alloc();
    if (huge) (void)madvise(p, cap, MADV_HUGEPAGE);  // a hint: 4 KiB pages if refused
    p_.reset(static_cast<unsigned char*>(p));  // filled by the caller's read
  }
  void release() { p_.reset(); }
  unsigned char* data() { return p_.get(); }
  const unsigned char* data() const { return p_.get(); }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> p_;
};
}  // namespace

// ---------------------------------------------------------------- Loader

// Two modes. In memory (the split fits the cache budget): no thread; next() gathers the batch
// (req_epoch, req_index) from all_rows into slots[0] itself. Streaming, with a reader thread:
// the consumer owns slots[front]; the reader thread fills slots[front ^ 1] with the
// batch requested by (req_epoch, req_index). Each request has a generation number; the reader
// publishes done_gen when it finishes one, so a seek() while a read is in flight just bumps the
// generation and the stale result is discarded.
struct Loader::Impl {
  // Fixed after construction.
  std::string path, split;
  int64_t n = 0, global_batch = 0, batches = 0;
  int rank = 0, ranks = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  Shape sample_shape;
  int64_t sample_elems = 0;
  bool u8 = true;
  std::vector<int32_t> labels;
  H5Id file, images, file_space;  // images: used under hdf5_mutex(), by the reader thread only
  std::vector<hsize_t> dims;      // of the images dataset
  std::string where;              // the split in messages: "/train", or "/val/tokens"

  // Token data: "row" i is the window tokens[i*T, i*T + T + 1), so consecutive rows share
  // one token. Stored at their own width (token_bytes) in all_rows and staging. Read from
  // `source` (an HDF5 dataset or token shards), by the reader thread only once it runs.
  bool tokens = false;
  int64_t T = 0, n_tokens = 0, vocab = 0;
  size_t token_bytes = 0;  // 1, 2, 4: uint8, uint16, int32
  std::unique_ptr<TokenSource> source;

  // Reader-thread scratch.
  int64_t order_epoch = -1;
  std::vector<int64_t> order, ids;
  std::vector<std::pair<int64_t, int64_t>> sorted;  // (row in file, position in batch)
  std::vector<std::pair<hsize_t, hsize_t>> runs;    // (first row, rows) of consecutive rows
  TokenRanges ranges;                               // token data: the runs' tokens
  std::vector<unsigned char> staging;

  // In-memory mode: the whole split's images as stored (uint8 or float32), read once at
  // construction. Then next() gathers its rows from here on the calling thread, and there is
  // no reader thread and no HDF5 call after the constructor.
  bool in_memory = false;
  RowMemory all_rows;

  // Shared, under m.
  std::mutex m;
  std::condition_variable cv;
  Batch slots[2];
  int front = 0;
  int64_t req_epoch = 0, req_index = 0;
  uint64_t req_gen = 1, done_gen = 0;
  std::exception_ptr error;
  bool stop = false;
  std::thread reader;

  struct Slice {
    int64_t begin, count, first;  // positions in the epoch order; offset within the batch
  };
  Slice slice(int64_t index) const {
    int64_t start = index * global_batch;
    int64_t g = shuffle ? global_batch : std::min(global_batch, n - start);
    int64_t lo = rank * g / ranks, hi = (rank + 1) * g / ranks;
    return {start + lo, hi - lo, lo};
  }

  // An images split (the caller holds hdf5_mutex()).
  void open_images(const DatasetInfo& info, const SplitInfo& want) {
    file = open_h5(path);
    Split s = read_split(path, file.get(), split);
    if (s.info.n != want.n || s.info.sample_shape != want.sample_shape ||
        s.info.images_u8 != want.images_u8)
      fail_input("{}: /{} changed since it was opened", path, split);
    check_labels(path, split, s.labels, info.classes);
    labels.assign(s.labels.begin(), s.labels.end());
    images = std::move(s.images.id);
    dims = s.images.dims;
    file_space = H5Id(H5_CHECK(H5Dget_space(images.get())), H5Sclose);
  }

  void close() {
    source.reset();  // takes hdf5_mutex() itself where it needs it
    std::lock_guard lock(hdf5_mutex());
    file_space.reset();
    images.reset();
    file.reset();
  }

  // Images: the rows in `sorted` as a union of hyperslabs, one per run of consecutive rows, so
  // HDF5 reads each run with one request. HDF5 1.10 makes each OR cost time proportional to the selection
  // so far, so adding runs one by one is quadratic (17 ms for 1024 rows); OR-ing halves
  // recursively with H5Scombine_select stays near-linear (0.8 ms).
  H5Id select_runs(size_t lo, size_t hi) const {
    if (hi - lo <= 8) {
      H5Id space(H5_CHECK(H5Scopy(file_space.get())), H5Sclose);
      std::vector<hsize_t> start(dims.size(), 0), count = dims;
      for (size_t i = lo; i < hi; ++i) {
        start[0] = runs[i].first;
        count[0] = runs[i].second;
        H5_CHECK(H5Sselect_hyperslab(space.get(), i == lo ? H5S_SELECT_SET : H5S_SELECT_OR,
                                     start.data(), nullptr, count.data(), nullptr));
      }
      return space;
    }
    size_t mid = lo + (hi - lo) / 2;
    H5Id a = select_runs(lo, mid), b = select_runs(mid, hi);
    return H5Id(H5_CHECK(H5Scombine_select(a.get(), H5S_SELECT_OR, b.get())), H5Sclose);
  }

  // Reads rows ids[0..count) of the images into x (batch order), scaling uint8 by 1/255; or
  // for token files the windows ids[0..count) into x and y.
  void read_rows(float* x, int32_t* y) {
    int64_t count = int64_t(ids.size());
    if (count == 0) return;
    sorted.resize(count);
    for (int64_t k = 0; k < count; ++k) sorted[k] = {ids[k], k};
    std::sort(sorted.begin(), sorted.end());
    runs.clear();
    for (int64_t a = 0, b; a < count; a = b) {
      for (b = a + 1; b < count && sorted[b].first == sorted[b - 1].first + 1;) ++b;
      runs.push_back({hsize_t(sorted[a].first), hsize_t(b - a)});
    }
    // A run of token windows [a, a + k) is the k*T + 1 tokens from a*T; runs never touch
    // (a gap of at least one window lies between), so each token is read once.
    hsize_t total = 0;
    for (const auto& r : runs) total += tokens ? r.second * T + 1 : r.second * sample_elems;
    staging.resize(total * elem_bytes());
    if (tokens) {
      ranges.clear();
      for (const auto& r : runs)
        ranges.push_back({int64_t(r.first) * T, int64_t(r.first + r.second) * T + 1});
      source->read(ranges, staging.data());
    } else {
      std::lock_guard lock(hdf5_mutex());
      H5Id rows = select_runs(0, runs.size());
      H5Id mem(H5_CHECK(H5Screate_simple(1, &total, nullptr)), H5Sclose);
      H5_CHECK(H5Dread(images.get(), mem_type(), mem.get(), rows.get(), H5P_DEFAULT,
                       staging.data()));
    }
    // staging holds the rows in file order; put each where the batch wants it.
    if (tokens) {
      size_t j = 0, at = 0;  // at: the run's first token in staging
      for (const auto& r : runs) {
        for (hsize_t q = 0; q < r.second; ++q, ++j)
          window_to_xy(staging.data() + (at + q * T) * token_bytes, sorted[j].first,
                       x + sorted[j].second * T, y + sorted[j].second * T);
        at += r.second * T + 1;
      }
      return;
    }
    const size_t rb = row_bytes();
    for (int64_t j = 0; j < count; ++j)
      convert_row(x + sorted[j].second * sample_elems, staging.data() + j * rb);
  }

  size_t elem_bytes() const { return tokens ? token_bytes : u8 ? 1 : sizeof(float); }
  hid_t mem_type() const { return u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT; }  // images
  // Bytes from one row's start to the next's in all_rows (a token window is one more).
  size_t row_bytes() const { return size_t(sample_elems) * elem_bytes(); }
  size_t row_span() const { return tokens ? (size_t(T) + 1) * token_bytes : row_bytes(); }
  double split_bytes() const {
    return double(tokens ? n_tokens : n) * double(tokens ? token_bytes : row_bytes());
  }

  // Token window `row` (its T + 1 tokens at w, stored width) -> x[0, T) the inputs as floats,
  // y[0, T) the next tokens. Checks the ids again: the file may have changed since it was
  // validated, and an id out of range would index past the embedding table.
  template <typename Tok>
  void window_as(const unsigned char* w, int64_t row, float* x, int32_t* y) const {
    auto id = [&](int64_t i) {
      Tok t;
      std::memcpy(&t, w + i * int64_t(sizeof(Tok)), sizeof(Tok));
      const int64_t v = int64_t(t);
      if (v < 0 || v >= vocab)
        fail_input("{} = {} is out of range [0, {})", source->where(row * T + i), v, vocab);
      return v;
    };
    int64_t cur = id(0);
    for (int64_t i = 0; i < T; ++i) {
      const int64_t next = id(i + 1);
      x[i] = float(cur);
      y[i] = int32_t(next);
      cur = next;
    }
  }
  void window_to_xy(const unsigned char* w, int64_t row, float* x, int32_t* y) const {
    if (token_bytes == 1) window_as<uint8_t>(w, row, x, y);
    else if (token_bytes == 2) window_as<uint16_t>(w, row, x, y);
    else window_as<int32_t>(w, row, x, y);
  }

  // One stored row -> floats (uint8 scaled by 1/255, float32 copied).
  void convert_row(float* dst, const unsigned char* src) const {
    if (u8) cpu::u8_to_unit_float(dst, src, sample_elems);
    else std::memcpy(dst, src, row_bytes());
  }

  // Reads the whole split's images (the caller holds hdf5_mutex()) or tokens into all_rows.
  void load_all() {
    all_rows.allocate(size_t(split_bytes()));
    if (tokens) source->read({{0, n_tokens}}, all_rows.data());
    else H5_CHECK(H5Dread(images.get(), mem_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, all_rows.data()));
  }

  // Rows ids[0..count) from memory into x (token files: and y), in batch order. The rows a
  // few ahead are fetched while this one converts: one row's lines at a time left the memory's
  // latency exposed row after row (a 64-row Fashion-MNIST batch waited 35 us on DRAM, 5 % of
  // the MLP's step; with this and huge pages, 15 us). Fetching the next batch at the end of
  // next() gained nothing on Zen 4; on Zen 5, with prefetcht2 (prefetch_batch), the MLP's step
  // ran 1.025x (the median of 12 alternating runs, 11 faster).
  void gather_rows(float* x, int32_t* y) const {
    constexpr size_t kAhead = 4;
    for (size_t k = 0; k < std::min(kAhead, ids.size()); ++k) fetch_row<3>(ids[k]);
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k + kAhead < ids.size()) fetch_row<3>(ids[k + kAhead]);
      const unsigned char* row = all_rows.data() + size_t(ids[k]) * row_bytes();
      if (tokens) window_to_xy(row, ids[k], x + int64_t(k) * T, y + int64_t(k) * T);
      else convert_row(x + int64_t(k) * sample_elems, row);
    }
  }

  // The rows of batch `index` of this epoch's order towards the outer caches (prefetcht2) while
  // the step before it runs: its gather then finds them nearer than memory.
  void prefetch_batch(int64_t epoch, int64_t index) const {
    if (!shuffle || order_epoch != epoch || index >= batches) return;
    const Slice s = slice(index);
    for (int64_t k = 0; k < s.count; ++k) fetch_row<1>(order[size_t(s.begin + k)]);
  }

  // Every cache line stored row `id` touches (784-byte rows start anywhere in one), towards
  // the cache level `Locality` names (__builtin_prefetch's: 3 the nearest, 1 the outer ones).
  template <int Locality>
  void fetch_row(int64_t id) const {
    const auto r = reinterpret_cast<uintptr_t>(all_rows.data() + size_t(id) * row_bytes());
    for (uintptr_t line = r & ~uintptr_t(63); line < r + row_span(); line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, Locality);
  }

  void fill(Batch& b, int64_t epoch, int64_t index) {
    Slice s = slice(index);
    ids.resize(s.count);
    if (shuffle) {
      if (order_epoch != epoch) {
        order = epoch_order(n, seed, epoch);
        order_epoch = epoch;
      }
      std::copy_n(order.begin() + s.begin, s.count, ids.begin());
    } else {
      std::iota(ids.begin(), ids.end(), s.begin);
    }
    b.epoch = epoch;
    b.index = index;
    b.first_sample = s.first;
    b.x.resize(batched(s.count, sample_shape));
    if (tokens) {
      b.y.resize(size_t(s.count * T));  // filled with x from the windows
    } else {
      b.y.resize(s.count);
      for (int64_t k = 0; k < s.count; ++k) b.y[k] = labels[ids[k]];
    }
    if (in_memory) gather_rows(b.x.data(), b.y.data());
    else with_file_context(path, [&] { read_rows(b.x.data(), b.y.data()); });
  }

  void run() {
    AllocationScope scope("the data loader's batches");
    std::unique_lock lk(m);
    for (;;) {
      cv.wait(lk, [&] { return stop || done_gen != req_gen; });
      if (stop) return;
      uint64_t gen = req_gen;
      int64_t epoch = req_epoch, index = req_index;
      Batch& dst = slots[front ^ 1];
      lk.unlock();
      std::exception_ptr err;
      try {
        fill(dst, epoch, index);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      done_gen = gen;
      error = gen == req_gen ? err : nullptr;
      cv.notify_all();
    }
  }
};

Loader::Loader(const DatasetInfo& info, const std::string& split, int64_t global_batch, int rank,
               int ranks, bool shuffle, uint64_t seed)
    : impl_(nullptr) {
  STRATA_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {}", rank, ranks);
  STRATA_CHECK(!info.tokens || info.context > 0,
               "{}: a token file needs set_context before a Loader reads it", info.path);
  const SplitInfo* s = split == "train"                  ? &info.train
                       : split == "test" && info.has_test ? &info.test
                                                          : nullptr;
  const std::string where = !info.tokens ? "/" + split
                            : s          ? s->dataset
                            : split == "test" ? std::string("/val/tokens")
                                              : "/" + split + "/tokens";
  if (!s) fail_input("{}: has no {} split", info.path, where);
  if (global_batch < ranks)
    fail_input("global batch {} is smaller than the {} ranks; every rank needs a sample",
               global_batch, ranks);
  if (shuffle && global_batch > s->n)
    fail_input("{}: global batch {} exceeds the {} samples of {}{}", info.path, global_batch,
               s->n, where,
               info.tokens ? fmt::format(" (windows of model.context = {} tokens)", info.context)
                           : "");
  auto p = std::make_unique<Impl>();
  p->path = info.path;
  p->split = split;
  p->where = where;
  p->tokens = info.tokens;
  p->T = info.context;
  p->n_tokens = s->tokens;
  p->vocab = info.vocab;
  p->n = s->n;
  p->global_batch = global_batch;
  p->batches = shuffle ? s->n / global_batch : (s->n + global_batch - 1) / global_batch;
  p->rank = rank;
  p->ranks = ranks;
  p->shuffle = shuffle;
  p->seed = seed;
  p->sample_shape = s->sample_shape;
  p->sample_elems = numel(s->sample_shape);
  p->u8 = s->images_u8;
  const int64_t budget = cache_budget_bytes();
  try {
    // Opened here, before the reader starts; from then on only the reader uses them.
    if (p->tokens) {
      p->source = open_token_source(info, *s);
      p->token_bytes = p->source->token_bytes();
    }
    std::unique_lock lock(hdf5_mutex(), std::defer_lock);
    if (!p->tokens) {
      lock.lock();
      h5_quiet();
      with_file_context(info.path, [&] { p->open_images(info, *s); });
    }
    // A split that fits the budget is read once, whole: each batch is then a gather from
    // memory on the caller's thread (15 us for 64 Fashion-MNIST rows, where a
    // hyperslab read of 64 scattered rows costs a reader thread 0.1-0.2 ms of the other
    // core). Which rows a rank uses is unchanged. If that read fails, the loader streams
    // instead, so a damaged file reports its error at the batch that needs the bad rows.
    if (p->split_bytes() <= double(budget)) {
      bool loaded = false;
      try {
        p->load_all();
        loaded = true;
      } catch (const std::exception&) {  // a read error, or no memory for the split: streamed
        p->all_rows.release();
      }
      if (loaded) {
        p->in_memory = true;
        p->file_space.reset();
        p->images.reset();
        p->file.reset();
        if (lock.owns_lock()) lock.unlock();
        if (p->source) p->source->close();  // kept: it names a token in messages
      }
    }
    if (lock.owns_lock()) lock.unlock();
    if (!p->in_memory) {
      Impl* impl = p.get();
      p->reader = std::thread([impl] { impl->run(); });
    }
  } catch (...) {
    p->close();
    throw;
  }
  impl_ = p.release();
}

Loader::~Loader() {
  {
    std::lock_guard lk(impl_->m);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->reader.joinable()) impl_->reader.join();
  impl_->close();
  delete impl_;
}

int64_t Loader::batches_per_epoch() const { return impl_->batches; }

void Loader::seek(int64_t epoch, int64_t batch) {
  Impl& m = *impl_;
  if (epoch < 0 || batch < 0 || batch >= m.batches)
    fail_input("{}: cannot seek to batch {} of epoch {}: {} has {} batches per epoch at global "
               "batch {}",
               m.path, batch, epoch, m.where, m.batches, m.global_batch);
  std::lock_guard lk(m.m);
  m.req_epoch = epoch;
  m.req_index = batch;
  ++m.req_gen;
  m.error = nullptr;
  m.cv.notify_all();
}

const Loader::Batch& Loader::next() {
  Impl& m = *impl_;
  if (m.in_memory) {  // no reader thread: gather the requested batch here
    m.fill(m.slots[0], m.req_epoch, m.req_index);
    m.prefetch_batch(m.req_epoch, m.req_index + 1);
    const bool last = m.req_index + 1 == m.batches;
    m.req_epoch += last ? 1 : 0;
    m.req_index = last ? 0 : m.req_index + 1;
    return m.slots[0];
  }
  std::unique_lock lk(m.m);
  m.cv.wait(lk, [&] { return m.done_gen == m.req_gen; });
  if (m.error) {
    // Ask for the same batch again, so a later call retries rather than skipping it.
    std::exception_ptr err = std::exchange(m.error, nullptr);
    ++m.req_gen;
    m.cv.notify_all();
    std::rethrow_exception(err);
  }
  m.front ^= 1;
  bool last = m.req_index + 1 == m.batches;
  m.req_epoch += last ? 1 : 0;
  m.req_index = last ? 0 : m.req_index + 1;
  ++m.req_gen;
  m.cv.notify_all();
  return m.slots[m.front];
}

}  // namespace strata
