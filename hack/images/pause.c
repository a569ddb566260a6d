/*
 * The pod sandbox's process for the test cluster (`marin3r-test/pause:1`, built by
 * hack/image): it holds the pod's namespaces, reaps the orphans it inherits as PID 1 and
 * exits 0 on SIGTERM or SIGINT. Linked statically, so its image holds this file alone.
 */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    static const char version[] = "marin3r-test pause 1\n";
    return write(1, version, sizeof version - 1) == (ssize_t)(sizeof version - 1) ? 0 : 1;
  }
  struct sigaction action;
  memset(&action, 0, sizeof action);
  sigemptyset(&action.sa_mask);
  action.sa_handler = on_stop;
  if (sigaction(SIGTERM, &action, 0) != 0 || sigaction(SIGINT, &action, 0) != 0) {
    return 1;
  }
  action.sa_handler = on_child;
  action.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGCHLD, &action, 0) != 0) {
    return 1;
  }
  for (;;) {
    pause();
  }
}
