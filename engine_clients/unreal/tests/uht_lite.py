#!/usr/bin/env python3
"""uht_lite.py - what Unreal Header Tool would generate, in the shape that matters for compiling
and lifetime, for the stubs in ue_stubs/ (run_tests.sh runs it; not UHT).

For each header with UCLASS/USTRUCT it writes OUT/<Name>.generated.h and OUT/<Name>.gen.cpp:
- GENERATED_BODY() on line L expands to FID_<Name>_h_L_GENERATED_BODY (as Unreal's does): for a
  UCLASS `Super`, `ThisClass`, StaticClass(), the deleted copy and move constructors, and, unless
  the class declares them itself, the FVTableHelper constructor and the destructor, which UHT then
  defines in the .gen.cpp, a translation unit that includes only this header. A member such as
  TUniquePtr<ForwardDeclared> then fails to compile there, as it does in Unreal.
- the .gen.cpp takes the address of every UFUNCTION (UHT's thunks call them by name, so a
  UFUNCTION may not be overloaded) and checks that every USTRUCT is default- and copy-constructible.
It also rejects UFUNCTION parameters and UPROPERTY types that UHT would not accept (std::, int,
unsigned, long, size_t, char, raw C strings, TUniquePtr, TSharedPtr, TFunction, oam:: types).
usage: uht_lite.py OUT_DIR HEADER...      exit 1 with messages on a rejected declaration
"""
import os
import re
import sys

BAD_TYPE = re.compile(r"\bstd::|\boam::|\bint\b|\bunsigned\b|\blong\b|\bsize_t\b|\bchar\b|\bshort\b|TUniquePtr|TSharedPtr|TFunction")


def strip_comments(text):
    text = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)
    return re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def split_params(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "<({":
            depth += 1
        elif ch in ">)}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out]


def param_type(p):
    p = p.split("=")[0].strip()
    p = re.sub(r"\bUPARAM\([^)]*\)", "", p).strip()
    return re.sub(r"\s*\b\w+$", "", p).strip() or p


def main():
    out_dir, headers = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    errors = []
    for header in headers:
        raw = open(header).read()
        text = strip_comments(raw)
        base = os.path.splitext(os.path.basename(header))[0]
        fid = "FID_%s_h" % base
        lines = text.split("\n")
        macros, gen_cpp = [], ['#include "%s.h"' % base, "#include <type_traits>", ""]
        for m in re.finditer(r"\b(UCLASS|USTRUCT)\s*\(", text):
            kind = m.group(1)
            decl = re.compile(r"\b(class|struct)\s+(?:\w+_API\s+)?(\w+)\s*(?:final\s*)?(?::\s*public\s+(\w+))?\s*\{")
            d = decl.search(text, m.end())
            if not d:
                errors.append("%s: %s without a class" % (header, kind))
                continue
            name, parent = d.group(2), d.group(3)
            # the class body, by brace matching
            depth, i = 0, d.end() - 1
            while True:
                if text[i] == "{":
                    depth += 1
                elif text[i] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            body_start, body = d.end(), text[d.end():i]
            g = re.search(r"\bGENERATED_BODY\s*\(\s*\)", body)
            if not g:
                errors.append("%s: %s %s has no GENERATED_BODY()" % (header, kind, name))
                continue
            line = text.count("\n", 0, body_start + g.start()) + 1
            gen = []
            if kind == "UCLASS":
                has_vtable = re.search(r"\b%s\s*\(\s*FVTableHelper\s*&" % name, body)
                has_dtor = re.search(r"~%s\s*\(" % name, body)
                gen += ["public:", "using ThisClass = %s;" % name, "using Super = %s;" % parent,
                        "static UClass* StaticClass();"]
                # no default / FObjectInitializer constructor declared: UHT declares one, inline
                # (DEFINE_DEFAULT_OBJECT_INITIALIZER_CONSTRUCTOR_CALL)
                if not re.search(r"\b%s\s*\(\s*(\)|const\s+FObjectInitializer)" % name, body):
                    gen.append("%s(const FObjectInitializer& ObjectInitializer = FObjectInitializer::Get()) : Super(ObjectInitializer) {}" % name)
                if not has_vtable:
                    gen.append("%s(FVTableHelper& Helper);" % name)
                    gen_cpp.append("%s::%s(FVTableHelper& Helper) : Super(Helper) {}  // DEFINE_VTABLE_PTR_HELPER_CTOR" % (name, name))
                if not has_dtor:
                    gen.append("virtual ~%s();" % name)
                    gen_cpp.append("%s::~%s() {}" % (name, name))
                gen += ["private:", "%s(%s&&) = delete;" % (name, name), "%s(const %s&) = delete;" % (name, name), "private:"]
                gen_cpp.append("UClass* %s::StaticClass() { static UClass C; return &C; }" % name)
                # UHT's InternalVTableHelperCtorCaller: constructs one with the helper constructor
                gen_cpp.append("UObject* Z_VTableCtorCaller_%s(FVTableHelper& Helper) { return new %s(Helper); }" % (name, name))
                seen = set()
                for f in re.finditer(r"\bUFUNCTION\s*\((?:[^()]|\([^()]*\))*\)\s*([^;{]*?)\b(\w+)\s*\(((?:[^()]|\([^()]*\))*)\)", body):
                    fname, params = f.group(2), f.group(3)
                    if fname in seen:
                        errors.append("%s: UFUNCTION %s::%s is overloaded (UHT forbids it)" % (header, name, fname))
                    seen.add(fname)
                    for p in split_params(params):
                        t = param_type(p)
                        if BAD_TYPE.search(t):
                            errors.append("%s: UFUNCTION %s::%s has a parameter type UHT does not accept: %s" % (header, name, fname, t))
                    gen_cpp.append("[[maybe_unused]] static auto Z_Thunk_%s_%s = &%s::%s;" % (name, fname, name, fname))
            else:
                gen += ["static UScriptStruct* StaticStruct();"]
                gen_cpp.append("UScriptStruct* %s::StaticStruct() { static UScriptStruct S; return &S; }" % name)
                gen_cpp.append("static_assert(std::is_default_constructible_v<%s> && std::is_copy_constructible_v<%s>, "
                               "\"a USTRUCT must be default- and copy-constructible\");" % (name, name))
            for p in re.finditer(r"\bUPROPERTY\s*\((?:[^()]|\([^()]*\))*\)\s*([^;=]+?)\s+(\w+)\s*(?:=[^;]*)?;", body):
                if BAD_TYPE.search(p.group(1)):
                    errors.append("%s: UPROPERTY %s::%s has a type UHT does not accept: %s" % (header, name, p.group(2), p.group(1)))
            macros.append("#define %s_%d_GENERATED_BODY %s" % (fid, line, " \\\n    ".join(gen)))
        with open(os.path.join(out_dir, base + ".generated.h"), "w") as fh:
            fh.write("// written by tests/uht_lite.py from %s\n#pragma once\n#include \"UObject/ObjectMacros.h\"\n"
                     "#undef CURRENT_FILE_ID\n#define CURRENT_FILE_ID %s\n%s\n" % (os.path.basename(header), fid, "\n".join(macros)))
        with open(os.path.join(out_dir, base + ".gen.cpp"), "w") as fh:
            fh.write("// written by tests/uht_lite.py: the .gen.cpp of %s (includes nothing else)\n%s\n" % (os.path.basename(header), "\n".join(gen_cpp)))
    for e in errors:
        print("FAIL - uht_lite: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
