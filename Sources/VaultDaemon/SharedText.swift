import VaultProtocol

/// The issuer and scope list of many accounts, held once: each account's
/// configuration was decoded with its own copy of the same text, about 130
/// bytes per account when many accounts sign in at one issuer.
struct SharedText {
    private var issuers: Set<String> = []
    private var scopeLists: Set<[String]> = []

    init(_ configurations: some Sequence<AccountConfiguration> = []) {
        for configuration in configurations {
            self.issuers.insert(configuration.issuer)
            self.scopeLists.insert(configuration.scopes)
        }
    }

    /// `configuration`, its issuer and scopes sharing the storage of equal ones seen before.
    mutating func share(_ configuration: AccountConfiguration) -> AccountConfiguration {
        var shared = configuration
        if let index = self.issuers.firstIndex(of: configuration.issuer) {
            shared.issuer = self.issuers[index]
        } else {
            self.issuers.insert(configuration.issuer)
        }
        if let index = self.scopeLists.firstIndex(of: configuration.scopes) {
            shared.scopes = self.scopeLists[index]
        } else {
            self.scopeLists.insert(configuration.scopes)
        }
        return shared
    }
}
