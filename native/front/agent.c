/* The stacks from the target's agent, under the Python client's rules (client/discovery.py,
 * client/trust.py, client/connection.py, engine/backtrace.py `ask`): the socket where
 * procfs.socket_candidates looks, its directory and file owned by the target's user, the
 * process answering on it the target; one hello and one backtrace request; every length
 * bounded, every wait with a deadline. Anything else: ASK_FALLBACK, and the Python CLI
 * takes the command from the start. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "front.h"
#include "front_tables.h"
#include "table.h"

/* A field of /proc/PID/status: the `word`-th number after `key`, or -1. */
static long long status_number(int pid, const char *key, int word)
{
    char path[64], *data, *line;
    size_t size;
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    if (read_whole(path, &data, &size, 1 << 20) < 0)
        return -1;
    long long value = -1;
    for (line = data; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, key, strlen(key)) != 0)
            continue;
        char *at = line + strlen(key), *end;
        for (int i = 0; i <= word; i++) {
            long long number = strtoll(at, &end, 10);
            if (end == at)
                break;
            if (word < 0 || i == word)
                value = number;
            at = end;
        }
        if (word < 0) /* the last number (NSpid: the PID in the innermost namespace) */
            for (long long number; (number = strtoll(at, &end, 10)), end != at; at = end)
                value = number;
        break;
    }
    free(data);
    return value;
}

static int same_mount_namespace(int pid)
{
    char path[64];
    struct stat theirs, ours;
    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", pid);
    if (stat(path, &theirs) < 0 || stat("/proc/self/ns/mnt", &ours) < 0)
        return 1; /* as procfs.View: cannot tell, so the paths are taken as they are */
    return theirs.st_ino == ours.st_ino;
}

/* PROBING_SOCKET_DIR in the target's start-up environment (a copy, to free), or NULL. */
static char *their_socket_dir(int pid)
{
    char path[64], *data, *found = NULL;
    size_t size;
    const char prefix[] = "PROBING_SOCKET_DIR=";
    snprintf(path, sizeof(path), "/proc/%d/environ", pid);
    if (read_whole(path, &data, &size, 16 << 20) < 0)
        return NULL;
    for (size_t at = 0; at < size && found == NULL; at += strlen(data + at) + 1)
        if (strncmp(data + at, prefix, sizeof(prefix) - 1) == 0)
            found = strdup(data + at + sizeof(prefix) - 1);
    free(data);
    return found;
}

static int join(char *path, size_t size, const char *directory, int pid)
{
    size_t length = strlen(directory);
    const char *slash = length && directory[length - 1] == '/' ? "" : "/";
    return snprintf(path, size, "%s%s%d.sock", directory, slash, pid) < (int)size ? 0 : -1;
}

/* The `index`-th place where the agent of `pid` may listen (procfs.socket_candidates, for a
 * process in our namespaces: its PROBING_SOCKET_DIR, ours, /tmp/probing-UID), each once; -1
 * past the last. */
int socket_candidate(int pid, int index, char *path, size_t size)
{
    char candidates[3][4096], tmp[64], *theirs = their_socket_dir(pid);
    long long uid = status_number(pid, "Uid:", 1);
    const char *directories[3] = {theirs, getenv("PROBING_SOCKET_DIR"), tmp};
    snprintf(tmp, sizeof(tmp), "/tmp/probing-%lld", uid >= 0 ? uid : (long long)geteuid());
    int count = 0, joined = 0;
    for (int i = 0; i < 3 && joined == 0; i++) {
        if (directories[i] == NULL || directories[i][0] == '\0')
            continue;
        if ((joined = join(candidates[count], sizeof(candidates[count]), directories[i], pid)) < 0)
            break;
        int seen = 0;
        for (int j = 0; j < count; j++)
            seen |= strcmp(candidates[j], candidates[count]) == 0;
        count += !seen;
    }
    free(theirs);
    if (joined < 0 || index >= count || strlen(candidates[index]) >= size)
        return -1;
    memcpy(path, candidates[index], strlen(candidates[index]) + 1);
    return 0;
}

/* discovery.locate_socket: the first candidate that exists, into `path`; -2 when none does
 * (attaching, or saying why not, is then attach.c's or the Python CLI's), -1 on any surprise. */
static int locate_socket(int pid, char *path, size_t size)
{
    for (int i = 0; socket_candidate(pid, i, path, size) == 0; i++) {
        struct stat info;
        if (lstat(path, &info) == 0)
            return 0;
        if (errno != ENOENT && errno != EACCES)
            return -1;
    }
    return -2;
}

/* trust.check_socket_file: the directory the target's user's, 0700, not a symlink; the socket
 * a socket of that user's. */
static int trusted_socket_file(const char *path, long long uid)
{
    char directory[4096];
    struct stat info;
    snprintf(directory, sizeof(directory), "%s", path);
    char *slash = strrchr(directory, '/');
    if (slash == NULL) {
        snprintf(directory, sizeof(directory), ".");
    } else {
        slash[1] = '\0';
        size_t length = strlen(directory);
        while (length > 1 && directory[length - 1] == '/') /* posixpath.dirname */
            directory[--length] = '\0';
    }
    if (lstat(directory, &info) < 0 || !S_ISDIR(info.st_mode) || info.st_uid != (uid_t)uid ||
        (info.st_mode & 077))
        return -1;
    if (lstat(path, &info) < 0 || !S_ISSOCK(info.st_mode) || info.st_uid != (uid_t)uid)
        return -1;
    return 0;
}

