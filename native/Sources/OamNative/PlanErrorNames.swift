import Foundation

/// Maps a FoundationModels error to a stable code by its case name, from its reflected
/// description. Used only as a fallback when the typed matches in AppleBackend.swift miss
/// (Apple forums 831404: errors did not match their types when SDK and OS differed, e.g. an
/// app built with the 26 SDK running on macOS 27 receives LanguageModelError it cannot name).
enum PlanErrorNames {
    /// (case name, stable code), most specific first.
    static let table: [(String, String)] = [
        ("exceededContextWindowSize", "context_size_exceeded"),
        ("contextSizeExceeded", "context_size_exceeded"),
        ("guardrailViolation", "guardrail_violation"),
        ("refusal", "refusal"),
        ("rateLimited", "rate_limited"),
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
        ("decodingFailure", "generation_failed"),
        ("timeout", "generation_failed"),
    ]

    /// The stable code for a reflected error description, or nil when no case name matches.
    static func code(forDescription text: String) -> String? {
        for (name, code) in table where text.contains(name) { return code }
        return nil
    }
}
