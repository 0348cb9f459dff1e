// Minimal stand-ins for the few Unreal Engine declarations the OamBridge Unreal layer uses, so
// run_tests.sh can at least type-check Public/ and Private/ with g++ (-fsyntax-only). NOT
// Unreal: no UHT, no UBT, no reflection. Signatures follow UE5 where they matter.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using TCHAR = char;
using int32 = std::int32_t;
#define TEXT(x) x
#define UTF8_TO_TCHAR(x) (x)
#define TCHAR_TO_UTF8(x) (x)
#define OAMBRIDGE_API
#define UCLASS(...)
#define UFUNCTION(...)
#define UPROPERTY(...)
#define GENERATED_BODY()
#define THIRD_PARTY_INCLUDES_START
#define THIRD_PARTY_INCLUDES_END

template <class T> std::remove_reference_t<T>&& MoveTemp(T&& v) {
    static_assert(!std::is_const<std::remove_reference_t<T>>::value, "MoveTemp called on a const object");
    return static_cast<std::remove_reference_t<T>&&>(v);
}

class FString {
public:
    FString() = default;
    FString(const TCHAR* s) : s_(s ? s : "") {}
    const TCHAR* operator*() const { return s_.c_str(); }
    friend FString operator+(const FString& a, const FString& b) { return FString((a.s_ + b.s_).c_str()); }
    bool IsEmpty() const { return s_.empty(); }
    FString TrimStartAndEnd() const {
        const auto b = s_.find_first_not_of(" \t\r\n");
        if (b == std::string::npos) return FString();
        return FString(s_.substr(b, s_.find_last_not_of(" \t\r\n") - b + 1).c_str());
    }
private:
    std::string s_;
};

template <class T> class TArray {
public:
    TArray() = default;
    TArray(std::initializer_list<T> items) : v_(items) {}
    int32 Num() const { return static_cast<int32>(v_.size()); }
    void Add(const T& item) { v_.push_back(item); }
    const T* begin() const { return v_.data(); }
    const T* end() const { return v_.data() + v_.size(); }
private:
    std::vector<T> v_;
};

struct FLogCategory {};
#define DECLARE_LOG_CATEGORY_EXTERN(Name, Verbosity, Compile) extern FLogCategory Name
#define DEFINE_LOG_CATEGORY(Name) FLogCategory Name
#define UE_LOG(Category, Verbosity, Format, ...) ((void)Category, std::printf(Format "\n", ##__VA_ARGS__))

#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(Name, T1, N1, T2, N2) \
    struct Name { void Broadcast(T1, T2) const {} };
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_FourParams(Name, T1, N1, T2, N2, T3, N3, T4, N4) \
    struct Name { void Broadcast(T1, T2, T3, T4) const {} };
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_FiveParams(Name, T1, N1, T2, N2, T3, N3, T4, N4, T5, N5) \
    struct Name { void Broadcast(T1, T2, T3, T4, T5) const {} };
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_SixParams(Name, T1, N1, T2, N2, T3, N3, T4, N4, T5, N5, T6, N6) \
    struct Name { void Broadcast(T1, T2, T3, T4, T5, T6) const {} };

template <class T> class TWeakObjectPtr {
public:
    TWeakObjectPtr(T* p = nullptr) : p_(p) {}
    T* Get() const { return p_; }
    bool IsValid() const { return p_ != nullptr; }
private:
    T* p_;
};

class UObject {
public:
    virtual ~UObject() = default;
};
