/* libsecret and the GLib, GObject and GIO functions vaultd calls, for a
 * library vaultd loads at run time, the first time the keyring backend is
 * used (Sources/VaultStore/LibSecret.swift): an idle vaultd on the sealed
 * file maps none of libsecret, gio, gobject, glib and what they pull in,
 * and runs none of their constructors.
 *
 * Nothing here is linked. The types and constants below are those of the
 * libraries' stable ABI (libsecret-1, GLib 2), declared here rather than
 * taken from <libsecret/secret.h>: SwiftPM links pkg-config's libraries into
 * every product of a target whose headers come from pkg-config. The
 * prototypes only give the types of the pointers LibSecret.swift looks up
 * with dlsym; calling one directly fails vaultd's link.
 *
 * Tests/VaultStoreTests/LibSecretTests.swift checks all of it against the
 * system's headers: this file compiles after <libsecret/secret.h> with
 * TV_CHECK_SYSTEM_HEADERS (the prototypes must agree), and the layouts and
 * constants must come out the same with either. */

#if defined(__clang__)
/* One _Nonnull below (the table's pointers) would otherwise ask for a
 * nullability on every pointer of the file. */
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wnullability-completeness"
#endif

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef TV_CHECK_SYSTEM_HEADERS

typedef char gchar;
typedef int gint;
typedef unsigned int guint;
typedef gint gboolean;
typedef size_t gsize;
typedef ssize_t gssize;
typedef uint32_t guint32;
typedef uint64_t guint64;
typedef void *gpointer;
typedef const void *gconstpointer;
typedef gsize GType;
typedef guint32 GQuark;

typedef guint (*GHashFunc)(gconstpointer key);
typedef gboolean (*GEqualFunc)(gconstpointer a, gconstpointer b);
typedef void (*GDestroyNotify)(gpointer data);

typedef struct _GError {
    GQuark domain;
    gint code;
    gchar *message;
} GError;

typedef struct _GList GList;
struct _GList {
    gpointer data;
    GList *next;
    GList *prev;
};

/* Opaque in GLib's headers too. */
typedef struct _GHashTable GHashTable;
typedef struct _GMainContext GMainContext;
typedef struct _GDBusConnection GDBusConnection;
typedef struct _SecretValue SecretValue;

/* GObject instances, only ever handled through pointers: declared complete
 * (their fields are the libraries' business) so that Swift keeps one
 * pointer type for each, as it does with the real headers. */
typedef struct _GCancellable { gpointer tv_private; } GCancellable;
typedef struct _GDBusProxy { gpointer tv_private; } GDBusProxy;
typedef struct _SecretService { gpointer tv_private; } SecretService;
typedef struct _SecretCollection { gpointer tv_private; } SecretCollection;
typedef struct _SecretItem { gpointer tv_private; } SecretItem;

typedef enum {
    G_BUS_TYPE_STARTER = -1,
    G_BUS_TYPE_NONE = 0,
    G_BUS_TYPE_SYSTEM = 1,
    G_BUS_TYPE_SESSION = 2,
} GBusType;

typedef enum {
    SECRET_SCHEMA_ATTRIBUTE_STRING = 0,
    SECRET_SCHEMA_ATTRIBUTE_INTEGER = 1,
    SECRET_SCHEMA_ATTRIBUTE_BOOLEAN = 2,
} SecretSchemaAttributeType;

typedef struct {
    const gchar *name;
    SecretSchemaAttributeType type;
} SecretSchemaAttribute;

typedef enum {
    SECRET_SCHEMA_NONE = 0,
    SECRET_SCHEMA_DONT_MATCH_NAME = 1 << 1,
} SecretSchemaFlags;

typedef struct {
    const gchar *name;
    SecretSchemaFlags flags;
    SecretSchemaAttribute attributes[32];
    gint reserved;
    gpointer reserved1;
    gpointer reserved2;
    gpointer reserved3;
    gpointer reserved4;
    gpointer reserved5;
    gpointer reserved6;
    gpointer reserved7;
} SecretSchema;

typedef enum {
    SECRET_SEARCH_NONE = 0,
    SECRET_SEARCH_ALL = 1 << 1,
    SECRET_SEARCH_UNLOCK = 1 << 2,
    SECRET_SEARCH_LOAD_SECRETS = 1 << 3,
} SecretSearchFlags;

typedef enum {
    SECRET_COLLECTION_NONE = 0,
    SECRET_COLLECTION_LOAD_ITEMS = 1 << 1,
} SecretCollectionFlags;

typedef enum {
    SECRET_SERVICE_NONE = 0,
    SECRET_SERVICE_OPEN_SESSION = 1 << 1,
    SECRET_SERVICE_LOAD_COLLECTIONS = 1 << 2,
} SecretServiceFlags;

