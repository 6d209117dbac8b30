/* The peer of lw-mcp's `wait` in scripts/bench-mcp: a process that watches
 * inbox/new (argv[1]) with inotify, says "ready" once the watch is set, and
 * prints the name of the first message that arrives, then exits.  The
 * least any waiter on a Maildir can do. */
#include <limits.h>
#include <stdio.h>
#include <sys/inotify.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: wake DIR\n"); return 64; }
    int fd = inotify_init1(IN_CLOEXEC);
    if (fd < 0 || inotify_add_watch(fd, argv[1], IN_MOVED_TO | IN_CREATE) < 0) { perror(argv[1]); return 66; }
    printf("ready\n");
    fflush(stdout);
    char buf[sizeof(struct inotify_event) + NAME_MAX + 1] __attribute__((aligned(8)));
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) { perror("read"); return 74; }
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *e = (struct inotify_event *)p;
            if (e->len && e->name[0] != '.') { printf("%s\n", e->name); return 0; }
            p += sizeof *e + e->len;
        }
    }
}
