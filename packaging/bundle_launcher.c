// The bundle's bin/strata, bin/mpirun and bin/mpiexec: makes the bundled Open MPI find itself,
// then runs the real program of the same name from libexec/. Debian's Open MPI has its prefix
// (/usr) compiled in: OPAL_PREFIX moves it to the bundle (its components and help files),
// PMIX_INSTALL_PREFIX moves PMIx's, and the bundle's own MCA parameter file replaces
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

// Whether `name` is an executable file in one of PATH's directories.
static int on_path(const char* name) {
  const char* path = getenv("PATH");
  if (!path) return 0;
  char dir[PATH_MAX];
  while (*path) {
    size_t n = strcspn(path, ":");
    if (n > 0 && n < sizeof dir - strlen(name) - 2) {
      char file[PATH_MAX];
      memcpy(dir, path, n);
      dir[n] = '\0';
      snprintf(file, sizeof file, "%s/%s", dir, name);
      if (access(file, X_OK) == 0) return 1;
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

  char buf[PATH_MAX];
  if (setenv("OPAL_PREFIX", prefix, 1) != 0) die("cannot set", "OPAL_PREFIX");
  snprintf(buf, sizeof buf, "%s/%s", prefix, PMIX_DIR);
  if (setenv("PMIX_INSTALL_PREFIX", buf, 1) != 0) die("cannot set", "PMIX_INSTALL_PREFIX");
  snprintf(buf, sizeof buf, "%s/etc/openmpi/openmpi-mca-params.conf", prefix);
  if (setenv("OMPI_MCA_mca_base_param_files", buf, 0) != 0) die("cannot set", "OMPI_MCA_mca_base_param_files");
  if (!getenv("OMPI_MCA_plm_rsh_agent") && !on_path("ssh") && !on_path("rsh")) {
    snprintf(buf, sizeof buf, "%s/libexec/no-remote-shell", prefix);
    if (setenv("OMPI_MCA_plm_rsh_agent", buf, 1) != 0) die("cannot set", "OMPI_MCA_plm_rsh_agent");
  }
  char real[PATH_MAX];
  snprintf(real, sizeof real, "%s/libexec/%s", prefix, name);
  execv(real, argv);
  die("cannot run", real);
  return 127;
}