typedef enum {
    SECRET_ITEM_CREATE_NONE = 0,
    SECRET_ITEM_CREATE_REPLACE = 1 << 1,
} SecretItemCreateFlags;

typedef enum {
    SECRET_ERROR_PROTOCOL = 1,
    SECRET_ERROR_IS_LOCKED = 2,
} SecretError;

#endif /* TV_CHECK_SYSTEM_HEADERS */

/* Every function vaultd calls. The names in parentheses are not expanded
 * where a newer GLib makes one a macro as well. */
#define TV_LIBSECRET_FUNCTIONS(F) \
    F(secret_service_get_type) \
    F(secret_service_open_sync) \
    F(secret_service_unlock_sync) \
    F(secret_collection_for_alias_sync) \
    F(secret_collection_get_locked) \
    F(secret_collection_search_sync) \
    F(secret_item_create_sync) \
    F(secret_item_delete_sync) \
    F(secret_item_get_modified) \
    F(secret_item_get_secret) \
    F(secret_value_new) \
    F(secret_value_get) \
    F(secret_value_unref) \
    F(secret_error_get_quark) \
    F(g_bus_get_sync) \
    F(g_dbus_connection_set_exit_on_close) \
    F(g_dbus_connection_is_closed) \
    F(g_dbus_proxy_get_object_path) \
    F(g_dbus_proxy_get_name_owner) \
    F(g_cancellable_new) \
    F(g_cancellable_cancel) \
    F(g_cancellable_is_cancelled) \
    F(g_object_unref) \
    F(g_main_context_new) \
    F(g_main_context_unref) \
    F(g_main_context_push_thread_default) \
    F(g_main_context_pop_thread_default) \
    F(g_main_context_iteration) \
    F(g_main_context_acquire) \
    F(g_main_context_release) \
    F(g_hash_table_new_full) \
    F(g_hash_table_insert) \
    F(g_hash_table_unref) \
    F(g_str_hash) \
    F(g_str_equal) \
    F(g_strdup) \
    F(g_free) \
    F(g_list_append) \
    F(g_list_free) \
    F(g_list_free_full) \
    F(g_error_matches) \
    F(g_error_free)

GType (secret_service_get_type)(void);
SecretService *(secret_service_open_sync)(GType service_gtype, const gchar *service_bus_name, SecretServiceFlags flags,
                                          GCancellable *cancellable, GError **error);
gint (secret_service_unlock_sync)(SecretService *service, GList *objects, GCancellable *cancellable, GList **unlocked,
                                  GError **error);
SecretCollection *(secret_collection_for_alias_sync)(SecretService *service, const gchar *alias,
                                                     SecretCollectionFlags flags, GCancellable *cancellable,
                                                     GError **error);
gboolean (secret_collection_get_locked)(SecretCollection *self);
GList *(secret_collection_search_sync)(SecretCollection *self, const SecretSchema *schema, GHashTable *attributes,
                                       SecretSearchFlags flags, GCancellable *cancellable, GError **error);
SecretItem *(secret_item_create_sync)(SecretCollection *collection, const SecretSchema *schema,
                                      GHashTable *attributes, const gchar *label, SecretValue *value,
                                      SecretItemCreateFlags flags, GCancellable *cancellable, GError **error);
gboolean (secret_item_delete_sync)(SecretItem *self, GCancellable *cancellable, GError **error);
guint64 (secret_item_get_modified)(SecretItem *self);
SecretValue *(secret_item_get_secret)(SecretItem *self);
SecretValue *(secret_value_new)(const gchar *secret, gssize length, const gchar *content_type);
const gchar *(secret_value_get)(SecretValue *value, gsize *length);
void (secret_value_unref)(gpointer value);
GQuark (secret_error_get_quark)(void);
GDBusConnection *(g_bus_get_sync)(GBusType bus_type, GCancellable *cancellable, GError **error);
void (g_dbus_connection_set_exit_on_close)(GDBusConnection *connection, gboolean exit_on_close);
gboolean (g_dbus_connection_is_closed)(GDBusConnection *connection);
const gchar *(g_dbus_proxy_get_object_path)(GDBusProxy *proxy);
gchar *(g_dbus_proxy_get_name_owner)(GDBusProxy *proxy);
GCancellable *(g_cancellable_new)(void);
void (g_cancellable_cancel)(GCancellable *cancellable);
gboolean (g_cancellable_is_cancelled)(GCancellable *cancellable);
void (g_object_unref)(gpointer object);
GMainContext *(g_main_context_new)(void);
void (g_main_context_unref)(GMainContext *context);
void (g_main_context_push_thread_default)(GMainContext *context);
void (g_main_context_pop_thread_default)(GMainContext *context);
gboolean (g_main_context_iteration)(GMainContext *context, gboolean may_block);
gboolean (g_main_context_acquire)(GMainContext *context);
void (g_main_context_release)(GMainContext *context);
GHashTable *(g_hash_table_new_full)(GHashFunc hash_func, GEqualFunc key_equal_func, GDestroyNotify key_destroy_func,
                                    GDestroyNotify value_destroy_func);
