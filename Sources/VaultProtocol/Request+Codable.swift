import FoundationEssentials
import VaultCrypto

extension Request: Decodable {
    private enum Key: String, CodingKey {
        case id, op, name, passphrase, account, scope, method, username, password, flow, code, accounts, all, to, restart
        case socket, ttl, scopes, share, htm, htu, origin, nonce, dpop
        case timeoutMs = "timeout_ms"
        case minTTL = "min_ttl"
        case forceRefresh = "force_refresh"
        case clientSecret = "client_secret"
        case refreshToken = "refresh_token"
        case registrationToken = "registration_token"
    }

    /// The fields that carry secrets: `LineCodec` takes them into guarded
    /// memory before the rest of the line is decoded.
    static let secretKeys: Set<String> = [
        Key.passphrase, .password, .code, .clientSecret, .refreshToken, .registrationToken,
    ].reduce(into: []) { $0.insert($1.stringValue) }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Key.self)
        self.id = try container.decodeIfPresent(RequestID.self, forKey: .id)
        do {
            self.command = .success(try Self.command(in: container, decoder: decoder))
        } catch let error as VaultError {
            self.command = .failure(error)
        } catch let error as DecodingError {
            self.command = .failure(.malformed(Self.sentence(for: error)))
        }
    }

    private static func command(in c: KeyedDecodingContainer<Key>, decoder: any Decoder) throws -> Command {
        guard c.contains(.op) else { throw VaultError.noOp }
        let name = try c.decode(String.self, forKey: .op)
        guard let op = Op(rawValue: name) else {
            let shown = name.count <= 32 && name.allSatisfy { $0.isLetter || $0 == "." || $0 == "_" } ? " '\(name)'" : ""
            throw VaultError.unknownOp(shown)
        }
        switch op {
        case .hello: return .hello
        case .status: return .status
        case .lock: return .lock
        case .unlock: return .unlock(passphrase: try c.decodeSecretIfPresent(decoder, forKey: .passphrase))
        case .accountRemove: return .accountRemove(name: try c.decode(String.self, forKey: .name))
        case .claims: return .claims(account: try c.decode(String.self, forKey: .account))
        case .userinfo: return .userinfo(account: try c.decode(String.self, forKey: .account))
        case .refreshToken: return .refreshToken(account: try c.decode(String.self, forKey: .account))
        case .migrate:
            guard let target = Backend(rawValue: try c.decode(String.self, forKey: .to)) else {
                throw VaultError.badBackend
            }
            return .migrate(to: target)
        case .token:
            return .token(try Self.tokenRequest(in: c))
        case .dpopProof:
            let token = try Self.tokenRequest(in: c)
            guard let target = DPoPTarget(method: try c.decode(String.self, forKey: .htm), url: try c.decode(String.self, forKey: .htu))
            else { throw VaultError.badDPoPTarget }
            return .dpopProof(DPoPProofRequest(token: token, target: target))
        case .dpopNonce:
            let account = try c.decode(String.self, forKey: .account)
            guard let origin = DPoPNonce.origin(try c.decode(String.self, forKey: .origin)) else { throw VaultError.badDPoPOrigin }
            guard let nonce = DPoPNonce.valid(try c.decode(String.self, forKey: .nonce)) else { throw VaultError.badDPoPNonce }
            return .dpopNonce(account: account, origin: origin, nonce: nonce)
        case .signinStart:
            return .signinStart(
                SignInStart(
                    account: try c.decode(String.self, forKey: .account),
                    method: try c.decode(SignInMethod.self, forKey: .method),
                    username: try c.decodeIfPresent(String.self, forKey: .username),
                    password: try c.decodeSecretIfPresent(decoder, forKey: .password),
                    restart: try c.decodeIfPresent(Bool.self, forKey: .restart) ?? false
                )
            )
        case .signinSubmitCode:
            guard let code = try c.decodeSecretIfPresent(decoder, forKey: .code) else {
                throw VaultError.required("code")
            }
            return .signinSubmitCode(flow: try c.decode(String.self, forKey: .flow), code: code)
        case .signinSubmitPassword:
            guard let password = try c.decodeSecretIfPresent(decoder, forKey: .password) else {
                throw VaultError.required("password")
            }
            return .signinSubmitPassword(flow: try c.decode(String.self, forKey: .flow), password: password)
        case .signinResendCode: return .signinResendCode(flow: try c.decode(String.self, forKey: .flow))
        case .signinCancel: return .signinCancel(flow: try c.decode(String.self, forKey: .flow))
        case .signinWait:
            let timeout = try c.decodeIfPresent(Int.self, forKey: .timeoutMs)
            if let timeout, !(0...600_000).contains(timeout) {
                throw VaultError.badWaitTimeout
            }
            return .signinWait(flow: try c.decode(String.self, forKey: .flow), timeoutMs: timeout)
        case .subscribe:
            return .subscribe(accounts: try c.decodeIfPresent([String].self, forKey: .accounts))
        case .signout:
            let all = try c.decodeIfPresent(Bool.self, forKey: .all) ?? false
            let account = try c.decodeIfPresent(String.self, forKey: .account)
            switch (account, all) {
            case (let name?, false): return .signout(.account(name))
            case (nil, true): return .signout(.all)
            default: throw VaultError.signoutTarget
            }
        case .shareOpen:
            let accounts = try c.decode([String].self, forKey: .accounts)
            guard !accounts.isEmpty else { throw VaultError.shareWithoutAccounts }
            let ttl = try c.decodeIfPresent(Int.self, forKey: .ttl)
            if let ttl, !(1...ShareOpen.maximumTTL).contains(ttl) {
                throw VaultError.badShareTTL
            }
            let scopes = try c.decodeIfPresent([String].self, forKey: .scopes)
            if let scopes, scopes.isEmpty || !scopes.allSatisfy({ !$0.isEmpty && !$0.contains(" ") }) {
                throw VaultError.badScopeList("scopes")
            }
            return .shareOpen(
                ShareOpen(
                    accounts: accounts,
                    socket: try c.decode(String.self, forKey: .socket),
                    ttl: ttl,
                    scopes: scopes,
                    dpop: try c.decodeIfPresent(Bool.self, forKey: .dpop) ?? false
                )
            )
        case .shareList:
            return .shareList
        case .shareClose:
            switch (try c.decodeIfPresent(String.self, forKey: .share), try c.decodeIfPresent(String.self, forKey: .socket)) {
            case (let id?, nil): return .shareClose(.id(id))
            case (nil, let path?): return .shareClose(.socket(path))
            default: throw VaultError.shareCloseTarget
            }
        case .accountAdd:
            return .accountAdd(
                AccountAddition(
                    configuration: try AccountConfiguration(from: decoder),
                    clientSecret: try c.decodeSecretIfPresent(decoder, forKey: .clientSecret),
                    refreshToken: try c.decodeSecretIfPresent(decoder, forKey: .refreshToken),
                    registrationToken: try c.decodeSecretIfPresent(decoder, forKey: .registrationToken)
                )
            )
        }
    }

    /// The fields `token` and `dpop.proof` share.
    private static func tokenRequest(in c: KeyedDecodingContainer<Key>) throws -> TokenRequest {
        let minTTL = try c.decodeIfPresent(Int.self, forKey: .minTTL) ?? TokenRequest.defaultMinTTL
        guard TokenRequest.minTTLRange.contains(minTTL) else { throw VaultError.badMinTTL }
        return TokenRequest(
            account: try c.decode(String.self, forKey: .account),
            scopes: try Self.scopes(in: c),
            minTTL: minTTL,
            forceRefresh: try c.decodeIfPresent(Bool.self, forKey: .forceRefresh) ?? false
        )
    }

    /// `scope` as one space-separated string or a list of strings.
    private static func scopes(in c: KeyedDecodingContainer<Key>) throws -> [String]? {
        guard c.contains(.scope) else { return nil }
        let scopes: [String]
        if let list = try? c.decode([String].self, forKey: .scope) {
            scopes = list
        } else {
            scopes = try c.decode(String.self, forKey: .scope).split(separator: " ").map(String.init)
        }
        guard !scopes.isEmpty, scopes.allSatisfy({ !$0.isEmpty && !$0.contains(" ") }) else {
            throw VaultError.badScopeList("scope")
        }
        return scopes
    }

    /// Names the field, never its value: the value may be a secret.
    private static func sentence(for error: DecodingError) -> String {
        func path(_ context: DecodingError.Context, _ last: (any CodingKey)? = nil) -> String {
            let keys = context.codingPath + (last.map { [$0] } ?? [])
            return keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        }
        switch error {
        case .keyNotFound(let key, let context):
            return "the field '\(path(context, key))' is required"
        case .typeMismatch(_, let context):
            return "the field '\(path(context))' has the wrong type"
        case .valueNotFound(_, let context):
            return "the field '\(path(context))' must not be null"
        case .dataCorrupted(let context):
            return "the field '\(path(context))' is not valid"
        @unknown default:
            return "a request is one JSON object per line"
        }
    }
}

