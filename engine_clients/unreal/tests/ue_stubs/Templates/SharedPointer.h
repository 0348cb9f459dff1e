#pragma once
#include <memory>
// TSharedPtr / TSharedRef / MakeShared (Templates/SharedPointer.h), over std::shared_ptr.
template <class T> class TSharedPtr {
public:
    TSharedPtr() = default;
    TSharedPtr(decltype(nullptr)) {}
    explicit TSharedPtr(std::shared_ptr<T> p) : p_(std::move(p)) {}
    template <class U> TSharedPtr(const TSharedPtr<U>& o) : p_(o.UEStub_Std()) {}
    const std::shared_ptr<T>& UEStub_Std() const { return p_; }
    T* Get() const { return p_.get(); }
    T* operator->() const { return p_.get(); }
    T& operator*() const { return *p_; }
    bool IsValid() const { return p_ != nullptr; }
    explicit operator bool() const { return IsValid(); }
    void Reset() { p_.reset(); }
private:
    std::shared_ptr<T> p_;
};
template <class T, class... A> TSharedPtr<T> MakeShared(A&&... a) { return TSharedPtr<T>(std::make_shared<T>(std::forward<A>(a)...)); }
