// vbload: the load client (and the echo floor) vaultbench measures every
// daemon with, so vaultd, oidc-agent and a plain C server meet the same
// client. vaultbench compiles it at run time:
//
//   cc -O2 -o vbload Benchmarks/load/vbload.c -lsodium -lpthread
//
//   vbload echo PATH REPLY_BYTES        a C echo server: each line in gets
//                                       REPLY_BYTES bytes and a newline back
//                                       (0: the line itself); epoll, one thread
//   vbload run MODE PATH CLIENTS SECONDS REQUEST
//                                       CLIENTS threads in a closed loop for
//                                       SECONDS after 0.3 s of warm-up
//   vbload many MODE PATH CLIENTS TOTAL REQUEST
//                                       TOTAL requests shared by CLIENTS threads
//   vbload burst MODE PATH CLIENTS REQUEST
//                                       CLIENTS requests sent at one instant;
//                                       each one's wait for its answer
//
// MODE: `line` (one connection per client, kept: vaultd's protocol),
// `conn` (a connection per request: line in, line out, close), `oidc`
// (oidc-agent's protocol, a connection per request: key exchange, then the
// request and its answer sealed with crypto_secretbox, as oidc-token does).
// `run` prints one line: ok=N err=N rate=R p50=US p99=US p999=US max=US
// (microseconds); `burst` prints ok=N err=N p50=US max=US.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static struct sockaddr_un address(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        fprintf(stderr, "socket path too long\n");
        exit(2);
    }
    strcpy(a.sun_path, path);
    return a;
}

static int dial(const char *path) {
    struct sockaddr_un a = address(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *bytes, size_t count) {
    while (count > 0) {
        ssize_t n = send(fd, bytes, count, MSG_NOSIGNAL);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            return -1;
        }
        bytes += n;
        count -= (size_t)n;
    }
    return 0;
}

// ---------------------------------------------------------------- echo floor

struct peer {
    int fd;
    size_t used;
    char buffer[4096];
};

static int echo_server(const char *path, size_t reply_bytes) {
    unlink(path);
    struct sockaddr_un a = address(path);
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof a) != 0 || listen(listener, 4096) != 0) die("echo: listen");
    char *canned = NULL;
    if (reply_bytes > 0) {
        canned = malloc(reply_bytes + 1);
        memset(canned, 'a', reply_bytes);
        canned[reply_bytes] = '\n';
    }
    int poller = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event event = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(poller, EPOLL_CTL_ADD, listener, &event);
    printf("ready\n");
    fflush(stdout);
    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(poller, events, 256, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die("echo: epoll_wait");
        for (int i = 0; i < n; i++) {
            struct peer *p = events[i].data.ptr;
            if (p == NULL) {
                int fd;
                while ((fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct peer *q = calloc(1, sizeof *q);
                    q->fd = fd;
                    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = q};
                    epoll_ctl(poller, EPOLL_CTL_ADD, fd, &e);
                }
                continue;
            }
            ssize_t got = read(p->fd, p->buffer + p->used, sizeof p->buffer - p->used);
            if (got <= 0) {
                if (got < 0 && errno == EAGAIN) continue;
                close(p->fd);
                free(p);
                continue;
            }
            p->used += (size_t)got;
            char *start = p->buffer, *end = p->buffer + p->used, *newline;
            while ((newline = memchr(start, '\n', (size_t)(end - start))) != NULL) {
                // The client waits for this answer before it sends again, so
                // the socket has room: a blocking-style loop is enough.
                const char *reply = canned ? canned : start;
                size_t size = canned ? reply_bytes + 1 : (size_t)(newline - start + 1);
                while (size > 0) {
                    ssize_t w = write(p->fd, reply, size);
                    if (w < 0 && errno == EAGAIN) continue;
                    if (w <= 0) break;
                    reply += w;
                    size -= (size_t)w;
                }
                start = newline + 1;
            }
            p->used = (size_t)(end - start);
            memmove(p->buffer, start, p->used);
            if (p->used == sizeof p->buffer) p->used = 0;
        }
    }
    return 0;
}

// ------------------------------------------------------------------ clients

enum mode { LINE, CONN, OIDC };

struct client {
    enum mode mode;
    const char *path;
    const char *request; // with its newline for LINE and CONN
    size_t request_length;
    int fd;              // LINE: the kept connection
    char *buffer;
    size_t capacity, used;
};

