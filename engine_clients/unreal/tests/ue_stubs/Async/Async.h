#pragma once
#include <deque>
#include <functional>
#include <mutex>
// AsyncTask (Async/Async.h). Stub: ENamedThreads::GameThread tasks queue up until the test's
// "game loop" runs them with UEStub_PumpGameThread().
namespace ENamedThreads { enum Type { GameThread, AnyThread }; }
struct FUEStubGameThread {
    std::mutex Mu;
    std::deque<std::function<void()>> Tasks;
    static FUEStubGameThread& Get() { static FUEStubGameThread G; return G; }
};
template <class F> void AsyncTask(ENamedThreads::Type, F&& Fn) {
    auto& G = FUEStubGameThread::Get();
    std::lock_guard<std::mutex> Lock(G.Mu);
    G.Tasks.emplace_back(std::forward<F>(Fn));
}
inline int UEStub_PumpGameThread() {  // runs the queued tasks; returns how many
    auto& G = FUEStubGameThread::Get();
    int N = 0;
    for (;;) {
        std::function<void()> Fn;
        {
            std::lock_guard<std::mutex> Lock(G.Mu);
            if (G.Tasks.empty()) return N;
            Fn = std::move(G.Tasks.front());
            G.Tasks.pop_front();
        }
        Fn();
        ++N;
    }
}
