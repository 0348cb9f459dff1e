// swift-tools-version:6.0
import Foundation
import PackageDescription

// Swift 6 language mode (strict concurrency) for both targets. The deployment target is
// macOS 13: the FoundationModels backend is compiled only where the SDK has it
// (#if canImport(FoundationModels)) and instantiated only behind
// `if #available(macOS 26.0, *)`, so the library also loads on macOS 13-15 (scripted only).
let package = Package(
    name: "OamNative",
    platforms: [.macOS(.v13)],
    products: [
        .library(name: "OamNative", type: .dynamic, targets: ["OamNative"]),
    ],
    targets: [
        // C module: exposes include/oam_native.h (the ABI) to Swift.
        .target(name: "COamNative", path: "Sources/COamNative", publicHeadersPath: "include"),
        .target(name: "OamNative", dependencies: ["COamNative"], path: "Sources/OamNative",
                swiftSettings: [.swiftLanguageMode(.v6)]),
    ]
)

// Unit tests of the platform-independent Swift (swift test --package-path native), when present.
if FileManager.default.fileExists(atPath: Context.packageDirectory + "/Tests/OamNativeTests") {
    package.targets.append(.testTarget(name: "OamNativeTests", dependencies: ["OamNative"], path: "Tests/OamNativeTests",
                                       swiftSettings: [.swiftLanguageMode(.v6)]))
}
