import Foundation

/// Minimal JSON value used for every JSON payload crossing the C ABI (requests, config,
/// info, and the rare toolCalls/done/error events). `parse` and `serialized` are small
/// hand-written byte-level routines (Foundation's Codable coders cost microseconds per
/// call); the Codable conformance is kept for code that wants it.
enum JSON: Codable, Equatable, Sendable {
    case null
    case bool(Bool)
    case int(Int)
    case double(Double)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int.self) { self = .int(i) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([JSON].self) { self = .array(a) }
        else { self = .object(try c.decode([String: JSON].self)) }
    }

    func encode(to encoder: Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .int(let i): try c.encode(i)
        case .double(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }

    subscript(key: String) -> JSON? {
        if case .object(let o) = self { return o[key] }
        return nil
    }

    var string: String? { if case .string(let s) = self { return s }; return nil }
    var array: [JSON]? { if case .array(let a) = self { return a }; return nil }
    var object: [String: JSON]? { if case .object(let o) = self { return o }; return nil }
    var int: Int? {
        switch self {
        case .int(let i): return i
        case .double(let d): return d.isFinite && abs(d) < 9.2e18 ? Int(d) : nil
        default: return nil
        }
    }
    var double: Double? {
        switch self {
        case .int(let i): return Double(i)
        case .double(let d): return d
        default: return nil
        }
    }
    var bool: Bool? { if case .bool(let b) = self { return b }; return nil }

    /// Parses UTF-8 JSON text. Throws OamError("invalid_request", ...) on malformed input.
    static func parse(_ text: String) throws -> JSON {
        var text = text
        return try text.withUTF8 { buf in
            var p = JSONParser(buf)
            p.skipSpace()
            let v = try p.value(depth: 0)
            p.skipSpace()
            guard p.i == buf.count else { throw p.error("trailing characters") }
            return v
        }
    }

    /// Compact JSON with sorted object keys, slashes and non-ASCII unescaped.
    func serialized() -> String {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    func write(into out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): out.append(contentsOf: String(i).utf8)
        case .double(let d):
            if d.isFinite {
                out.append(contentsOf: "\(d)".utf8)   // "2.0", "0.1", "1e-05", "1e+20": all valid JSON
            } else {
                out.append(contentsOf: "null".utf8)
            }
        case .string(let s): JSON.writeString(s, into: &out)
        case .array(let a):
            out.append(UInt8(ascii: "["))
            for (k, v) in a.enumerated() {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                v.write(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let o):
            out.append(UInt8(ascii: "{"))
            for (k, key) in o.keys.sorted().enumerated() {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                JSON.writeString(key, into: &out)
                out.append(UInt8(ascii: ":"))
                o[key]!.write(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    static func writeString(_ s: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        let hex = Array("0123456789abcdef".utf8)
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "\""): out.append(UInt8(ascii: "\\")); out.append(b)
            case UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\")); out.append(b)
            case 0x0A: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "n"))
            case 0x0D: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "r"))
            case 0x09: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "t"))
            case 0x08: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "b"))
            case 0x0C: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "f"))
            case 0..<0x20:
                out.append(contentsOf: "\\u00".utf8)
                out.append(hex[Int(b >> 4)]); out.append(hex[Int(b & 15)])
            default: out.append(b)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// Recursive-descent JSON parser over UTF-8 bytes (RFC 8259; nesting limited to 512).
private struct JSONParser {
    let b: UnsafeBufferPointer<UInt8>
    var i = 0
    init(_ b: UnsafeBufferPointer<UInt8>) { self.b = b }

    func error(_ what: String) -> OamError { OamError("invalid_request", "invalid JSON at byte \(i): \(what)") }

    mutating func skipSpace() {
        while i < b.count, b[i] == 0x20 || b[i] == 0x0A || b[i] == 0x0D || b[i] == 0x09 { i += 1 }
    }

    mutating func literal(_ word: StaticString, _ v: JSON) throws -> JSON {
        let n = word.utf8CodeUnitCount
        guard i + n <= b.count, memcmp(b.baseAddress! + i, word.utf8Start, n) == 0 else { throw error("bad literal") }
        i += n
        return v
    }

