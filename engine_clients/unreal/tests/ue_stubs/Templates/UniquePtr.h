#pragma once
#include <memory>
template <class T> class TUniquePtr {
public:
    TUniquePtr() = default;
    TUniquePtr(std::unique_ptr<T> p) : p_(std::move(p)) {}
    T* Get() const { return p_.get(); }
    T* operator->() const { return p_.get(); }
    explicit operator bool() const { return p_ != nullptr; }
    void Reset() { p_.reset(); }
private:
    std::unique_ptr<T> p_;
};
template <class T, class... A> TUniquePtr<T> MakeUnique(A&&... a) { return TUniquePtr<T>(std::make_unique<T>(std::forward<A>(a)...)); }
