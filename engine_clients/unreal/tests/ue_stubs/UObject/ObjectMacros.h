#pragma once
// UObject/ObjectMacros.h: the specifier macros are read by UHT and expand to nothing for the
// compiler. GENERATED_BODY() expands, as in Unreal, to a macro named after the file and line,
// which the *.generated.h (written by tests/uht_lite.py) defines.
#define UCLASS(...)
#define USTRUCT(...)
#define UENUM(...)
#define UFUNCTION(...)
#define UPROPERTY(...)
#define UPARAM(...)
#define UMETA(...)
#define BODY_MACRO_COMBINE_INNER(A, B, C, D) A##B##C##D
#define BODY_MACRO_COMBINE(A, B, C, D) BODY_MACRO_COMBINE_INNER(A, B, C, D)
#define GENERATED_BODY(...) BODY_MACRO_COMBINE(CURRENT_FILE_ID, _, __LINE__, _GENERATED_BODY)
#define GENERATED_USTRUCT_BODY(...) GENERATED_BODY()

// The argument of the constructor UHT's generated code calls to build a vtable for hot reload.
struct FVTableHelper {};
class FObjectInitializer {
public:
    static FObjectInitializer& Get() { static FObjectInitializer I; return I; }
};
class UClass {};
class UScriptStruct {};
