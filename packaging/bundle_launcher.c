// The bundle's bin/strata, bin/mpirun and bin/mpiexec: makes the bundled Open MPI find itself,
// then runs the real program of the same name from libexec/. Debian's Open MPI has its prefix
// (/usr) compiled in: OPAL_PREFIX moves it to the bundle (its components and help files),
// PMIX_INSTALL_PREFIX and friends move PMIx's, and the bundle's own MCA parameter file replaces
// /etc/openmpi's (a node's own Open MPI may have one, for another version). Where the node has
// neither ssh nor rsh, Open MPI refuses even to start a singleton's daemon unless its remote
// shell names an existing program: then it is this program under the name no-remote-shell,
// which only says that remote daemons cannot be started from here.
// A C program, not a shell script: the bundle must run where no shell exists.
//
// Built by packaging/bundle.sh with PMIX_DIR (PMIx's prefix, relative to the bundle's root).
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PMIX_DIR
#error "build with -DPMIX_DIR=\"lib/.../pmix2\" (packaging/bundle.sh does)"
#endif

static void die(const char* what, const char* path) {
  fprintf(stderr, "strata bundle: error: %s %s: %s\n", what, path, strerror(errno));
  exit(127);
}

// PREFIX/REL, allocated (the program execs soon after: nothing is freed).
static const char* under(const char* prefix, const char* rel) {
  char* p = NULL;
  if (asprintf(&p, "%s/%s", prefix, rel) < 0) die("out of memory for", rel);
  return p;
}

// Whether `name` is an executable file in one of PATH's directories.
static int on_path(const char* name) {
  const char* path = getenv("PATH");
  while (path && *path) {
    size_t n = strcspn(path, ":");
    if (n > 0) {
      char* dir = strndup(path, n);
      if (!dir) die("out of memory for", "PATH");
      const int found = access(under(dir, name), X_OK) == 0;
      free(dir);
      if (found) return 1;
    }
    path += n + (path[n] == ':');
  }
  return 0;
}

int main(int argc, char** argv) {
  (void)argc;
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("cannot read", "/proc/self/exe");
  self[n] = '\0';
  char* slash = strrchr(self, '/');
  const char* name = slash + 1;
  if (strcmp(name, "no-remote-shell") == 0) {
    fprintf(stderr, "strata bundle: Open MPI tried to start a daemon on another node, but this "
                    "node has no ssh or rsh; inside a Slurm allocation launch with srun instead\n");
    return 1;
  }
  // self is PREFIX/bin/NAME: PREFIX is two levels up.
  *slash = '\0';
  char* up = strrchr(self, '/');
  if (!up) die("unexpected location", self);
  *up = '\0';
  const char* prefix = self[0] ? self : "/";

  if (setenv("OPAL_PREFIX", prefix, 1) != 0) die("cannot set", "OPAL_PREFIX");
  // Debian configured PMIx with absolute library, data and configuration directories (and
  // its parameter file names the component directory: the bundle leaves it out), which the
  // prefix alone does not move: each is set.
  const char* pmix = under(prefix, PMIX_DIR);
  if (setenv("PMIX_INSTALL_PREFIX", pmix, 1) != 0 ||
      setenv("PMIX_PKGLIBDIR", under(pmix, "lib/pmix"), 1) != 0 ||
      setenv("PMIX_PKGDATADIR", under(pmix, "share/pmix"), 1) != 0 ||
      setenv("PMIX_SYSCONFDIR", under(pmix, "share"), 1) != 0)
    die("cannot set", "PMIX_INSTALL_PREFIX");
  if (setenv("OMPI_MCA_mca_base_param_files", under(prefix, "etc/openmpi/openmpi-mca-params.conf"),
             0) != 0)
    die("cannot set", "OMPI_MCA_mca_base_param_files");
  if (!getenv("OMPI_MCA_plm_rsh_agent") && !on_path("ssh") && !on_path("rsh") &&
      setenv("OMPI_MCA_plm_rsh_agent", under(prefix, "libexec/no-remote-shell"), 1) != 0)
    die("cannot set", "OMPI_MCA_plm_rsh_agent");
  const char* real = under(under(prefix, "libexec"), name);
  execv(real, argv);
  die("cannot run", real);
  return 127;
}
