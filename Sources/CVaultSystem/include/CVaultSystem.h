#ifndef CVAULTSYSTEM_H
#define CVAULTSYSTEM_H

#include <stdint.h>

/// Layout-identical to Linux `struct ucred`, which Swift's Glibc module hides
/// behind _GNU_SOURCE. system.c checks the layout at compile time.
typedef struct {
    int32_t pid;
    uint32_t uid;
    uint32_t gid;
} vault_peer_credentials;

/// SO_PEERPIDFD (Linux 6.5+): a pidfd of the peer of a Unix socket, which
/// this glibc's headers may not name yet.
#define VAULT_SO_PEERPIDFD 77

/// prctl(PR_SET_DUMPABLE, 0), as ssh-agent does: no core dumps, no ptrace by
/// other processes of the same user. prctl is variadic, hence this shim.
int vault_set_undumpable(void);

/// Caps glibc's malloc arenas (mallopt M_ARENA_MAX); returns 1 on success.
int vault_limit_malloc_arenas(int arenas);

/// Returns the free pages of glibc's heap to the system (malloc_trim(0));
/// returns 1 when some were released.
int vault_trim_heap(void);

#endif
