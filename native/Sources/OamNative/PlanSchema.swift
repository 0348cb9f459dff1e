import Foundation

// Platform-independent JSON Schema -> neutral schema tree, which AppleBackend.swift maps 1:1
// onto DynamicGenerationSchema / GenerationSchema(root:dependencies:). Everything the on-device
// model cannot enforce (pattern, format, minLength, ...) is written into the nearest
// description AND reported as a warning; nothing is dropped silently.
//
// Property order: the library's `JSON` type stores objects as [String: JSON], so the order
// of "properties" in the host's JSON text is lost before it reaches this code. The order used
// is: an explicit order list ("x-order", "propertyOrdering" or "propertyOrder" array) when
// present, then the order of the "required" array, then the remaining keys alphabetically.
// The Python host (bridge/engines/native.py) adds "x-order" to every object schema it sends,
// so the order of the game's schema is the order the model generates in.

indirect enum PlanSchemaNode: Sendable, Equatable {
    /// DynamicGenerationSchema(name:description:properties:)
    case object(name: String, description: String?, properties: [PlanSchemaProperty])
    /// DynamicGenerationSchema(name:description:anyOf: [String])
    case choices(name: String, description: String?, values: [String])
    /// DynamicGenerationSchema(name:description:anyOf: [DynamicGenerationSchema])
    case union(name: String, description: String?, members: [PlanSchemaNode])
    /// DynamicGenerationSchema(arrayOf:minimumElements:maximumElements:)
    case array(items: PlanSchemaNode, minItems: Int?, maxItems: Int?)
    /// DynamicGenerationSchema(type: String.self)
    case string
    /// DynamicGenerationSchema(type: Int.self, guides: [.minimum/.maximum/.range])
    case integer(minimum: Int?, maximum: Int?)
    /// DynamicGenerationSchema(type: Double.self, guides: [.minimum/.maximum/.range])
    case number(minimum: Double?, maximum: Double?)
    /// DynamicGenerationSchema(type: Bool.self)
    case boolean
    /// DynamicGenerationSchema(referenceTo:) — resolved against `dependencies` by name.
    case reference(String)
}

struct PlanSchemaProperty: Sendable, Equatable {
    let name: String
    let description: String?
    let node: PlanSchemaNode
    let isOptional: Bool
}

struct PlanSchema: Sendable, Equatable {
    let root: PlanSchemaNode
    /// Named nodes referenced from `root` (from $defs / definitions).
    let dependencies: [PlanSchemaNode]
    /// Description of the root when the root itself cannot carry one (e.g. a bare string).
    let rootDescription: String?
    let warnings: [String]

    /// Bound of integer guides (minimum, maximum, exclusive*): beyond it a schema is refused
    /// with invalid_schema (bridge/engines/native.py checks the same before the call).
    static let maxIntegerBound = 9.0e15
    /// Bound of minItems / maxItems.
    static let maxElementCount = Int(Int32.max)

    /// Converts a JSON Schema. `rootName` names the root type (e.g. "Answer" or a tool name).
    /// Throws `OamError("invalid_schema", …)` for schemas that cannot be represented.
    static func convert(_ schema: JSON, rootName: String = "Answer") throws -> PlanSchema {
        let c = PlanSchemaConverter(rootSchema: schema)
        return try c.run(rootName: rootName)
    }
}

extension PlanSchemaNode {
    var typeName: String? {
        switch self {
        case .object(let n, _, _), .choices(let n, _, _), .union(let n, _, _): return n
        default: return nil
        }
    }
    var ownDescription: String? {
        switch self {
        case .object(_, let d, _), .choices(_, let d, _), .union(_, let d, _): return d
        default: return nil
        }
    }
}

private final class PlanSchemaConverter {
    let rootSchema: JSON
    var warnings: [String] = []
    var usedNames = Set<String>()
    var defs: [String: JSON] = [:]
    var defNames: [String: String] = [:]        // def key -> type name
    var emittedDefs: [String: PlanSchemaNode] = [:]
    var defOrder: [String] = []
    var inProgress = Set<String>()               // defs being converted (recursion)
    var rootTypeName = "Answer"

