import VaultCrypto

/// The plaintext of one sealed record: a list of (tag, length, bytes) fields,
/// built and parsed in guarded memory so no unguarded copy of a token exists.
extension AccountSecrets {
    private enum Tag: UInt8 {
        case refreshToken = 1
        case clientSecret = 2
        case idToken = 3
        case dpopKey = 4
        case registrationAccessToken = 5
        case registrationClientURI = 6
    }

    private var fields: [(UInt8, SecretBytes)] {
        var fields: [(UInt8, SecretBytes)] = []
        if let refreshToken { fields.append((Tag.refreshToken.rawValue, refreshToken)) }
        if let clientSecret { fields.append((Tag.clientSecret.rawValue, clientSecret)) }
        if let idToken { fields.append((Tag.idToken.rawValue, idToken)) }
        if let dpopKey { fields.append((Tag.dpopKey.rawValue, dpopKey)) }
        if let registrationAccessToken { fields.append((Tag.registrationAccessToken.rawValue, registrationAccessToken)) }
        if let registrationClientURI { fields.append((Tag.registrationClientURI.rawValue, registrationClientURI)) }
        for field in self.unknownFields { fields.append((field.tag, field.value)) }
        return fields
    }

    func encoded() throws(StoreError) -> SecretBytes {
        let fields = self.fields
        let total = fields.reduce(0) { $0 + 5 + $1.1.count }
        let encoded: SecretBytes?
        do {
            encoded = try SecretBytes(count: total) { out in
                var offset = 0
                for (tag, value) in fields {
                    out[offset] = tag
                    let length = UInt32(value.count)
                    for i in 0..<4 { out[offset + 1 + i] = UInt8(truncatingIfNeeded: length >> (24 - 8 * i)) }
                    offset += 5
                    value.withUnsafeBytes { bytes in
                        UnsafeMutableRawBufferPointer(rebasing: out[offset..<offset + bytes.count])
                            .copyMemory(from: bytes)
                    }
                    offset += value.count
                }
                return true
            }
        } catch {
            throw StoreError(.io, "could not allocate guarded memory for a record")
        }
        guard let encoded else { throw StoreError(.io, "could not encode a record") }
        return encoded
    }

    init(decoding plaintext: SecretBytes) throws(StoreError) {
        self.init()
        let parsed: Result<AccountSecrets, StoreError> = plaintext.withUnsafeBytes { bytes in
            var secrets = AccountSecrets()
            var offset = 0
            while offset < bytes.count {
                guard bytes.count - offset >= 5 else {
                    return .failure(StoreError(.corrupt, "a record's fields are cut short"))
                }
                let tag = bytes[offset]
                var length = 0
                for i in 0..<4 { length = length << 8 | Int(bytes[offset + 1 + i]) }
                offset += 5
                guard bytes.count - offset >= length else {
                    return .failure(StoreError(.corrupt, "a record's field runs past its end"))
                }
                let value: SecretBytes
                do {
                    value = try SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + length]))
                } catch {
                    return .failure(StoreError(.io, "could not allocate guarded memory for a record"))
                }
                offset += length
                switch Tag(rawValue: tag) {
                case .refreshToken: secrets.refreshToken = value
                case .clientSecret: secrets.clientSecret = value
                case .idToken: secrets.idToken = value
                case .dpopKey: secrets.dpopKey = value
                case .registrationAccessToken: secrets.registrationAccessToken = value
                case .registrationClientURI: secrets.registrationClientURI = value
                case nil:
                    // A field from a newer version: authenticated, kept unread, written back.
                    secrets.unknownFields.removeAll { $0.tag == tag }
                    secrets.unknownFields.append(UnknownField(tag: tag, value: value))
                }
            }
            return .success(secrets)
        }
        self = try parsed.get()
    }
}