static int connect_to(const char *path, int pid, long long uid)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(address.sun_path))
        return -1;
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct ucred peer;
    socklen_t size = sizeof(peer);
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0) {
        int full = errno == EAGAIN;
        close(fd);
        return full ? -2 : -1;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) < 0 || peer.pid != pid ||
        peer.uid != (uid_t)uid) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *data, size_t size, long long deadline)
{
    while (size) {
        ssize_t sent = send(fd, data, size, MSG_NOSIGNAL);
        if (sent < 0 && errno == EAGAIN) {
            struct pollfd wait = {fd, POLLOUT, 0};
            long long left = deadline - now_us();
            if (left <= 0 || poll(&wait, 1, (int)(left / 1000) + 1) < 0)
                return -1;
            continue;
        }
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent <= 0)
            return -1;
        data += sent, size -= (size_t)sent;
    }
    return 0;
}

static int add_frame(buf_t *out, const char *header)
{
    uint32_t length = (uint32_t)strlen(header);
    unsigned char prefix[12] = {'P', 'R', 'B', '1', length >> 24, length >> 16, length >> 8, length,
                                0, 0, 0, 0};
    return buf_add(out, prefix, sizeof(prefix)) < 0 ? -1 : buf_str(out, header);
}

/* _answered_or_stuck: 1 once the reply starts arriving, 0 when the wait ends, ASK_STILL when
 * no thread of the process runs in STILL_CHECKS looks in a row (target.Stillness). */
static int answered_or_still(int fd, int pid)
{
    long long end = now_us() + EARLY_LOOK_US, looked_at = -STILL_CHECK_US;
    int still = 0;
    for (;;) {
        long long now = now_us(), left = end - now;
        if (left <= 0)
            return 0;
        long long wait = left < STILL_CHECK_US ? left : STILL_CHECK_US;
        struct timespec timeout = {wait / 1000000, (wait % 1000000) * 1000};
        struct pollfd readable = {fd, POLLIN, 0};
        if (ppoll(&readable, 1, &timeout, NULL) > 0)
            return 1;
        now = now_us();
        if (now - looked_at >= STILL_CHECK_US) {
            looked_at = now;
            still = running_threads(pid) == 0 ? still + 1 : 0;
        }
        if (still >= STILL_CHECKS)
            return ASK_STILL;
    }
}

/* The agent's queue of connections is full: stuck on its GIL (as the `stuck` check of the
 * Python client's connect), or only busy? */
static int wait_still(int pid)
{
    long long looked_at = -STILL_CHECK_US;
    int still = 0;
    for (int looks = 0; looks < 4 * STILL_CHECKS; looks++) {
        long long now = now_us();
        if (now - looked_at < STILL_CHECK_US) {
            struct timespec pause = {0, (STILL_CHECK_US - (now - looked_at)) * 1000};
            nanosleep(&pause, NULL);
        }
        looked_at = now_us();
        still = running_threads(pid) == 0 ? still + 1 : 0;
        if (still >= STILL_CHECKS)
            return 1;
    }
    return 0;
}

int ask_agent(int pid, answer_t *answer)
{
    char path[4096], header[256];
    if (pid <= 0 || !process_alive(pid) || !same_mount_namespace(pid) ||
        status_number(pid, "NSpid:", -1) != pid)
        return ASK_FALLBACK; /* gone, or in a container: the Python CLI's */
    long long uid = status_number(pid, "Uid:", 1);
    int located = uid < 0 ? -1 : locate_socket(pid, path, sizeof(path));
    if (located == -2)
        return ASK_NONE;
    if (located < 0 || trusted_socket_file(path, uid) < 0)
        return ASK_FALLBACK;
    int fd = connect_to(path, pid, uid);
    if (fd < 0)
        return fd == -2 && wait_still(pid) ? ASK_STILL : ASK_FALLBACK;
    long long deadline = now_us() + BACKTRACE_TIMEOUT_US;
    buf_t request = {0};
    snprintf(header, sizeof(header),
             "{\"id\":1,\"method\":\"hello\",\"params\":{\"protocol\":%d,\"client\":\"%s\"}}",
             PROTOCOL_VERSION, PROBING_VERSION);
    if (add_frame(&request, header) < 0 ||
        add_frame(&request, "{\"id\":2,\"method\":\"backtrace\",\"params\":{\"locals\":false,"
                            "\"thread\":null}}") < 0 ||
        send_all(fd, request.data, request.len, deadline) < 0) {
        close(fd);
        return ASK_FALLBACK;
    }
    int answered = answered_or_still(fd, pid);
    if (answered != 1) {
        close(fd);
        if (answered == 0) { /* the Python CLI looks from outside at once: no second early wait */
            char text[16];
            snprintf(text, sizeof(text), "%d", pid);
            setenv(AGENT_SILENT, text, 1);
        }
        return answered == ASK_STILL ? ASK_STILL : ASK_FALLBACK;
    }
    reader_t reader = {fd, deadline, {0}, 0};
    int result = read_answer(&reader, answer);
    close(fd);
    return result < 0 ? ASK_FALLBACK : ASK_OK;
}