    init(rootSchema: JSON) { self.rootSchema = rootSchema }

    func warn(_ path: String, _ text: String) { warnings.append("\(path): \(text)") }

    static func sanitize(_ s: String) -> String {
        let mapped = s.unicodeScalars.map { CharacterSet.alphanumerics.contains($0) || $0 == "_" ? Character($0) : "_" }
        let out = String(mapped)
        return out.isEmpty ? "Type" : out
    }

    func uniqueName(_ base: String) -> String {
        let b = PlanSchemaConverter.sanitize(base)
        var name = b
        var n = 2
        while usedNames.contains(name) { name = "\(b)_\(n)"; n += 1 }
        usedNames.insert(name)
        return name
    }

    func run(rootName: String) throws -> PlanSchema {
        guard rootSchema.object != nil || rootSchema.bool != nil else {
            throw OamError("invalid_schema", "a JSON Schema must be an object")
        }
        for key in ["$defs", "definitions"] {
            if let d = rootSchema[key] {
                guard let o = d.object else { throw OamError("invalid_schema", "\(key) must be an object") }
                for (k, v) in o.sorted(by: { $0.key < $1.key }) {
                    guard defs[k] == nil else { throw OamError("invalid_schema", "definition \(k) appears twice") }
                    defs[k] = v
                }
            }
        }
        let title = rootSchema["title"]?.string
        rootTypeName = uniqueName(title ?? rootName)
        for k in defs.keys.sorted() { defNames[k] = uniqueName(k) }

        let (node, desc) = try convert(rootSchema, path: "$", nameHint: rootTypeName, fixedName: rootTypeName)
        let deps = defOrder.compactMap { emittedDefs[$0] }
        let rootDesc = node.typeName == nil ? desc : nil
        return PlanSchema(root: node, dependencies: deps, rootDescription: rootDesc, warnings: warnings)
    }

    // MARK: conversion

