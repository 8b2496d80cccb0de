// Converting Fashion-MNIST (gzip'ed IDX files) into the HDF5 layout of data.h.
#pragma once
#include <string>

namespace strata {

// Reads train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
// t10k-labels-idx1-ubyte.gz from source_dir and writes out_path:
//   /train/images, /test/images  uint8 (N, H, W), contiguous; attributes height, width, channels
//   /train/labels, /test/labels  uint8 (N,)
//   root attributes: classes = 10, source, created_by ("strata <version>"), created_at (UTC,
//   ISO 8601), sha256_<file> for each source file, and source_sha256: the SHA-256 of the text
//   `sha256sum` prints for the four files in the order above ("<hex>  <name>\n" each), i.e.
//   the digest printed by (in SOURCE_DIR, on one line)
//     sha256sum train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
//               t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz | sha256sum
// Everything is read and checked before writing; the file is written to "<out>.tmp.<pid>" and
// renamed over out_path, so out_path never holds a partial file. Throws UserError naming the
// file at fault (missing, truncated, bad IDX header, inconsistent counts, no output directory).
// Runs on one rank.
void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_path);

// Lower-case hex SHA-256 of a file's bytes. Throws UserError if it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace strata
