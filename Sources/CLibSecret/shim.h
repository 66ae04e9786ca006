#include <libsecret/secret.h>

/* Helpers for what Swift cannot write against libsecret: fixed-size schema
 * arrays, macros built from expressions, OR-ed C enum flags. */

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
static inline GHashTable *tv_account_attributes(const char *application, const char *account) {
    GHashTable *attributes = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_hash_table_insert(attributes, g_strdup("application"), g_strdup(application));
    g_hash_table_insert(attributes, g_strdup("account"), g_strdup(account));
    return attributes;
}

/* Every match, locked or not, optionally with its secret. */
static inline SecretSearchFlags tv_search_flags(gboolean load_secrets) {
    return (SecretSearchFlags)(SECRET_SEARCH_ALL | (load_secrets ? SECRET_SEARCH_LOAD_SECRETS : 0));
}

static inline void tv_object_list_free(GList *objects) {
    g_list_free_full(objects, g_object_unref);
}

static inline const char *tv_object_path(gpointer proxy) {
    return g_dbus_proxy_get_object_path(G_DBUS_PROXY(proxy));
}

static inline gboolean tv_error_is_locked(const GError *error) {
    return g_error_matches(error, SECRET_ERROR, SECRET_ERROR_IS_LOCKED);
}

/* The unique name owning the proxy's well-known name, or NULL; g_free it. */
static inline char *tv_proxy_name_owner(gpointer proxy) {
    return g_dbus_proxy_get_name_owner(G_DBUS_PROXY(proxy));
}