    /// Returns the node and the description to put on the enclosing property (own
    /// description plus notes about constraints that are not enforced).
    func convert(_ s: JSON, path: String, nameHint: String, fixedName: String? = nil) throws -> (PlanSchemaNode, String?) {
        if case .bool(let b) = s {
            guard b else { throw OamError("invalid_schema", "\(path): schema `false` matches nothing") }
            warn(path, "schema allows any value; generated as a string")
            return (.string, "any value, written as text")
        }
        guard let obj = s.object else { throw OamError("invalid_schema", "\(path): schema must be an object") }
        var notes: [String] = []
        let description = obj["description"]?.string

        func finish(_ node: PlanSchemaNode) -> (PlanSchemaNode, String?) {
            for key in ["default", "examples"] {
                if let v = obj[key] { notes.append("\(key): \(v.serialized())") }
            }
            let text = ([description].compactMap { $0 } + notes).joined(separator: "; ")
            let d: String? = text.isEmpty ? nil : text
            switch node {
            case .object(let n, _, let p): return (.object(name: n, description: d, properties: p), d)
            case .choices(let n, _, let v): return (.choices(name: n, description: d, values: v), d)
            case .union(let n, _, let m): return (.union(name: n, description: d, members: m), d)
            default: return (node, d)
            }
        }
        for key in ["not", "if", "then", "else", "dependentSchemas", "unevaluatedProperties"] where obj[key] != nil {
            warn(path, "\(key) is not enforced")
            notes.append("\(key): \(obj[key]!.serialized())")
        }

        // $ref
        if let ref = obj["$ref"] {
            guard let r = ref.string else { throw OamError("invalid_schema", "\(path): $ref must be a string") }
            let node = try reference(r, path: path)
            return finish(node)
        }

        // allOf
        if let all = obj["allOf"] {
            guard let arr = all.array, !arr.isEmpty else { throw OamError("invalid_schema", "\(path): allOf must be a non-empty array") }
            var merged = obj
            merged["allOf"] = nil
            if arr.count == 1, let only = arr[0].object {
                for (k, v) in only where merged[k] == nil || k == "properties" || k == "required" {
                    if k == "properties", let a = merged[k]?.object, let b = v.object {
                        merged[k] = .object(a.merging(b) { x, _ in x })
                    } else if k == "required", let a = merged[k]?.array, let b = v.array {
                        merged[k] = .array(a + b)
                    } else { merged[k] = v }
                }
            } else {
                warn(path, "allOf with several members: object members are merged, other constraints ignored")
                notes.append("must satisfy all of: \(all.serialized())")
                var props: [String: JSON] = merged["properties"]?.object ?? [:]
                var req: [JSON] = merged["required"]?.array ?? []
                for m in arr {
                    let mo = m["$ref"]?.string.flatMap { resolveDef($0) } ?? m
                    for (k, v) in mo["properties"]?.object ?? [:] where props[k] == nil { props[k] = v }
                    req += mo["required"]?.array ?? []
                }
                merged["properties"] = .object(props)
                merged["required"] = .array(req)
                if merged["type"] == nil { merged["type"] = .string("object") }
            }
            let (node, d) = try convert(.object(merged), path: path, nameHint: nameHint, fixedName: fixedName)
            return (node, ([d].compactMap { $0 } + notes).isEmpty ? nil : ([d].compactMap { $0 } + notes).joined(separator: "; "))
        }

        // const
        if let c = obj["const"] {
            let v: String
            if let s = c.string { v = s } else {
                v = c.serialized()
                warn(path, "non-string const \(v) generated as the string \"\(v)\"")
            }
            return finish(.choices(name: fixedName ?? uniqueName(nameHint), description: nil, values: [v]))
        }

        // enum
        if let e = obj["enum"] {
            guard let arr = e.array, !arr.isEmpty else { throw OamError("invalid_schema", "\(path): enum must be a non-empty array") }
            var values: [String] = []
            var nonString = false
            for v in arr {
                if v == .null { notes.append("may be null"); continue }
                if let s = v.string { values.append(s) } else { values.append(v.serialized()); nonString = true }
            }
            if nonString { warn(path, "non-string enum values are generated as strings") }
            guard !values.isEmpty else { throw OamError("invalid_schema", "\(path): enum has no non-null values") }
            return finish(.choices(name: fixedName ?? uniqueName(nameHint), description: nil, values: values))
        }

        // anyOf / oneOf
        for key in ["anyOf", "oneOf"] {
            guard let any = obj[key] else { continue }
            guard let arr = any.array, !arr.isEmpty else { throw OamError("invalid_schema", "\(path): \(key) must be a non-empty array") }
            if key == "oneOf" { notes.append("exactly one of the alternatives") }
            let members = arr.filter { $0["type"]?.string != "null" }
            if members.count < arr.count { notes.append("may be null") }
            guard !members.isEmpty else { throw OamError("invalid_schema", "\(path): \(key) has only null alternatives") }
            // All string literals -> one choice list.
            let literals = members.map { m -> [String]? in
                if let c = m["const"]?.string { return [c] }
                if let e = m["enum"]?.array { let s = e.compactMap { $0.string }; return s.count == e.count ? s : nil }
                return nil
            }
            if literals.allSatisfy({ $0 != nil }) {
                var seen = Set<String>()
                let values = literals.flatMap { $0! }.filter { seen.insert($0).inserted }
                return finish(.choices(name: fixedName ?? uniqueName(nameHint), description: nil, values: values))
            }
            if members.count == 1 {
                let (node, d) = try convert(members[0], path: "\(path).\(key)[0]", nameHint: nameHint, fixedName: fixedName)
                if let d { notes.insert(d, at: 0) }
                return finish(node)
            }
            let name = fixedName ?? uniqueName(nameHint)
            var nodes: [PlanSchemaNode] = []
            for (i, m) in members.enumerated() {
                let (n, d) = try convert(m, path: "\(path).\(key)[\(i)]", nameHint: "\(name)_\(i + 1)")
                if n.typeName == nil, let d { notes.append("alternative \(i + 1): \(d)") }
                nodes.append(n)
            }
            return finish(.union(name: name, description: nil, members: nodes))
        }

        // type
        var type: String?
        switch obj["type"] {
        case nil: type = obj["properties"] != nil ? "object" : (obj["items"] != nil ? "array" : nil)
        case .some(.string(let t)): type = t
        case .some(.array(let ts)):
            let names = ts.compactMap { $0.string }
            let nonNull = names.filter { $0 != "null" }
            if nonNull.count < names.count { notes.append("may be null") }
            if nonNull.count == 1 {
                type = nonNull[0]
            } else if nonNull.isEmpty {
                throw OamError("invalid_schema", "\(path): type null cannot be generated")
            } else {
                let name = fixedName ?? uniqueName(nameHint)
                var nodes: [PlanSchemaNode] = []
                for t in nonNull {
                    var sub = obj
                    sub["type"] = .string(t)
                    sub["description"] = nil
                    let (n, d) = try convert(.object(sub), path: "\(path)<\(t)>", nameHint: "\(name)_\(t)")
                    if n.typeName == nil, let d { notes.append("as \(t): \(d)") }
                    nodes.append(n)
                }
                return finish(.union(name: name, description: nil, members: nodes))
            }
        default: throw OamError("invalid_schema", "\(path): type must be a string or an array")
        }

        func unsupported(_ keys: [String]) {
            for k in keys {
                guard let v = obj[k] else { continue }
                warn(path, "\(k) is not enforced by the on-device model")
                notes.append("\(k): \(v.string ?? v.serialized())")
            }
        }

        switch type {
        case "object":
            let name = fixedName ?? uniqueName(nameHint)
            let propsObj: [String: JSON]
            switch obj["properties"] {
            case nil: propsObj = [:]
            case .some(.object(let p)): propsObj = p
            default: throw OamError("invalid_schema", "\(path): properties must be an object")
            }
            if propsObj.isEmpty, let ap = obj["additionalProperties"], ap != .bool(false) {
                warn(path, "free-form objects (additionalProperties without properties) cannot be generated; an empty object is generated")
                notes.append("additionalProperties: \(ap.serialized())")
            } else if let ap = obj["additionalProperties"], ap != .bool(false) {
                warn(path, "additionalProperties is not enforced; only the listed properties are generated")
            }
            unsupported(["patternProperties", "minProperties", "maxProperties", "propertyNames", "dependentRequired"])
            let required: [String] = try {
                guard let r = obj["required"] else { return [] }
                guard let a = r.array else { throw OamError("invalid_schema", "\(path): required must be an array") }
                return a.compactMap { $0.string }
            }()
            for r in required where propsObj[r] == nil { warn(path, "required property \(r) is not defined") }
            let requiredSet = Set(required)
            var props: [PlanSchemaProperty] = []
            for key in orderedKeys(propsObj, obj, required: required) {
                let sub = propsObj[key]!
                let (node, d) = try convert(sub, path: "\(path).\(key)", nameHint: "\(name)_\(key)")
                let nullable = PlanSchemaConverter.isNullable(sub)
                props.append(PlanSchemaProperty(name: key, description: d, node: node,
                                                isOptional: !requiredSet.contains(key) || nullable))
            }
            return finish(.object(name: name, description: nil, properties: props))
        case "array":
            unsupported(["uniqueItems", "contains", "minContains", "maxContains", "prefixItems", "unevaluatedItems"])
            let itemSchema: JSON
            if let it = obj["items"] {
                if it.array != nil { throw OamError("invalid_schema", "\(path): tuple-form items is not supported") }
                itemSchema = it
            } else {
                warn(path, "array without items: items generated as strings")
                itemSchema = .object(["type": .string("string")])
            }
            let (item, d) = try convert(itemSchema, path: "\(path)[]", nameHint: "\(nameHint)_item")
            if item.typeName == nil, let d { notes.append("each item: \(d)") }
            let minI = try nonNegativeInt(obj["minItems"], "minItems", path)
            let maxI = try nonNegativeInt(obj["maxItems"], "maxItems", path)
            if let a = minI, let b = maxI, a > b { throw OamError("invalid_schema", "\(path): minItems > maxItems") }
            return finish(.array(items: item, minItems: minI, maxItems: maxI))
        case "string":
            unsupported(["pattern", "format", "minLength", "maxLength", "contentEncoding", "contentMediaType"])
            return finish(.string)
        case "integer":
            unsupported(["multipleOf"])
            var lo = try intBound(obj["minimum"], "minimum", path)
            var hi = try intBound(obj["maximum"], "maximum", path)
            if let x = try exclusive(obj["exclusiveMinimum"], "exclusiveMinimum", path) {
                let v = try Self.integerBound((x + 1).rounded(.down), "exclusiveMinimum", path); lo = max(lo ?? v, v)
            }
            if let x = try exclusive(obj["exclusiveMaximum"], "exclusiveMaximum", path) {
                let v = try Self.integerBound((x - 1).rounded(.up), "exclusiveMaximum", path); hi = min(hi ?? v, v)
            }
            if let a = lo, let b = hi, a > b { throw OamError("invalid_schema", "\(path): minimum > maximum") }
            return finish(.integer(minimum: lo, maximum: hi))
        case "number":
            unsupported(["multipleOf"])
            var lo = obj["minimum"]?.double
            var hi = obj["maximum"]?.double
            // A bound that overflowed to infinity (1e999 in the JSON) is no bound a guide can hold.
            for (key, v) in [("minimum", lo), ("maximum", hi), ("exclusiveMinimum", obj["exclusiveMinimum"]?.double),
                             ("exclusiveMaximum", obj["exclusiveMaximum"]?.double)] {
                if let v, !v.isFinite { throw OamError("invalid_schema", "\(path): \(key) must be a finite number") }
            }
            if let x = try exclusive(obj["exclusiveMinimum"], "exclusiveMinimum", path) {
                warn(path, "exclusiveMinimum \(x) is enforced as an inclusive minimum")
                notes.append("greater than \(JSON.double(x).serialized())"); lo = max(lo ?? x, x)
            }
            if let x = try exclusive(obj["exclusiveMaximum"], "exclusiveMaximum", path) {
                warn(path, "exclusiveMaximum \(x) is enforced as an inclusive maximum")
                notes.append("less than \(JSON.double(x).serialized())"); hi = min(hi ?? x, x)
            }
            if let a = lo, let b = hi, a > b { throw OamError("invalid_schema", "\(path): minimum > maximum") }
            return finish(.number(minimum: lo, maximum: hi))
        case "boolean":
            return finish(.boolean)
        case "null":
            throw OamError("invalid_schema", "\(path): type null cannot be generated")
        case nil:
            warn(path, "schema without a type allows any value; generated as a string")
            notes.append("any value, written as text")
            return finish(.string)
        default:
            throw OamError("invalid_schema", "\(path): unknown type \(type!)")
        }
    }

