import Foundation
import COamNative
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// The exported C ABI. Declarations live in include/oam_native.h; keep them in sync.
// Handles are Unmanaged +1 references turned into opaque pointers.

public typealias CStrOut = UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>

private func dup(_ s: String) -> UnsafeMutablePointer<CChar>? { strdup(s) }

private func setErr(_ err: CStrOut?, _ e: OamError) {
    err?.pointee = dup(e.json.serialized())
}

private func asOam(_ error: Error) -> OamError {
    if let e = error as? OamError { return e }
    return OamError("invalid_request", "invalid JSON: \(error)")
}

private func engineBox(_ p: OpaquePointer) -> EngineBox {
    Unmanaged<EngineBox>.fromOpaque(UnsafeRawPointer(p)).takeUnretainedValue()
}

private func stepState(_ p: OpaquePointer) -> StepState {
    Unmanaged<StepState>.fromOpaque(UnsafeRawPointer(p)).takeUnretainedValue()
}

func makeBackend(_ config: JSON) throws -> Backend {
    let kind = config["backend"]?.string ?? "scripted"
    switch kind {
    case "scripted":
        return try ScriptedBackend(config: config)
    case "apple", "auto":
        // The library's deployment target is macOS 13: AppleBackend (macOS 26+) is only
        // ever named behind this runtime check, so the library loads on older systems.
        #if canImport(FoundationModels)
        if #available(macOS 26.0, iOS 26.0, *) {
            return try AppleBackend(config: config)
        }
        if kind == "auto" { return try ScriptedBackend(config: config) }
        throw OamError("model_unavailable", "FoundationModels needs macOS 26 or later")
        #else
        if kind == "auto" { return try ScriptedBackend(config: config) }
        throw OamError("model_unavailable", "FoundationModels is not available on this platform")
        #endif
    default:
        throw OamError("invalid_request", "unknown backend \(kind)")
    }
}

@_cdecl("oam_abi_version")
public func oam_abi_version() -> Int32 { 2 }

@_cdecl("oam_engine_create")
public func oam_engine_create(_ config: UnsafePointer<CChar>?, _ err: CStrOut?) -> OpaquePointer? {
    err?.pointee = nil
    do {
        let text = config.map { String(cString: $0) } ?? "{}"
        let cfg = try JSON.parse(text.isEmpty ? "{}" : text)
        guard cfg.object != nil else { throw OamError("invalid_request", "config must be a JSON object") }
        let box = EngineBox(backend: try makeBackend(cfg))
        return OpaquePointer(Unmanaged.passRetained(box).toOpaque())
    } catch {
        setErr(err, asOam(error))
        return nil
    }
}

@_cdecl("oam_engine_destroy")
public func oam_engine_destroy(_ engine: OpaquePointer?) {
    guard let engine else { return }
    Unmanaged<EngineBox>.fromOpaque(UnsafeRawPointer(engine)).release()
}

@_cdecl("oam_engine_info")
public func oam_engine_info(_ engine: OpaquePointer?) -> UnsafeMutablePointer<CChar>? {
    guard let engine else { return nil }
    return dup(engineBox(engine).backend.info().serialized())
}

@_cdecl("oam_count_tokens")
public func oam_count_tokens(_ engine: OpaquePointer?, _ json: UnsafePointer<CChar>?) -> Int32 {
    guard let engine, let json else { return -1 }
    guard let req = try? JSON.parse(String(cString: json)), req.object != nil,
          let n = try? engineBox(engine).backend.countTokens(req) else { return -1 }
    return Int32(clamping: n)
}

@_cdecl("oam_step_start")
public func oam_step_start(_ engine: OpaquePointer?, _ json: UnsafePointer<CChar>?, _ err: CStrOut?) -> OpaquePointer? {
    err?.pointee = nil
    guard let engine, let json else {
        setErr(err, OamError("invalid_request", "null engine or request")); return nil
    }
    do {
        let req = try JSON.parse(String(cString: json))
        guard req.object != nil else { throw OamError("invalid_request", "step request must be a JSON object") }
        let box = engineBox(engine)
        let step = StepState(engine: box)
        try box.backend.begin(req, step: step)
        return OpaquePointer(Unmanaged.passRetained(step).toOpaque())
    } catch {
        setErr(err, asOam(error))
        return nil
    }
}

@_cdecl("oam_step_pull")
public func oam_step_pull(_ step: OpaquePointer?, _ timeoutMs: Int32,
                          _ batch: UnsafeMutablePointer<UnsafePointer<oam_batch>?>?) -> Int32 {
    guard let step else { batch?.pointee = nil; return -1 }
    let (rc, b) = stepState(step).pull(timeoutMs: Int(timeoutMs))
    batch?.pointee = b
    return rc
}

@_cdecl("oam_step_cancel")
public func oam_step_cancel(_ step: OpaquePointer?) {
    guard let step else { return }
    stepState(step).cancel()
}

@_cdecl("oam_step_free")
public func oam_step_free(_ step: OpaquePointer?) {
    guard let step else { return }
    let u = Unmanaged<StepState>.fromOpaque(UnsafeRawPointer(step))
    u.takeUnretainedValue().cancel()
    u.release()
}

@_cdecl("oam_string_free")
public func oam_string_free(_ s: UnsafeMutablePointer<CChar>?) {
    free(s)
}