static void client_init(struct client *c, enum mode mode, const char *path, const char *request) {
    memset(c, 0, sizeof *c);
    c->mode = mode;
    c->path = path;
    c->fd = -1;
    if (mode == OIDC) {
        c->request = request;
    } else {
        char *line = malloc(strlen(request) + 2);
        sprintf(line, "%s\n", request);
        c->request = line;
    }
    c->request_length = strlen(c->request);
    c->capacity = 1 << 16;
    c->buffer = malloc(c->capacity);
}

// Reads until `complete` says the buffer holds a whole answer; 0 on success.
static int read_until(struct client *c, int fd, size_t (*complete)(const char *, size_t)) {
    c->used = 0;
    for (;;) {
        size_t whole = complete(c->buffer, c->used);
        if (whole > 0) return 0;
        if (c->used == c->capacity) return -1;
        ssize_t n = recv(fd, c->buffer + c->used, c->capacity - c->used, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        c->used += (size_t)n;
    }
}

static size_t line_complete(const char *b, size_t n) {
    const char *newline = memchr(b, '\n', n);
    return newline ? (size_t)(newline - b) + 1 : 0;
}

static size_t key_complete(const char *b, size_t n) {
    (void)b;
    return n >= 44 ? 44 : 0;
}

// oidc-agent's sealed answer: "LENGTH:NONCE:CIPHERTEXT" (base64), or plain JSON.
static size_t sealed_complete(const char *b, size_t n) {
    if (n > 0 && b[0] == '{') return 0; // plain JSON: read until the agent closes
    const char *colon = memchr(b, ':', n);
    if (colon == NULL) return 0;
    size_t length = strtoul(b, NULL, 10);
    size_t want = (size_t)(colon - b) + 1 + 32 + 1 +
                  sodium_base64_encoded_len(length + crypto_secretbox_MACBYTES, sodium_base64_VARIANT_ORIGINAL) - 1;
    return n >= want ? want : 0;
}

static int has(const char *b, size_t n, const char *needle) {
    return memmem(b, n, needle, strlen(needle)) != NULL;
}

// One request and its answer; 0 when the answer says it succeeded.
static int one_request(struct client *c) {
    switch (c->mode) {
    case LINE:
        if (c->fd < 0 && (c->fd = dial(c->path)) < 0) return -1;
        if (send_all(c->fd, c->request, c->request_length) != 0 || read_until(c, c->fd, line_complete) != 0) {
            close(c->fd);
            c->fd = -1;
            return -1;
        }
        return has(c->buffer, c->used, "\"ok\":false") ? -1 : 0;
    case CONN: {
        int fd = dial(c->path);
        if (fd < 0) return -1;
        int failed = send_all(fd, c->request, c->request_length) != 0 || read_until(c, fd, line_complete) != 0;
        close(fd);
        return failed || has(c->buffer, c->used, "\"ok\":false") ? -1 : 0;
    }
    case OIDC: {
        int fd = dial(c->path);
        if (fd < 0) return -1;
        unsigned char pk[crypto_kx_PUBLICKEYBYTES], sk[crypto_kx_SECRETKEYBYTES], theirs[crypto_kx_PUBLICKEYBYTES];
        unsigned char key[crypto_box_BEFORENMBYTES];
        crypto_kx_keypair(pk, sk);
        char encoded[64];
        sodium_bin2base64(encoded, sizeof encoded, pk, sizeof pk, sodium_base64_VARIANT_ORIGINAL);
        int result = -1;
        if (send_all(fd, encoded, strlen(encoded)) != 0 || read_until(c, fd, key_complete) != 0) goto done;
        size_t decoded;
        if (sodium_base642bin(theirs, sizeof theirs, c->buffer, 44, NULL, &decoded, NULL, sodium_base64_VARIANT_ORIGINAL) != 0 ||
            decoded != sizeof theirs || crypto_box_beforenm(key, theirs, sk) != 0)
            goto done;
        // The request, sealed.
        size_t length = c->request_length;
        unsigned char nonce[crypto_secretbox_NONCEBYTES];
        randombytes_buf(nonce, sizeof nonce);
        unsigned char *sealed = malloc(length + crypto_secretbox_MACBYTES);
        crypto_secretbox_easy(sealed, (const unsigned char *)c->request, length, nonce, key);
        size_t sealed_b64 = sodium_base64_encoded_len(length + crypto_secretbox_MACBYTES, sodium_base64_VARIANT_ORIGINAL);
        char *message = malloc(32 + 64 + sealed_b64);
        int prefix = sprintf(message, "%zu:", length);
        sodium_bin2base64(message + prefix, 64, nonce, sizeof nonce, sodium_base64_VARIANT_ORIGINAL);
        strcat(message, ":");
        size_t at = strlen(message);
        sodium_bin2base64(message + at, sealed_b64, sealed, length + crypto_secretbox_MACBYTES, sodium_base64_VARIANT_ORIGINAL);
        free(sealed);
        int sent = send_all(fd, message, strlen(message));
        free(message);
        if (sent != 0) goto done;
        if (read_until(c, fd, sealed_complete) != 0) goto done; // plain JSON (an error) ends here too
        // Open the answer.
        char *first = memchr(c->buffer, ':', c->used);
        char *second = memchr(first + 1, ':', c->used - (size_t)(first + 1 - c->buffer));
        if (second == NULL) goto done;
        size_t plain = strtoul(c->buffer, NULL, 10);
        unsigned char their_nonce[crypto_secretbox_NONCEBYTES];
        if (sodium_base642bin(their_nonce, sizeof their_nonce, first + 1, (size_t)(second - first - 1), NULL, &decoded, NULL,
                              sodium_base64_VARIANT_ORIGINAL) != 0)
            goto done;
        unsigned char *box = malloc(plain + crypto_secretbox_MACBYTES);
        unsigned char *opened = malloc(plain + 1);
        size_t box_length;
        if (sodium_base642bin(box, plain + crypto_secretbox_MACBYTES, second + 1, c->used - (size_t)(second + 1 - c->buffer), NULL,
                              &box_length, NULL, sodium_base64_VARIANT_ORIGINAL) == 0 &&
            crypto_secretbox_open_easy(opened, box, box_length, their_nonce, key) == 0 &&
            has((char *)opened, box_length - crypto_secretbox_MACBYTES, "\"success\""))
            result = 0;
        free(box);
        free(opened);
    done:
        close(fd);
        return result;
    }
    }
    return -1;
}

// ----------------------------------------------------------------- the runs

struct worker {
    pthread_t thread;
    struct client client;
    double warm_until, stop_at;
    long limit; // `many`: this worker's share of the requests; 0 in `run`
    double *samples;
    size_t count, capacity;
    long ok, errors;
    pthread_barrier_t *barrier;
};

static void record(struct worker *w, double seconds) {
    if (w->count == w->capacity) {
        w->capacity = w->capacity ? w->capacity * 2 : 4096;
        w->samples = realloc(w->samples, w->capacity * sizeof *w->samples);
    }
    w->samples[w->count++] = seconds;
}

static void *closed_loop(void *argument) {
    struct worker *w = argument;
    pthread_barrier_wait(w->barrier);
    for (;;) {
        double start = now();
        if (w->limit > 0 ? w->ok + w->errors >= w->limit : start >= w->stop_at) break;
        int failed = one_request(&w->client);
        double end = now();
        if (start < w->warm_until) continue;
        if (failed) {
            w->errors++;
        } else {
            w->ok++;
            record(w, end - start);
        }
    }
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double at(const double *sorted, size_t count, double p) {
    if (count == 0) return 0;
    size_t index = (size_t)(count * p);
    return sorted[index < count ? index : count - 1];
}

static enum mode parse_mode(const char *name) {
    if (strcmp(name, "line") == 0) return LINE;
    if (strcmp(name, "conn") == 0) return CONN;
    if (strcmp(name, "oidc") == 0) return OIDC;
    fprintf(stderr, "unknown mode %s\n", name);
    exit(2);
}

static int run(enum mode mode, const char *path, int clients, double seconds, long total_requests, const char *request) {
    struct worker *workers = calloc((size_t)clients, sizeof *workers);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)clients + 1);
    for (int i = 0; i < clients; i++) {
        client_init(&workers[i].client, mode, path, request);
        workers[i].barrier = &barrier;
        // LINE: connect before the clock starts, as a companion that stays.
        if (mode == LINE && (workers[i].client.fd = dial(path)) < 0) die("connect");
    }
    for (int i = 0; i < clients; i++) {
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setstacksize(&attributes, 256 * 1024);
        if (pthread_create(&workers[i].thread, &attributes, closed_loop, &workers[i]) != 0) die("pthread_create");
    }
    double start = now();
    for (int i = 0; i < clients; i++) {
        workers[i].warm_until = total_requests > 0 ? 0 : start + 0.3;
        workers[i].stop_at = start + 0.3 + seconds;
        workers[i].limit = total_requests > 0 ? total_requests / clients + (i < total_requests % clients) : 0;
    }
    pthread_barrier_wait(&barrier);
    double began = now();
    long ok = 0, errors = 0;
    size_t total = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(workers[i].thread, NULL);
        ok += workers[i].ok;
        errors += workers[i].errors;
        total += workers[i].count;
    }
    if (total_requests > 0) seconds = now() - began;
    double *all = malloc((total + 1) * sizeof *all);
    size_t filled = 0;
    for (int i = 0; i < clients; i++) {
        memcpy(all + filled, workers[i].samples, workers[i].count * sizeof *all);
        filled += workers[i].count;
    }
    qsort(all, total, sizeof *all, by_value);
    printf("ok=%ld err=%ld rate=%.0f p50=%.1f p99=%.1f p999=%.1f max=%.1f\n", ok, errors, ok / seconds,
           at(all, total, 0.5) * 1e6, at(all, total, 0.99) * 1e6, at(all, total, 0.999) * 1e6,
           total ? all[total - 1] * 1e6 : 0);
    return 0;
}