    mutating func value(depth: Int) throws -> JSON {
        guard depth < 512 else { throw error("nesting too deep") }
        guard i < b.count else { throw error("unexpected end") }
        switch b[i] {
        case UInt8(ascii: "{"):
            i += 1
            var o: [String: JSON] = [:]
            skipSpace()
            if i < b.count, b[i] == UInt8(ascii: "}") { i += 1; return .object(o) }
            while true {
                skipSpace()
                guard i < b.count, b[i] == UInt8(ascii: "\"") else { throw error("expected a key") }
                let k = try string()
                skipSpace()
                guard i < b.count, b[i] == UInt8(ascii: ":") else { throw error("expected ':'") }
                i += 1
                skipSpace()
                o[k] = try value(depth: depth + 1)
                skipSpace()
                guard i < b.count else { throw error("unexpected end") }
                if b[i] == UInt8(ascii: ",") { i += 1; continue }
                if b[i] == UInt8(ascii: "}") { i += 1; return .object(o) }
                throw error("expected ',' or '}'")
            }
        case UInt8(ascii: "["):
            i += 1
            var a: [JSON] = []
            skipSpace()
            if i < b.count, b[i] == UInt8(ascii: "]") { i += 1; return .array(a) }
            while true {
                skipSpace()
                a.append(try value(depth: depth + 1))
                skipSpace()
                guard i < b.count else { throw error("unexpected end") }
                if b[i] == UInt8(ascii: ",") { i += 1; continue }
                if b[i] == UInt8(ascii: "]") { i += 1; return .array(a) }
                throw error("expected ',' or ']'")
            }
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): return try literal("true", .bool(true))
        case UInt8(ascii: "f"): return try literal("false", .bool(false))
        case UInt8(ascii: "n"): return try literal("null", .null)
        default: return try number()
        }
    }

    mutating func number() throws -> JSON {
        let start = i
        var integral = true
        if i < b.count, b[i] == UInt8(ascii: "-") { i += 1 }
        let digits = i
        while i < b.count, b[i] >= 0x30 && b[i] <= 0x39 { i += 1 }
        guard i > digits else { throw error("unexpected character") }
        if b[digits] == 0x30 && i - digits > 1 { throw error("leading zero") }
        if i < b.count, b[i] == UInt8(ascii: ".") {
            integral = false
            i += 1
            let f = i
            while i < b.count, b[i] >= 0x30 && b[i] <= 0x39 { i += 1 }
            guard i > f else { throw error("bad fraction") }
        }
        if i < b.count, b[i] == UInt8(ascii: "e") || b[i] == UInt8(ascii: "E") {
            integral = false
            i += 1
            if i < b.count, b[i] == UInt8(ascii: "+") || b[i] == UInt8(ascii: "-") { i += 1 }
            let e = i
            while i < b.count, b[i] >= 0x30 && b[i] <= 0x39 { i += 1 }
            guard i > e else { throw error("bad exponent") }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: b[start..<i]), as: UTF8.self)
        if integral, let v = Int(text) { return .int(v) }
        guard let d = Double(text) else { throw error("bad number") }
        return .double(d)
    }

    mutating func hex4() throws -> UInt32 {
        guard i + 4 <= b.count else { throw error("bad \\u escape") }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = b[i]
            let d: UInt8
            switch c {
            case 0x30...0x39: d = c - 0x30
            case 0x41...0x46: d = c - 0x41 + 10
            case 0x61...0x66: d = c - 0x61 + 10
            default: throw error("bad \\u escape")
            }
            v = v << 4 | UInt32(d)
            i += 1
        }
        return v
    }

    /// At an opening quote; returns the decoded string.
    mutating func string() throws -> String {
        i += 1
        let start = i
        // Fast path: no escapes.
        while i < b.count {
            let c = b[i]
            if c == UInt8(ascii: "\"") {
                let s = String(decoding: UnsafeBufferPointer(rebasing: b[start..<i]), as: UTF8.self)
                i += 1
                return s
            }
            if c == UInt8(ascii: "\\") { break }
            if c < 0x20 { throw error("control character in string") }
            i += 1
        }
        var out = Array(UnsafeBufferPointer(rebasing: b[start..<i]))
        while i < b.count {
            let c = b[i]
            if c == UInt8(ascii: "\"") {
                i += 1
                return String(decoding: out, as: UTF8.self)
            }
            if c < 0x20 { throw error("control character in string") }
            if c != UInt8(ascii: "\\") { out.append(c); i += 1; continue }
            i += 1
            guard i < b.count else { break }
            let e = b[i]
            i += 1
            switch e {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "u"):
                var v = try hex4()
                if v >= 0xD800 && v < 0xDC00 {
                    // High surrogate: a low one must follow, else U+FFFD.
                    if i + 6 <= b.count, b[i] == UInt8(ascii: "\\"), b[i + 1] == UInt8(ascii: "u") {
                        let save = i
                        i += 2
                        let lo = try hex4()
                        if lo >= 0xDC00 && lo < 0xE000 { v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00) }
                        else { i = save; v = 0xFFFD }
                    } else {
                        v = 0xFFFD
                    }
                } else if v >= 0xDC00 && v < 0xE000 {
                    v = 0xFFFD
                }
                out.append(contentsOf: String(Character(Unicode.Scalar(v)!)).utf8)
            default: throw error("bad escape")
            }
        }
        throw error("unterminated string")
    }
}
