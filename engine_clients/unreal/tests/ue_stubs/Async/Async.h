#pragma once
#include <functional>
namespace ENamedThreads { enum Type { GameThread }; }
template <class F> void AsyncTask(ENamedThreads::Type, F&& f) { std::function<void()> fn(std::forward<F>(f)); fn(); }
