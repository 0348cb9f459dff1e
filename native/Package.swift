// swift-tools-version:5.9
import PackageDescription

let package = Package(
    name: "OamNative",
    platforms: [.macOS("26.0")],
    products: [
        .library(name: "OamNative", type: .dynamic, targets: ["OamNative"]),
    ],
    targets: [
        // C module: exposes include/oam_native.h (the ABI) to Swift.
        .target(name: "COamNative", path: "Sources/COamNative", publicHeadersPath: "include"),
        .target(name: "OamNative", dependencies: ["COamNative"], path: "Sources/OamNative"),
    ]
)
