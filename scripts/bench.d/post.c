/* The peer of lw-post in scripts/bench-post: the same system calls for one
 * durable Maildir delivery, as one process per message.  Written plainly on
 * purpose: it is the floor lw-post is measured against. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: post DIR\n"); return 64; }
    char tmp[4096], new[4096], name[64], body[1024];
    struct timespec ts;
    unsigned char r[16];
    clock_gettime(CLOCK_REALTIME, &ts);
    if (getrandom(r, sizeof r, 0) != sizeof r) return 70;
    int n = snprintf(name, sizeof name, "%010lld.%09ld.", (long long)ts.tv_sec, ts.tv_nsec);
    for (int i = 0; i < 16; i++) n += snprintf(name + n, sizeof name - n, "%02x", r[i]);
    int len = snprintf(body, sizeof body,
        "{\"version\":1,\"id\":\"%s\",\"from\":\"bench\",\"to\":[\"mediator\"],\"kind\":\"status\","
        "\"subject\":\"bench\",\"body\":\"body\",\"refs\":[],\"in_reply_to\":null,"
        "\"created\":\"2026-11-30T17:06:45.123456Z\"}\n", name);
    snprintf(tmp, sizeof tmp, "%s/outbox/tmp", argv[1]);
    snprintf(new, sizeof new, "%s/outbox/new", argv[1]);
    int td = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int nd = open(new, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (td < 0 || nd < 0) { perror("open dir"); return 73; }
    int fd = openat(td, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) { perror("openat"); return 73; }
    if (write(fd, body, len) != len || fsync(fd) != 0) { unlinkat(td, name, 0); return 74; }
    close(fd);
    if (renameat2(td, name, nd, name, RENAME_NOREPLACE) != 0) { unlinkat(td, name, 0); return 74; }
    if (fsync(nd) != 0) return 74;
    printf("%s\n", name);
    return 0;
}