struct bursting {
    pthread_t thread;
    struct client client;
    pthread_barrier_t *barrier;
    double *start;
    double wait;
    int failed;
};

static void *one_burst(void *argument) {
    struct bursting *b = argument;
    pthread_barrier_wait(b->barrier);
    b->failed = one_request(&b->client);
    b->wait = now() - *b->start;
    return NULL;
}

static int burst(enum mode mode, const char *path, int clients, const char *request) {
    struct bursting *all = calloc((size_t)clients, sizeof *all);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)clients + 1);
    double start = 0;
    for (int i = 0; i < clients; i++) {
        client_init(&all[i].client, mode, path, request);
        if (mode == LINE && (all[i].client.fd = dial(path)) < 0) die("connect");
        all[i].barrier = &barrier;
        all[i].start = &start;
        if (pthread_create(&all[i].thread, NULL, one_burst, &all[i]) != 0) die("pthread_create");
    }
    start = now();
    pthread_barrier_wait(&barrier);
    double *waits = malloc((size_t)clients * sizeof *waits);
    long ok = 0, errors = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(all[i].thread, NULL);
        waits[i] = all[i].wait;
        if (all[i].failed) errors++;
        else ok++;
    }
    qsort(waits, (size_t)clients, sizeof *waits, by_value);
    printf("ok=%ld err=%ld p50=%.1f max=%.1f\n", ok, errors, at(waits, (size_t)clients, 0.5) * 1e6, waits[clients - 1] * 1e6);
    return 0;
}

int main(int argc, char **argv) {
    if (sodium_init() < 0) die("sodium_init");
    if (argc == 4 && strcmp(argv[1], "echo") == 0) return echo_server(argv[2], strtoul(argv[3], NULL, 10));
    if (argc == 7 && strcmp(argv[1], "run") == 0)
        return run(parse_mode(argv[2]), argv[3], atoi(argv[4]), atof(argv[5]), 0, argv[6]);
    if (argc == 7 && strcmp(argv[1], "many") == 0)
        return run(parse_mode(argv[2]), argv[3], atoi(argv[4]), 0, atol(argv[5]), argv[6]);
    if (argc == 6 && strcmp(argv[1], "burst") == 0) return burst(parse_mode(argv[2]), argv[3], atoi(argv[4]), argv[5]);
    fprintf(stderr,
            "usage: vbload echo PATH REPLY_BYTES\n"
            "       vbload run line|conn|oidc PATH CLIENTS SECONDS REQUEST\n"
            "       vbload many line|conn|oidc PATH CLIENTS TOTAL REQUEST\n"
            "       vbload burst line|conn|oidc PATH CLIENTS REQUEST\n");
    return 2;
}