    static func isNullable(_ s: JSON) -> Bool {
        if let ts = s["type"]?.array, ts.contains(.string("null")) { return true }
        if let e = s["enum"]?.array, e.contains(.null) { return true }
        for k in ["anyOf", "oneOf"] {
            if let a = s[k]?.array, a.contains(where: { $0["type"]?.string == "null" }) { return true }
        }
        return false
    }

    func orderedKeys(_ props: [String: JSON], _ obj: [String: JSON], required: [String]) -> [String] {
        var out: [String] = []
        var seen = Set<String>()
        for key in ["x-order", "propertyOrdering", "propertyOrder"] {
            for k in obj[key]?.array?.compactMap({ $0.string }) ?? [] where props[k] != nil && seen.insert(k).inserted {
                out.append(k)
            }
        }
        for k in required where props[k] != nil && seen.insert(k).inserted { out.append(k) }
        for k in props.keys.sorted() where seen.insert(k).inserted { out.append(k) }
        return out
    }

    func nonNegativeInt(_ v: JSON?, _ key: String, _ path: String) throws -> Int? {
        guard let v, v != .null else { return nil }
        guard let d = v.double, d >= 0, d == d.rounded() else {
            throw OamError("invalid_schema", "\(path): \(key) must be a non-negative integer")
        }
        guard d <= Double(PlanSchema.maxElementCount) else {
            throw OamError("invalid_schema", "\(path): \(key) is out of range (at most \(PlanSchema.maxElementCount))")
        }
        return Int(d)
    }

