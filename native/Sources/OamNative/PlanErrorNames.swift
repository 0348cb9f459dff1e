import Foundation

/// Maps a FoundationModels error to a stable code without naming its type: the fallback when
/// the typed matches in AppleBackend.swift miss. They miss when SDK and OS differ (Apple
/// forums 831404), and for an app built with the 27 SDK whose errors arrive as
/// `LanguageModelError`, `SystemLanguageModel.Error` or `LanguageModelSession.Error` where
/// the code was compiled for `GenerationError` only.
///
/// Order: the framework's `ModelManagerError` codes anywhere in the NSError underlying-error
/// chain (`modelManagerCode`), then the enum case label (`Mirror`: every FoundationModels
/// error case carries a payload, so the label is the case name, whatever the type's
/// `description` says), then the type name, then a case name found in the reflected text.
enum PlanErrorNames {
    /// (case name, stable code), most specific first.
    static let table: [(String, String)] = [
        ("exceededContextWindowSize", "context_size_exceeded"),
        ("contextSizeExceeded", "context_size_exceeded"),
        ("guardrailViolation", "guardrail_violation"),
        ("refusal", "refusal"),
        ("rateLimited", "rate_limited"),
        ("quotaLimitReached", "rate_limited"),
        ("concurrentRequests", "busy"),
        ("transcriptMutationWhileResponding", "busy"),
        ("unsupportedLanguageOrLocale", "unsupported_language"),
        ("unsupportedGenerationGuide", "invalid_schema"),
        ("unsupportedGuide", "invalid_schema"),
        ("undefinedReferences", "invalid_schema"),
        ("duplicateProperty", "invalid_schema"),
        ("duplicateType", "invalid_schema"),
        ("emptyTypeChoices", "invalid_schema"),
        ("unsupportedTranscriptContent", "invalid_request"),
        ("unsupportedCapability", "invalid_request"),
        ("assetsUnavailable", "model_unavailable"),
        ("serviceUnavailable", "model_unavailable"),
        ("networkFailure", "model_unavailable"),
        ("decodingFailure", "generation_failed"),
        ("timeout", "generation_failed"),
    ]

    /// Error types (as `String(reflecting:)` ends) whose every case means one code. The
    /// 27 SDK's `LanguageModelSession.Error` has only busy cases (`concurrentRequests`,
    /// `transcriptMutationWhileResponding`); `SystemLanguageModel.Error` only `assetsUnavailable`.
    static let types: [(String, String)] = [
        ("LanguageModelSession.Error", "busy"),
        ("SystemLanguageModel.Error", "model_unavailable"),
    ]

    /// `ModelManagerError` codes seen wrapped as underlying errors of an NSError.
    /// UNVERIFIED(11): the meanings are guesses. docs/design-notes.md ("Context, latency, usage") records 1012 under load; other
    /// projects report 1013, 1026, 1041, 1042 and 1046 without saying what they mean. A code
    /// not listed maps to `generation_failed`, its domain and code kept in the message.
    static let modelManagerCodes: [Int: String] = [
        1012: "rate_limited",
        1013: "busy",
        1026: "model_unavailable",
        1041: "rate_limited",
        1042: "rate_limited",
        1046: "model_unavailable",
    ]

    /// How deep `modelManagerError` follows underlying errors (chains are short; a cycle
    /// must not loop forever).
    static let maxChainDepth = 8

    /// The stable code for a reflected error description, or nil when no case name matches.
    static func code(forDescription text: String) -> String? {
        for (name, code) in table where text.contains(name) { return code }
        return nil
    }

    /// The enum case label of `error` (nil for a case without payload or a non-enum).
    static func caseLabel(_ error: Error) -> String? {
        let m = Mirror(reflecting: error)
        guard m.displayStyle == .enum else { return nil }
        return m.children.first?.label
    }

    /// The first NSError in `error`'s underlying-error chain (itself included;
    /// `NSUnderlyingErrorKey`, then each of `NSMultipleUnderlyingErrorsKey`, depth first)
    /// whose domain names `ModelManagerError`, with its domain and code.
    static func modelManagerError(_ error: Error) -> (domain: String, code: Int)? {
        func walk(_ e: NSError, _ depth: Int) -> (String, Int)? {
            if e.domain.contains("ModelManager") { return (e.domain, e.code) }
            guard depth < maxChainDepth else { return nil }
            var next: [NSError] = []
            if let u = e.userInfo[NSUnderlyingErrorKey] as? NSError { next.append(u) }
            if let us = e.userInfo["NSMultipleUnderlyingErrorsKey"] as? [NSError] { next += us }
            for u in next { if let hit = walk(u, depth + 1) { return hit } }
            return nil
        }
        return walk(error as NSError, 0).map { (domain: $0.0, code: $0.1) }
    }

    /// (stable code, message) for an error the typed matches did not name.
    static func map(_ error: Error) -> (code: String, message: String) {
        if let (domain, n) = modelManagerError(error) {
            let code = modelManagerCodes[n] ?? "generation_failed"
            return (code, "\(domain) \(n) (meaning unverified): \(error.localizedDescription)")
        }
        let typeName = String(reflecting: type(of: error))
        if let label = caseLabel(error), let hit = table.first(where: { $0.0 == label }) {
            return (hit.1, "\(typeName).\(label): \(error.localizedDescription)")
        }
        if let hit = types.first(where: { typeName.hasSuffix($0.0) }) {
            return (hit.1, "\(typeName): \(error.localizedDescription)")
        }
        let text = String(reflecting: error)
        return (code(forDescription: text) ?? "generation_failed", text)
    }
}
