#include "base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/error.h"

namespace strata {

void drop_world_write(const std::string& path) {
  struct stat sb{};
  if (::stat(path.c_str(), &sb) == 0 && (sb.st_mode & S_IWOTH))
    ::chmod(path.c_str(), sb.st_mode & ~S_IWOTH & 07777);
}

std::string make_directories(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> made;
  for (fs::path p(dir); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    made.push_back(p);
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec) return ec.message();
  for (const fs::path& p : made) drop_world_write(p.string());
  return "";
}

namespace {

std::string temporary_name(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

// `text` into a new file `tmp` (never world-writable); "" or the first failure's reason, and
// then no `tmp` is left.
std::string write_text(const std::string& tmp, const std::string& text) {
  int err = 0;  // the first failure's errno (later calls would overwrite it)
  auto check = [&](bool fine) {
    if (!fine && err == 0) err = errno ? errno : EIO;
    return fine;
  };
  FILE* out = std::fopen(tmp.c_str(), "w");
  bool ok = check(out != nullptr) && check(std::fputs(text.c_str(), out) >= 0);
  if (out) ok = check(std::fclose(out) == 0) && ok;
  if (ok) {
    drop_world_write(tmp);  // the umask decides the rest
    return "";
  }
  std::remove(tmp.c_str());
  return std::strerror(err);
}

}  // namespace

std::string replace_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = temporary_name(path);
  if (std::string why = write_text(tmp, text); !why.empty()) return why;
  if (std::rename(tmp.c_str(), path.c_str()) == 0) return "";
  const int err = errno;
  std::remove(tmp.c_str());
  return std::strerror(err);
}

void publish_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = temporary_name(path);
  if (const std::string why = write_text(tmp, text); !why.empty())
    fail_input("{}: cannot write {} ({})", path, tmp, why);
  publish_file(tmp, path);
}

void publish_file(const std::string& tmp, const std::string& path) {
  auto fail = [&](const char* what, int err) {
    std::remove(tmp.c_str());
    fail_input("{}: {} {} ({}); the previous file is left as it was", path, what, tmp,
               std::strerror(err));
  };
  // fsync before rename: after a crash the new name never points at unwritten blocks.
  int fd = ::open(tmp.c_str(), O_RDONLY);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!synced) fail("cannot flush", err);
  drop_world_write(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename into place", errno);
  std::string dir = std::filesystem::path(path).parent_path().string();
  fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void ensure_parent_dir(const std::string& file, const std::string& key) {
  const std::string parent = std::filesystem::path(file).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  const std::string what = key.empty() ? file : key + " " + file;
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) fail_input("{}: is a directory; expected a file", what);
  if (const std::string why = make_directories(dir); !why.empty())
    fail_input("{}: cannot create directory {} ({})", what, dir, why);
  // A file made and removed: access(2) would pass root everywhere, sysfs and /proc included.
  if (const std::string why = cannot_create_in(dir); !why.empty())
    fail_input("{}: cannot create a file in directory {} ({})", what, dir, why);
}

std::string cannot_create_in(const std::string& dir) {
  const std::string probe = fmt::format("{}/.strata-probe.{}", dir, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno == EEXIST ? "" : std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  const fs::path na = fs::weakly_canonical(fs::absolute(a, ec), ec);
  const fs::path nb = fs::weakly_canonical(fs::absolute(b, ec), ec);
  return na == nb;
}

void refuse_writing_over(const NamedPath& out, const std::vector<NamedPath>& inputs) {
  if (out.path.empty()) return;
  for (const NamedPath& in : inputs)
    if (!in.path.empty() && same_file(out.path, in.path))
      fail_input("{} {}: is also {}, which this command reads: name another file to write", out.key,
                 out.path, in.key);
}

std::string read_whole_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail_input("{}: does not exist", path);
  if (std::filesystem::is_directory(path, ec)) fail_input("{}: is a directory; expected a file", path);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail_input("{}: cannot open ({})", path, std::strerror(errno));
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) data.append(buf, n);
  if (std::ferror(f.get())) fail_input("{}: cannot read ({})", path, std::strerror(errno));
  return data;
}

}  // namespace strata
