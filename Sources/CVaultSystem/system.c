#define _GNU_SOURCE
#include <malloc.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <stddef.h>

#include "CVaultSystem.h"

_Static_assert(sizeof(struct ucred) == sizeof(vault_peer_credentials), "ucred layout");
_Static_assert(offsetof(struct ucred, uid) == offsetof(vault_peer_credentials, uid), "ucred uid");

int vault_set_undumpable(void) {
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

int vault_limit_malloc_arenas(int arenas) {
    return mallopt(M_ARENA_MAX, arenas);
}

int vault_trim_heap(void) {
    return malloc_trim(0);
}