    func intBound(_ v: JSON?, _ key: String, _ path: String) throws -> Int? {
        guard let v, v != .null else { return nil }
        guard let d = v.double else { throw OamError("invalid_schema", "\(path): \(key) must be a number") }
        return try Self.integerBound(key == "minimum" ? d.rounded(.up) : d.rounded(.down), key, path)
    }

    /// `d` (already whole) as an Int, or invalid_schema when it is not finite or beyond
    /// ±`maxIntegerBound`: `Int(_: Double)` traps on such values and would take the host down.
    static func integerBound(_ d: Double, _ key: String, _ path: String) throws -> Int {
        guard d.isFinite, abs(d) <= PlanSchema.maxIntegerBound else {
            throw OamError("invalid_schema", "\(path): \(key) is out of range (integers are bounded by ±\(Int(PlanSchema.maxIntegerBound)))")
        }
        return Int(d)
    }

    func exclusive(_ v: JSON?, _ key: String, _ path: String) throws -> Double? {
        guard let v, v != .null else { return nil }
        if v.bool != nil {
            warn(path, "draft-4 boolean \(key) is ignored")
            return nil
        }
        guard let d = v.double else { throw OamError("invalid_schema", "\(path): \(key) must be a number") }
        return d
    }

    // MARK: references

    func defKey(_ ref: String) -> String? {
        for prefix in ["#/$defs/", "#/definitions/"] where ref.hasPrefix(prefix) {
            let k = String(ref.dropFirst(prefix.count))
            return k.replacingOccurrences(of: "~1", with: "/").replacingOccurrences(of: "~0", with: "~")
        }
        return nil
    }