gboolean (g_hash_table_insert)(GHashTable *hash_table, gpointer key, gpointer value);
void (g_hash_table_unref)(GHashTable *hash_table);
guint (g_str_hash)(gconstpointer v);
gboolean (g_str_equal)(gconstpointer v1, gconstpointer v2);
gchar *(g_strdup)(const gchar *str);
void (g_free)(gpointer mem);
GList *(g_list_append)(GList *list, gpointer data);
void (g_list_free)(GList *list);
void (g_list_free_full)(GList *list, GDestroyNotify free_func);
gboolean (g_error_matches)(const GError *error, GQuark domain, gint code);
void (g_error_free)(GError *error);

/* The functions, looked up in the loaded library; never NULL once filled. */
#if defined(__clang__)
#define TV_NONNULL _Nonnull
#else
#define TV_NONNULL
#endif
typedef struct {
#define TV_FIELD(name) __typeof__(name) *TV_NONNULL name;
    TV_LIBSECRET_FUNCTIONS(TV_FIELD)
#undef TV_FIELD
} TVLibSecret;

/* Fills `table` from `handle`: dlsym on a library's handle searches it and
 * then the libraries it needs, which is where the g_ functions are. Returns
 * the name of the first function not found, or NULL. */
static inline const char *tv_libsecret_resolve(void *handle, TVLibSecret *table) {
#define TV_RESOLVE(name) \
    if (!(table->name = (__typeof__(name) *)dlsym(handle, #name))) return #name;
    TV_LIBSECRET_FUNCTIONS(TV_RESOLVE)
#undef TV_RESOLVE
    return NULL;
}

/* Helpers for what Swift cannot write against libsecret: fixed-size schema
 * arrays, OR-ed C enum flags. */

/* tokenvault's items: one per account, found by these two attributes.
 * DONT_MATCH_NAME: searches match items whatever schema name they carry
 * (an item someone stored by hand with secret-tool is found and replaced). */
static inline const SecretSchema *tv_account_schema(void) {
    static const SecretSchema schema = {
        .name = "org.tokenvault.Account",
        .flags = SECRET_SCHEMA_DONT_MATCH_NAME,
        .attributes = {
            { "application", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { "account", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { NULL, 0 },
        },
    };
    return &schema;
}

/* A new table of the two attributes; free with g_hash_table_unref. */
static inline GHashTable *tv_account_attributes(const TVLibSecret *lib, const char *application, const char *account) {
    GHashTable *attributes = lib->g_hash_table_new_full(lib->g_str_hash, lib->g_str_equal, lib->g_free, lib->g_free);
    lib->g_hash_table_insert(attributes, lib->g_strdup("application"), lib->g_strdup(application));
    lib->g_hash_table_insert(attributes, lib->g_strdup("account"), lib->g_strdup(account));
    return attributes;
}

/* Every match, locked or not, optionally with its secret. */
static inline SecretSearchFlags tv_search_flags(gboolean load_secrets) {
    return (SecretSearchFlags)(SECRET_SEARCH_ALL | (load_secrets ? SECRET_SEARCH_LOAD_SECRETS : 0));
}

static inline void tv_object_list_free(const TVLibSecret *lib, GList *objects) {
    lib->g_list_free_full(objects, lib->g_object_unref);
}

/* Secret Service objects are D-Bus proxies (SecretItem and the others
 * derive from GDBusProxy, whose functions check the instance). */
static inline const char *tv_object_path(const TVLibSecret *lib, gpointer proxy) {
    return lib->g_dbus_proxy_get_object_path((GDBusProxy *)proxy);
}

static inline gboolean tv_error_is_locked(const TVLibSecret *lib, const GError *error) {
    return lib->g_error_matches(error, lib->secret_error_get_quark(), SECRET_ERROR_IS_LOCKED);
}

/* The unique name owning the proxy's well-known name, or NULL; g_free it. */
static inline char *tv_proxy_name_owner(const TVLibSecret *lib, gpointer proxy) {
    return lib->g_dbus_proxy_get_name_owner((GDBusProxy *)proxy);
}

#if defined(__clang__)
#pragma clang diagnostic pop
#endif