extension Request: Encodable {
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Key.self)
        try c.encodeIfPresent(self.id, forKey: .id)
        let command: Command
        switch self.command {
        case .success(let value): command = value
        case .failure(let error): throw error
        }
        switch command {
        case .hello: try c.encode(Op.hello.rawValue, forKey: .op)
        case .status: try c.encode(Op.status.rawValue, forKey: .op)
        case .lock: try c.encode(Op.lock.rawValue, forKey: .op)
        case .unlock(let passphrase):
            try c.encode(Op.unlock.rawValue, forKey: .op)
            try c.encodeSecretIfPresent(passphrase, forKey: .passphrase)
        case .accountRemove(let name):
            try c.encode(Op.accountRemove.rawValue, forKey: .op)
            try c.encode(name, forKey: .name)
        case .claims(let account):
            try c.encode(Op.claims.rawValue, forKey: .op)
            try c.encode(account, forKey: .account)
        case .userinfo(let account):
            try c.encode(Op.userinfo.rawValue, forKey: .op)
            try c.encode(account, forKey: .account)
        case .refreshToken(let account):
            try c.encode(Op.refreshToken.rawValue, forKey: .op)
            try c.encode(account, forKey: .account)
        case .migrate(let target):
            try c.encode(Op.migrate.rawValue, forKey: .op)
            try c.encode(target, forKey: .to)
        case .token(let request):
            try c.encode(Op.token.rawValue, forKey: .op)
            try Self.encode(request, into: &c)
        case .dpopProof(let request):
            try c.encode(Op.dpopProof.rawValue, forKey: .op)
            try Self.encode(request.token, into: &c)
            try c.encode(request.target.method, forKey: .htm)
            try c.encode(request.target.url, forKey: .htu)
        case .dpopNonce(let account, let origin, let nonce):
            try c.encode(Op.dpopNonce.rawValue, forKey: .op)
            try c.encode(account, forKey: .account)
            try c.encode(origin, forKey: .origin)
            try c.encode(nonce, forKey: .nonce)
        case .shareOpen(let open):
            try c.encode(Op.shareOpen.rawValue, forKey: .op)
            try c.encode(open.accounts, forKey: .accounts)
            try c.encode(open.socket, forKey: .socket)
            try c.encodeIfPresent(open.ttl, forKey: .ttl)
            try c.encodeIfPresent(open.scopes, forKey: .scopes)
            if open.dpop { try c.encode(true, forKey: .dpop) }
        case .shareList:
            try c.encode(Op.shareList.rawValue, forKey: .op)
        case .shareClose(let target):
            try c.encode(Op.shareClose.rawValue, forKey: .op)
            switch target {
            case .id(let id): try c.encode(id, forKey: .share)
            case .socket(let path): try c.encode(path, forKey: .socket)
            }
        case .signinStart(let start):
            try c.encode(Op.signinStart.rawValue, forKey: .op)
            try c.encode(start.account, forKey: .account)
            try c.encode(start.method, forKey: .method)
            try c.encodeIfPresent(start.username, forKey: .username)
            try c.encodeSecretIfPresent(start.password, forKey: .password)
            if start.restart { try c.encode(true, forKey: .restart) }
        case .signinSubmitCode(let flow, let code):
            try c.encode(Op.signinSubmitCode.rawValue, forKey: .op)
            try c.encode(flow, forKey: .flow)
            try c.encodeSecretIfPresent(code, forKey: .code)
        case .signinSubmitPassword(let flow, let password):
            try c.encode(Op.signinSubmitPassword.rawValue, forKey: .op)
            try c.encode(flow, forKey: .flow)
            try c.encodeSecretIfPresent(password, forKey: .password)
        case .signinResendCode(let flow):
            try c.encode(Op.signinResendCode.rawValue, forKey: .op)
            try c.encode(flow, forKey: .flow)
        case .signinCancel(let flow):
            try c.encode(Op.signinCancel.rawValue, forKey: .op)
            try c.encode(flow, forKey: .flow)
        case .signinWait(let flow, let timeoutMs):
            try c.encode(Op.signinWait.rawValue, forKey: .op)
            try c.encode(flow, forKey: .flow)
            try c.encodeIfPresent(timeoutMs, forKey: .timeoutMs)
        case .subscribe(let accounts):
            try c.encode(Op.subscribe.rawValue, forKey: .op)
            try c.encodeIfPresent(accounts, forKey: .accounts)
        case .signout(let target):
            try c.encode(Op.signout.rawValue, forKey: .op)
            switch target {
            case .account(let name): try c.encode(name, forKey: .account)
            case .all: try c.encode(true, forKey: .all)
            }
        case .accountAdd(let addition):
            try c.encode(Op.accountAdd.rawValue, forKey: .op)
            try addition.configuration.encode(to: encoder)
            try c.encodeSecretIfPresent(addition.clientSecret, forKey: .clientSecret)
            try c.encodeSecretIfPresent(addition.refreshToken, forKey: .refreshToken)
            try c.encodeSecretIfPresent(addition.registrationToken, forKey: .registrationToken)
        }
    }
}

