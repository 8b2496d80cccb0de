// Writing files so that a crash never leaves a half-written one under the final name.
#pragma once
#include <string>
#include <vector>

namespace strata {

// Publishes a finished temporary file: fsync, never world-writable, rename over `path`, fsync
// of the directory (best effort). On failure `tmp` is removed, `path` is left as it was, and a
// UserError(kExitBadInput) names `path`.
void publish_file(const std::string& tmp, const std::string& path);

// Clears the world-write bit of a file or directory strata created (the umask decides the
// rest).
void drop_world_write(const std::string& path);

// Creates the directory `file` will be written into (never world-writable); throws UserError
// naming the file (after `key`, the config key that named it, if given) when `file` is a
// directory, or its directory cannot be created or takes no new file (a file is made there and
// removed: root passes access(2) on a read-only file system, sysfs or procfs).
void ensure_parent_dir(const std::string& file, const std::string& key = "");

// "" when a new file can be made in directory `dir` (one is made and removed), else why not.
std::string cannot_create_in(const std::string& dir);

// Whether two paths name one file: the same device and inode where both exist (links
// included), else the same normalised absolute path.
bool same_file(const std::string& a, const std::string& b);

// A path a command reads, and the flag or key that named it.
struct NamedPath {
  std::string key, path;
};
// Throws UserError(kExitBadInput) when output file `out` is one of `inputs` (empty paths
// skipped): a command never writes over what it reads, even when it then fails.
void refuse_writing_over(const NamedPath& out, const std::vector<NamedPath>& inputs);

// Replaces `path` with `text` atomically (written under "<path>.tmp.<pid>", never
// world-writable, then renamed; no fsync): for small files rewritten often (the goodput
// ledger, the Prometheus file, the watchdog's report). Returns "" or the first failure's
// reason; a failed write leaves no temporary file and `path` as it was.
std::string replace_text_file(const std::string& path, const std::string& text);
// The same, durable (publish_file: fsync, rename, fsync of the directory), for files a resume
// depends on (checkpoint.dir's `latest`, its cache id); throws UserError naming `path`.
void publish_text_file(const std::string& path, const std::string& text);
// Creates `dir` and any missing parents, none of them world-writable; "" or the reason.
std::string make_directories(const std::string& dir);
// The bytes of a (small) file another tool wrote: a vocabulary, a config.json. Throws
// UserError(kExitBadInput) naming `path` when it is missing, a directory or unreadable.
std::string read_whole_file(const std::string& path);

}  // namespace strata
