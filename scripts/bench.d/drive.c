/* Runs a command N times, one process after another (fork, exec, wait), and
 * prints the mean wall time per run in microseconds.  Both sides of a
 * process-per-message benchmark go through this same driver. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: drive N CMD [ARG...]\n"); return 64; }
    long n = atol(argv[1]);
    struct timespec a, b;
    int devnull = open("/dev/null", O_WRONLY);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) {
            dup2(devnull, 1);
            close(0);
            open("/dev/null", O_RDONLY);
            execv(argv[2], argv + 2);
            _exit(127);
        }
        int st;
        waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "run %ld failed\n", i); return 1; }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / n;
    printf("%.1f\n", us);
    return 0;
}