    func resolveDef(_ ref: String) -> JSON? { defKey(ref).flatMap { defs[$0] } }

    func reference(_ ref: String, path: String) throws -> PlanSchemaNode {
        if ref == "#" { return .reference(rootTypeName) }
        guard let key = defKey(ref) else {
            throw OamError("invalid_schema", "\(path): only local references (#, #/$defs/…, #/definitions/…) are supported, got \(ref)")
        }
        guard let def = defs[key], let name = defNames[key] else {
            throw OamError("invalid_schema", "\(path): undefined reference \(ref)")
        }
        if emittedDefs[key] != nil || inProgress.contains(key) {
            if let done = emittedDefs[key], done.typeName == nil { return done }   // inlined primitive
            return .reference(name)
        }
        inProgress.insert(key)
        defer { inProgress.remove(key) }
        let (node, _) = try convert(def, path: "#/$defs/\(key)", nameHint: name, fixedName: name)
        if node.typeName == nil {
            // Primitives and arrays have no name in DynamicGenerationSchema: inline them.
            if containsReference(node, to: name) {
                throw OamError("invalid_schema", "\(path): recursive reference \(ref) through a non-object type")
            }
            emittedDefs[key] = node
            return node
        }
        emittedDefs[key] = node
        defOrder.append(key)
        return .reference(name)
    }

    func containsReference(_ node: PlanSchemaNode, to name: String) -> Bool {
        switch node {
        case .reference(let n): return n == name
        case .array(let items, _, _): return containsReference(items, to: name)
        case .object(_, _, let props): return props.contains { containsReference($0.node, to: name) }
        case .union(_, _, let m): return m.contains { containsReference($0, to: name) }
        default: return false
        }
    }
}
