// Tracer: which steps it records, and that its file is valid Chrome trace JSON.
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "comm/trace.h"
#include "strata/comm.h"
#include "strata/error.h"

namespace fs = std::filesystem;
using strata::Tracer;

namespace {

// A JSON value and a strict little parser for it: enough to prove the file parses and to read
// back what was written (escapes included), without a JSON library in the build.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string str;
  std::vector<Json> array;
  std::map<std::string, Json> object;
  const Json& operator[](const std::string& key) const {
    auto it = object.find(key);
    if (it == object.end()) FAIL("no key " << key);
    return it->second;
  }
  bool has(const std::string& key) const { return object.count(key) > 0; }
};

class JsonParser {
 public:
  explicit JsonParser(std::string text) : s_(std::move(text)) {}
  Json parse() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("trailing text");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) { throw std::runtime_error(fmt::format("JSON: {} at {}", what, i_)); }
  void skip() { while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_; }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) { if (!eat(c)) fail("unexpected character"); }
  Json value() {
    Json v;
    skip();
    if (i_ >= s_.size()) fail("end of text");
    const char c = s_[i_];
    if (eat('{')) {
      v.kind = Json::kObject;
      if (eat('}')) return v;
      do {
        skip();
        std::string key = string();
        expect(':');
        v.object[key] = value();
      } while (eat(','));
      expect('}');
    } else if (eat('[')) {
      v.kind = Json::kArray;
      if (eat(']')) return v;
      do v.array.push_back(value()); while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::kString;
      v.str = string();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::kBool;
      v.number = c == 't';
      i_ += c == 't' ? 4 : 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      size_t n = 0;
      v.kind = Json::kNumber;
      v.number = std::stod(s_.substr(i_, 40), &n);  // throws on a non-number
      i_ += n;
    }
    return v;
  }
  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    std::string out;
    for (++i_; i_ < s_.size() && s_[i_] != '"'; ++i_) {
      const char c = s_[i_];
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') { out += c; continue; }
      if (++i_ >= s_.size()) fail("end in an escape");
      switch (s_[i_]) {
        case '"': case '\\': case '/': out += s_[i_]; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {  // the writer escapes only control characters this way
          if (i_ + 4 >= s_.size()) fail("short \\u escape");
          out += char(std::stoi(s_.substr(i_ + 1, 4), nullptr, 16));
          i_ += 4;
          break;
        }
        default: fail("bad escape");
      }
    }
    if (i_++ >= s_.size()) fail("unterminated string");
    return out;
  }
  std::string s_;
  size_t i_ = 0;
};

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / fmt::format("strata_test_trace_{}_{}", ::getpid(), name)).string();
}

Json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return JsonParser(ss.str()).parse();
}

std::vector<const Json*> complete_events(const Json& trace) {
  std::vector<const Json*> out;
  for (const Json& e : trace["traceEvents"].array)
    if (e["ph"].str == "X") out.push_back(&e);
  return out;
}

}  // namespace

TEST_CASE("tracer records only the steps of its window", "[trace]") {
  auto comm = strata::make_single_comm();
  Tracer t(2, 2);  // steps 2 and 3
  REQUIRE(t.enabled());
  t.set_origin();
  for (int64_t step = 0; step < 6; ++step) {
    t.begin_step(step);
    CHECK(t.recording() == (step == 2 || step == 3));
    const auto t0 = Tracer::Clock::now();
    t.span("compute", fmt::format("forward s{}", step), t0, Tracer::Clock::now(), 1);
    Tracer::Scope scope(t, "optimizer", fmt::format("adamw s{}", step));
  }
  const std::string path = temp_path("window.json");
  REQUIRE(t.write(*comm, path, "rank 0 · stage 0 · replica 0 · host a") == 4);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  const Json trace = read_json(path);
  CHECK(trace["displayTimeUnit"].str == "ms");
  const auto spans = complete_events(trace);
  REQUIRE(spans.size() == 4);
  std::vector<std::string> names;
  for (const Json* e : spans) {
    const Json& a = (*e)["args"];
    const int64_t step = int64_t(a["step"].number);
    CHECK((step == 2 || step == 3));
    names.push_back((*e)["name"].str);
    CHECK((*e)["ts"].number >= 0);
    CHECK((*e)["dur"].number >= 0);
    CHECK((*e)["pid"].number == 0);
    CHECK((*e)["tid"].number == 0);
    // micro is written only when the span has one.
    if ((*e)["cat"].str == "compute") CHECK(a["micro"].number == 1);
    else CHECK_FALSE(a.has("micro"));
  }
  CHECK(names == std::vector<std::string>{"forward s2", "adamw s2", "forward s3", "adamw s3"});

  // The row's metadata: its label and its place (the rank).
  int metadata = 0;
  for (const Json& e : trace["traceEvents"].array) {
    if (e["ph"].str != "M") continue;
    ++metadata;
    if (e["name"].str == "process_name") CHECK(e["args"]["name"].str == "rank 0 · stage 0 · replica 0 · host a");
    else CHECK(e["args"]["sort_index"].number == 0);
  }
  CHECK(metadata == 2);
  fs::remove(path);
}

TEST_CASE("tracer escapes names and labels", "[trace]") {
  auto comm = strata::make_single_comm();
  Tracer t(0, 1);
  t.set_origin();
  t.begin_step(0);
  const std::string name = "say \"hi\" \\ C:\\dir\nnext\ttab \x01";
  const auto now = Tracer::Clock::now();
  t.span("send", name, now, now);
  const std::string path = temp_path("escape.json");
  const std::string label = "rank \"0\" \\ host";
  REQUIRE(t.write(*comm, path, label) == 1);
  const Json trace = read_json(path);  // throws if an unescaped quote broke the JSON
  const auto spans = complete_events(trace);
  REQUIRE(spans.size() == 1);
  CHECK((*spans[0])["name"].str == name);
  CHECK((*spans[0])["cat"].str == "send");
  bool found = false;
  for (const Json& e : trace["traceEvents"].array)
    if (e["name"].str == "process_name") found = e["args"]["name"].str == label;
  CHECK(found);
  fs::remove(path);
}

TEST_CASE("a default tracer records and writes nothing", "[trace]") {
  auto comm = strata::make_single_comm();
  Tracer t;
  CHECK_FALSE(t.enabled());
  t.set_origin();
  t.begin_step(0);
  CHECK_FALSE(t.recording());
  const auto now = Tracer::Clock::now();
  t.span("compute", "x", now, now);
  { Tracer::Scope scope(t, "data", "batch"); }
  const std::string path = temp_path("disabled.json");
  CHECK(t.write(*comm, path, "rank 0") == 0);
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("a trace that cannot be written is a UserError naming the path", "[trace]") {
  auto comm = strata::make_single_comm();
  Tracer t(0, 1);
  t.begin_step(0);
  const std::string path = temp_path("no-such-dir") + "/trace.json";
  try {
    t.write(*comm, path, "rank 0");
    FAIL("write did not throw");
  } catch (const strata::UserError& e) {
    CHECK(e.code == strata::kExitBadInput);
    CHECK_THAT(e.what(), Catch::Matchers::Contains(path));
  }
}
