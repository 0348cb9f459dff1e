// Stand-ins for the Unreal Engine 5 declarations the OamBridge Unreal layer uses, so run_tests.sh
// can compile Public/ and Private/ with g++ and run them (tests/ue_layer_test.cpp) against the
// real bridge. NOT Unreal: no UHT (tests/uht_lite.py writes the *.generated.h / *.gen.cpp a UHT
// run would, in the shape that matters: GENERATED_BODY per line, the FVTableHelper constructor and
// destructor defined in the .gen.cpp when the class does not declare them), no reflection, no GC.
// Declarations follow the public API reference (dev.epicgames.com/documentation/en-us/unreal-engine/API):
// names, parameter types, constness and virtuality as there; bodies are the simplest that run.
// Simplification: TCHAR is char (Unreal: char16_t on Linux/Mac, wchar_t on Windows).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using TCHAR = char;
using int32 = std::int32_t;
using int64 = std::int64_t;
using uint8 = std::uint8_t;
using uint32 = std::uint32_t;
#define TEXT(x) x
#define UTF8_TO_TCHAR(x) (x)
#define TCHAR_TO_UTF8(x) (x)
#define OAMBRIDGE_API
#define THIRD_PARTY_INCLUDES_START
#define THIRD_PARTY_INCLUDES_END
#define PLATFORM_WINDOWS 0
#define PLATFORM_MAC 0
#define PLATFORM_LINUX 1
#define PLATFORM_CPU_ARM_FAMILY 0
#define check(x) ((void)0)
#define ensure(x) (!!(x))

template <class T> std::remove_reference_t<T>&& MoveTemp(T&& v) {
    static_assert(!std::is_const<std::remove_reference_t<T>>::value, "MoveTemp called on a const object");
    return static_cast<std::remove_reference_t<T>&&>(v);
}

// FString (Containers/UnrealString.h). No constructor from std::string, as in Unreal.
class FString {
public:
    FString() = default;
    FString(const TCHAR* s) : s_(s ? s : "") {}
    const TCHAR* operator*() const { return s_.c_str(); }
    friend FString operator+(const FString& a, const FString& b) { return FString((a.s_ + b.s_).c_str()); }
    friend FString operator+(const FString& a, const TCHAR* b) { return FString((a.s_ + b).c_str()); }
    FString& operator+=(const FString& o) { s_ += o.s_; return *this; }
    bool operator==(const FString& o) const { return s_ == o.s_; }
    bool operator!=(const FString& o) const { return s_ != o.s_; }
    bool IsEmpty() const { return s_.empty(); }
    int32 Len() const { return static_cast<int32>(s_.size()); }
    bool Contains(const TCHAR* sub) const { return s_.find(sub) != std::string::npos; }
    bool StartsWith(const TCHAR* p) const { return s_.rfind(p, 0) == 0; }
    FString TrimStartAndEnd() const {
        const auto b = s_.find_first_not_of(" \t\r\n");
        if (b == std::string::npos) return FString();
        return FString(s_.substr(b, s_.find_last_not_of(" \t\r\n") - b + 1).c_str());
    }
    template <class... A> static FString Printf(const TCHAR* fmt, A... a) {
        char buf[1024];
        std::snprintf(buf, sizeof buf, fmt, a...);
        return FString(buf);
    }
private:
    std::string s_;
};

// TArray (Containers/Array.h)
template <class T> class TArray {
public:
    TArray() = default;
    TArray(std::initializer_list<T> items) : v_(items) {}
    int32 Num() const { return static_cast<int32>(v_.size()); }
    bool IsEmpty() const { return v_.empty(); }
    int32 Add(const T& item) { v_.push_back(item); return Num() - 1; }
    void Reset() { v_.clear(); }
    T& operator[](int32 i) { return v_[static_cast<std::size_t>(i)]; }
    const T& operator[](int32 i) const { return v_[static_cast<std::size_t>(i)]; }
    T* begin() { return v_.data(); }
    T* end() { return v_.data() + v_.size(); }
    const T* begin() const { return v_.data(); }
    const T* end() const { return v_.data() + v_.size(); }
private:
    std::vector<T> v_;
};

// TFunction (Templates/Function.h)
template <class Sig> using TFunction = std::function<Sig>;

struct FLogCategory {};
#define DECLARE_LOG_CATEGORY_EXTERN(Name, Verbosity, Compile) extern FLogCategory Name
#define DEFINE_LOG_CATEGORY(Name) FLogCategory Name
#define UE_LOG(Category, Verbosity, Format, ...) \
    ((void)Category, std::fprintf(stderr, "[" #Verbosity "] " Format "\n", ##__VA_ARGS__))

#include "Templates/SharedPointer.h"
#include "Delegates/Delegate.h"