extension Request {
    private static func encode(_ request: TokenRequest, into c: inout KeyedEncodingContainer<Key>) throws {
        try c.encode(request.account, forKey: .account)
        try c.encodeIfPresent(request.scopes, forKey: .scope)
        try c.encode(request.minTTL, forKey: .minTTL)
        if request.forceRefresh { try c.encode(true, forKey: .forceRefresh) }
    }
}

extension CodingUserInfoKey {
    /// `[String: SecretBytes]`: the secret fields `SecretFields` took out of
    /// the bytes being decoded, by name.
    static let secretFields = CodingUserInfoKey(rawValue: "tokenvault.secret-fields")!
}

extension KeyedDecodingContainer {
    /// A secret string field: as `SecretFields` took it into guarded memory,
    /// or, for a decoder that did not take it (a test's), decoded here.
    func decodeSecretIfPresent(_ decoder: any Decoder, forKey key: Key) throws -> SecretBytes? {
        if let taken = decoder.userInfo[.secretFields] as? [String: SecretBytes], let secret = taken[key.stringValue] {
            return secret
        }
        guard let string = try self.decodeIfPresent(String.self, forKey: key) else { return nil }
        return try SecretBytes(utf8: string)
    }
}

extension KeyedEncodingContainer {
    mutating func encodeSecretIfPresent(_ secret: SecretBytes?, forKey key: Key) throws {
        guard let secret else { return }
        try self.encode(secret.unsafeString(), forKey: key)
    }
}
