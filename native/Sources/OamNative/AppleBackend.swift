// UNVERIFIED: FoundationModels is not available on Linux, so this file has never been
// compiled. It follows /work/shared/APPLE_API.md (macOS 26 API); expect fixes on a Mac.
#if canImport(FoundationModels)
import Foundation
import FoundationModels

@available(macOS 26.0, iOS 26.0, *)
final class AppleBackend: Backend, @unchecked Sendable {
    let name = "apple"
    private let model: SystemLanguageModel
    private let busy = NSLock()      // one request per engine at a time (heap-corruption reports)
    private var running = false

    init(config: JSON) throws {
        model = SystemLanguageModel.default
    }

    private var unavailableReason: String? {
        switch model.availability {
        case .available: return nil
        case .unavailable(let r): return "\(r)"
        }
    }

    func info() -> JSON {
        let reason = unavailableReason
        return .object([
            "name": .string("native"), "backend": .string(name), "available": .bool(reason == nil),
            "reason": reason.map { .string($0) } ?? .null, "contextSize": .int(model.contextSize),
            "features": .array([.string("tools"), .string("schema")]),
        ])
    }

    // tokenCount(for:) is async and 26.4+; fall back to the estimate. Unverified.
    func countTokens(_ request: JSON) throws -> Int { estimateRequestTokens(request) }

    func start(_ request: JSON, step: StepState) throws {
        if let r = unavailableReason { throw OamError("model_unavailable", r) }
        busy.lock()
        if running { busy.unlock(); throw OamError("busy", "a step is already running on this engine") }
        running = true
        busy.unlock()
        let task = Task.detached { [self] in
            defer { busy.lock(); running = false; busy.unlock() }
            do {
                let session = LanguageModelSession(model: model, tools: [],
                                                   instructions: request["instructions"]?.string ?? "")
                // Transcript replay / tool definitions (Transcript(entries:)) and toolCallingMode
                // (macOS 27 only) are not wired yet: the prompt is the last user message.
                let prompt = lastUserMessage(request)
                var opts = GenerationOptions()
                if let t = request["options"]?["temperature"]?.double { opts.temperature = t }
                if let m = request["options"]?["maxTokens"]?.int { opts.maximumResponseTokens = m }
                let text: String
                if let schema = request["schema"], schema != .null {
                    let gs = try GenerationSchema(root: try dynamicSchema(schema, name: "Answer"), dependencies: [])
                    let r = try await session.respond(to: prompt, schema: gs, includeSchemaInPrompt: true, options: opts)
                    text = r.content.jsonString
                } else {
                    text = try await session.respond(to: prompt, options: opts).content
                }
                step.push(.object(["type": .string("text"), "delta": .string(text)]))
                step.finish(.object([
                    "type": .string("done"), "finishReason": .string("stop"),
                    "usage": .object(["inputTokens": .int(estimateRequestTokens(request)),
                                      "outputTokens": .int(estimateTokens(text)), "cachedTokens": .int(0)]),
                ]))
            } catch {
                step.fail(AppleBackend.map(error))
            }
        }
        step.whenCancelled { task.cancel() }
    }

    static func map(_ error: Error) -> OamError {
        if error is CancellationError { return OamError("cancelled", "cancelled") }
        if let e = error as? OamError { return e }
        if let e = error as? LanguageModelSession.GenerationError {
            switch e {
            case .exceededContextWindowSize: return OamError("context_size_exceeded", "\(e)")
            case .assetsUnavailable: return OamError("model_unavailable", "\(e)")
            case .guardrailViolation: return OamError("guardrail_violation", "\(e)")
            case .unsupportedGuide: return OamError("invalid_schema", "\(e)")
            case .unsupportedLanguageOrLocale: return OamError("unsupported_language", "\(e)")
            case .decodingFailure: return OamError("generation_failed", "\(e)")
            case .rateLimited: return OamError("rate_limited", "\(e)")
            case .concurrentRequests: return OamError("busy", "\(e)")
            case .refusal: return OamError("refusal", "\(e)")
            @unknown default: return OamError("generation_failed", "\(e)")
            }
        }
        if error is LanguageModelSession.ToolCallError { return OamError("tool_failed", "\(error)") }
        if error is GenerationSchema.SchemaError { return OamError("invalid_schema", "\(error)") }
        return OamError("generation_failed", "\(error)")
    }
}

/// JSON Schema subset -> DynamicGenerationSchema (object/array/string/enum/number/integer/boolean).
@available(macOS 26.0, iOS 26.0, *)
func dynamicSchema(_ s: JSON, name: String) throws -> DynamicGenerationSchema {
    if let choices = s["enum"]?.array?.compactMap({ $0.string }) {
        return DynamicGenerationSchema(name: name, anyOf: choices)
    }
    switch s["type"]?.string ?? "object" {
    case "object":
        let required = Set((s["required"]?.array ?? []).compactMap { $0.string })
        let props = try (s["properties"]?.object ?? [:]).sorted { $0.key < $1.key }.map { key, sub in
            DynamicGenerationSchema.Property(name: key, description: sub["description"]?.string,
                                             schema: try dynamicSchema(sub, name: name + "_" + key),
                                             isOptional: !required.contains(key))
        }
        return DynamicGenerationSchema(name: name, description: s["description"]?.string, properties: props)
    case "array":
        return DynamicGenerationSchema(arrayOf: try dynamicSchema(s["items"] ?? .object([:]), name: name + "_item"))
    case "string": return DynamicGenerationSchema(type: String.self)
    case "integer": return DynamicGenerationSchema(type: Int.self)
    case "number": return DynamicGenerationSchema(type: Double.self)
    case "boolean": return DynamicGenerationSchema(type: Bool.self)
    default: throw OamError("invalid_schema", "unsupported JSON Schema type")
    }
}
#endif
