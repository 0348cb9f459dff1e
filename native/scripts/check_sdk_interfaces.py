#!/usr/bin/env python3
"""Compile the Apple backend against FoundationModels built from Apple's SDK interfaces.

Usage: python3 native/scripts/check_sdk_interfaces.py DIR [--swift-frontend PATH] [--swiftc PATH]

DIR holds FoundationModels-<version>-macos.swiftinterface files (the macOS 26.5 and 27.0 SDK
interfaces published in hbmartin/Foundation-Models-and-Core-AI-and-MLX-skills, folder
notes/sdk-interfaces/; when DIR also holds that folder's capture-manifest.json, each file's
sha256 is checked against it). Apple's files are never copied into this repository: the
patched copies and the built modules live in a temporary directory.

For each interface: patch it so a Linux toolchain can build it (drop the -target,
-target-variant, -enable-objc-interop and -library-level module flags; `@objc deinit` ->
`deinit`; remove the CoreGraphics, CoreImage, CoreVideo and ImageIO imports and the
declarations that name those modules, the 27 SDK's image attachments), build a real
.swiftmodule with library evolution, report its -user-module-version and which branch
`#if canImport(FoundationModels, _version: 2.0)` takes, then type-check
native/Sources/OamNative/*.swift against it (Swift 6 language mode). Prints one summary line
per interface and exits 1 when any build or type check has errors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parents[1]
SOURCES = NATIVE / "Sources" / "OamNative"
HEADER = NATIVE / "include" / "oam_native.h"
DROPPED_MODULES = ("CoreGraphics", "CoreImage", "CoreVideo", "ImageIO")
# Qualified names that only occur in the dropped declarations (Darwin::OSType and
# CoreFoundation::CGSize appear in the same image-attachment API).
DROPPED_QUALIFIERS = tuple(f"{m}::" for m in DROPPED_MODULES) + ("Darwin::", "CoreFoundation::")
PROBE = """\
import FoundationModels
#if canImport(FoundationModels, _version: 2.0)
#warning("OAM_PROBE: canImport(FoundationModels, _version: 2.0) is true")
#else
#warning("OAM_PROBE: canImport(FoundationModels, _version: 2.0) is false")
#endif
"""


def patch(text: str) -> tuple[str, int]:
    """(patched interface, number of declarations dropped)."""
    out: list[str] = []
    depth = 0
    dropped = 0
    for line in text.splitlines():
        if depth:
            depth += line.count("{") - line.count("}")
            continue
        if line.startswith("// swift-module-flags:"):
            line = re.sub(r" -target(-variant)? \S+", "", line).replace(" -enable-objc-interop", "")
            line = re.sub(r" -library-level \S+", "", line)
        if re.match(rf"\s*(public |@_exported |internal )?import ({'|'.join(DROPPED_MODULES)})\b", line):
            continue
        if any(q in line for q in DROPPED_QUALIFIERS):
            dropped += 1
            depth = max(0, line.count("{") - line.count("}"))
            continue
        out.append(line.replace("@objc deinit", "deinit"))
    return "\n".join(out) + "\n", dropped


def run(cmd: list[str], cwd: Path) -> tuple[int, str]:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def diagnostics(output: str, kind: str) -> list[str]:
    """Distinct `file:line:col: kind: message` lines."""
    seen: list[str] = []
    for line in output.splitlines():
        if re.match(rf"^\S+:\d+:\d+: {kind}: ", line) and line not in seen:
            seen.append(line)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--swift-frontend", default=shutil.which("swift-frontend") or "swift-frontend")
    ap.add_argument("--swiftc", default=shutil.which("swiftc") or "swiftc")
    args = ap.parse_args()
    interfaces = sorted(args.dir.glob("FoundationModels-*-macos.swiftinterface"))
    if not interfaces:
        print(f"no FoundationModels-*-macos.swiftinterface in {args.dir}", file=sys.stderr)
        return 2
    manifest_hashes: dict[str, str] = {}
    manifest = args.dir / "capture-manifest.json"
    if manifest.exists():
        for capture in json.loads(manifest.read_text()).get("captures", []):
            for f in capture.get("files", []):
                manifest_hashes[f["path"]] = f["sha256"]
    sources = sorted(str(p) for p in SOURCES.glob("*.swift"))
    failed = False
    with tempfile.TemporaryDirectory(prefix="oam-sdk-check-") as tmp:
        work = Path(tmp)
        cmod = work / "cmod"
        cmod.mkdir()
        (cmod / "module.modulemap").write_text(f'module COamNative {{\n  header "{HEADER}"\n  export *\n}}\n')
        for iface in interfaces:
            version = iface.name.removeprefix("FoundationModels-").removesuffix("-macos.swiftinterface")
            raw = iface.read_bytes()
            digest = hashlib.sha256(raw).hexdigest()
            want = manifest_hashes.get(iface.name)
            hash_note = "sha256 not in a manifest" if want is None else ("sha256 matches the manifest" if want == digest else "sha256 DIFFERS from the manifest")
            text, dropped = patch(raw.decode("utf-8"))
            mod = re.search(r"-user-module-version (\S+)", text)
            out = work / version
            out.mkdir()
            (out / "FoundationModels.swiftinterface").write_text(text)
            rc, log = run(
                [args.swift_frontend, "-compile-module-from-interface", "FoundationModels.swiftinterface",
                 "-module-name", "FoundationModels", "-o", "FoundationModels.swiftmodule"], out)
            if rc != 0:
                failed = True
                print(f"SDK {version}: building the module FAILED ({hash_note})\n{log}")
                continue
            (work / "probe.swift").write_text(PROBE)
            _, probe = run([args.swiftc, "-typecheck", "-I", str(out), str(work / "probe.swift")], work)
            said = " ".join(diagnostics(probe, "warning"))   # not the source excerpts printed beside them
            branch = "true" if "is true" in said else ("false" if "is false" in said else "unknown")
            rc, log = run(
                [args.swiftc, "-typecheck", "-swift-version", "6", "-module-name", "OamNative",
                 "-I", str(out), "-I", str(cmod), *sources], work)
            errors, warnings = diagnostics(log, "error"), diagnostics(log, "warning")
            failed |= rc != 0 or bool(errors)
            print(f"SDK {version}: module version {mod.group(1) if mod else '?'} ({hash_note}; "
                  f"{dropped} image-attachment declarations dropped); "
                  f"canImport(FoundationModels, _version: 2.0) = {branch}; "
                  f"OamNative: {len(errors)} errors, {len(warnings)} warnings")
            for d in errors + warnings:
                print("  " + d.replace(str(NATIVE.parent) + "/", ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
