// oam_client.cpp
#include "oam_client.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <thread>
#include <unordered_map>
#include <utility>

#include "oam_line_framer.h"
#include "oam_process.h"

namespace oam {

namespace {

const std::pair<const char*, int> kCodes[] = {
    {"model_unavailable", -31001}, {"guardrail_violation", -31002}, {"refusal", -31003},
    {"context_size_exceeded", -31004}, {"rate_limited", -31005}, {"unsupported_language", -31006},
    {"invalid_schema", -31007}, {"tool_failed", -31008}, {"cancelled", -31009}, {"busy", -31010},
    {"invalid_request", -31011}, {"generation_failed", -31012}, {"unknown_npc", -31020},
    {"unknown_tool_call", -31021}, {"not_initialized", -31022}, {"overloaded", -31023},
    {"message_too_large", -31024}, {"npc_exists", -31025}, {"shutting_down", -31026},
    {"limit_reached", -31027}, {"parse_error", -32700}, {"invalid_message", -32600},
    {"method_not_found", -32601}, {"invalid_params", -32602}, {"internal_error", -32603},
};

// Runs a tool handler; a thrown exception becomes the error the model sees as the output.
template <class Handler>
bool runToolHandler(Handler&& handler, json& out, std::string& err) {
    try {
        out = handler();
        return true;
    } catch (const std::exception& e) {
        err = e.what();
    } catch (...) {
        err = "tool handler failed";
    }
    return false;
}

std::string codeFor(int rpcCode) {
    for (const auto& c : kCodes)
        if (c.second == rpcCode) return c.first;
    return "rpc_error";
}

std::string dumpLine(const json& j) {
    std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
    s += '\n';
    return s;
}

constexpr std::size_t kMaxOrphanTurns = 256;

}  // namespace

std::string stringField(const json& obj, const char* key, const std::string& def) {
    if (!obj.is_object()) return def;
    auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->get<std::string>() : def;
}

std::int64_t intField(const json& obj, const char* key, std::int64_t def) {
    if (!obj.is_object()) return def;
    auto it = obj.find(key);
    return it != obj.end() && it->is_number_integer() ? it->get<std::int64_t>() : def;
}

bool boolField(const json& obj, const char* key, bool def) {
    if (!obj.is_object()) return def;
    auto it = obj.find(key);
    return it != obj.end() && it->is_boolean() ? it->get<bool>() : def;
}

// ------------------------------------------------------------------ BridgeError

BridgeError::BridgeError(std::string code_, int rpcCode_, std::string message, bool retryable_, json data_)
    : std::runtime_error(std::move(message)),
      code(std::move(code_)),
      rpcCode(rpcCode_),
      retryable(retryable_),
      data(std::move(data_)) {}

BridgeError BridgeError::fromRpcError(const json& error) {
    const int rpc = error.is_object() && error.contains("code") && error["code"].is_number_integer()
                        ? error["code"].get<int>()
                        : -32603;
    std::string message = stringField(error, "message", "error");
    json data = error.is_object() && error.contains("data") ? error["data"] : json(nullptr);
    std::string code = stringField(data, "code", codeFor(rpc));
    const bool retryable = boolField(data, "retryable");
    return BridgeError(std::move(code), rpc, std::move(message), retryable, std::move(data));
}

BridgeError BridgeError::fromTurnError(const json& error) {
    std::string code = stringField(error, "code", "generation_failed");
    std::string message = stringField(error, "message", "turn failed");
    const bool retryable = boolField(error, "retryable");
    const int rpc = rpcCodeFor(code);
    return BridgeError(std::move(code), rpc, std::move(message), retryable, error);
}

BridgeError BridgeError::transport(const std::string& message) {
    return BridgeError("transport", 0, message, false, json{{"code", "transport"}, {"retryable", false}});
}

int rpcCodeFor(const std::string& code) {
    for (const auto& c : kCodes)
        if (code == c.first) return c.second;
    return 0;
}

// ------------------------------------------------------------------ Turn

Turn::Turn(std::string npcId, Callbacks callbacks, std::string kind)
    : npcId_(std::move(npcId)),
      kind_(std::move(kind)),
      callbacks_(std::move(callbacks)),
      accepted_(acceptedP_.get_future().share()),
      completion_(completionP_.get_future().share()) {}

std::string Turn::turnId() const {
    std::lock_guard<std::mutex> lock(mu_);
    return turnId_;
}

std::optional<std::string> Turn::speaker() const {
    std::lock_guard<std::mutex> lock(mu_);
    return speaker_;
}

std::vector<Event> Turn::events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
}

std::string Turn::text() const {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
}

bool Turn::finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
}

// The client's side of Turn (only oam_client.cpp uses it).
struct Turn::Access {
    static void accept(Turn& t, const std::string& turnId) {
        {
            std::lock_guard<std::mutex> lock(t.mu_);
            t.turnId_ = turnId;
        }
        t.acceptedP_.set_value(turnId);
    }
    static void record(Turn& t, const Event& ev) {
        std::lock_guard<std::mutex> lock(t.mu_);
        t.events_.push_back(ev);
        if (ev.method == "turn/started") {
            const auto it = ev.params.find("speaker");
            if (it != ev.params.end() && it->is_string()) t.speaker_ = it->get<std::string>();
        } else if (ev.method == "turn/textDelta") {
            const std::string delta = stringField(ev.params, "delta");
            if (boolField(ev.params, "isReset")) t.text_ = delta;
            else t.text_ += delta;
        }
    }
    // Sets the outcome once; false if it was already set.
    static bool finish(Turn& t, const json* completed, const BridgeError* error, bool requestFailed) {
        {
            std::lock_guard<std::mutex> lock(t.mu_);
            if (t.finished_) return false;
            t.finished_ = true;
        }
        if (requestFailed) t.acceptedP_.set_exception(std::make_exception_ptr(*error));
        if (completed) t.completionP_.set_value(*completed);
        else t.completionP_.set_exception(std::make_exception_ptr(*error));
        return true;
    }
    static const Callbacks& callbacks(const Turn& t) { return t.callbacks_; }  // immutable after construction
};

// ------------------------------------------------------------------ Client::Impl

struct ToolReply::State {
    std::weak_ptr<Client::Impl> impl;
    ToolCall call;
    std::atomic<bool> done{false};
};

struct ToolEntry {
    SyncToolHandler sync;
    CallbackToolHandler callback;
    FutureToolHandler future;
};

struct Client::Impl : std::enable_shared_from_this<Impl> {
    ClientOptions opts;
    std::unique_ptr<Process> proc;
    std::thread outThread, errThread, writerThread;

    // writer queue
    std::mutex wmu;
    std::condition_variable wcv;
    std::deque<std::string> wq;
    bool wstop = false;

    // requests and turns
    std::mutex mu;
    std::int64_t nextId = 1;
    std::unordered_map<std::int64_t, std::function<void(Response&&)>> pending;
    std::unordered_map<std::string, std::shared_ptr<Turn>> turns;
    std::unordered_map<std::string, std::vector<Event>> orphans;  // events before the respond result
    std::deque<std::string> orphanOrder;
    bool accepting = true;
    bool transportDown = false;

    // handlers
    std::mutex hmu;
    std::unordered_map<std::string, std::vector<EventHandler>> handlers;
    std::unordered_map<std::string, ToolEntry> tools;

    // helper threads waiting on FutureToolHandler futures
    std::mutex amu;
    std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> waiters;
    std::atomic<bool> closing{false};

    std::mutex closeMu;
    bool closed = false;
    int exitCode = -1;

    void log(const std::string& line) const {
        if (opts.onLog) {
            try {
                opts.onLog(line);
            } catch (...) {
            }
        }
    }

    void dispatch(std::function<void()> fn) {
        LogHandler logger = opts.onLog;
        auto guarded = [fn = std::move(fn), logger]() {
            try {
                fn();
            } catch (const std::exception& e) {
                if (logger) logger(std::string("oam-client: a callback threw: ") + e.what());
            } catch (...) {
                if (logger) logger("oam-client: a callback threw");
            }
        };
        try {
            opts.dispatcher(std::move(guarded));
        } catch (const std::exception& e) {
            log(std::string("oam-client: dispatcher threw: ") + e.what());
        }
    }

    bool enqueue(std::string line) {
        {
            std::lock_guard<std::mutex> lock(wmu);
            if (wstop) return false;
            wq.push_back(std::move(line));
        }
        wcv.notify_one();
        return true;
    }

    void send(const std::string& method, json params, std::function<void(Response&&)> onResponse) {
        std::int64_t id = 0;
        {
            std::lock_guard<std::mutex> lock(mu);
            if (accepting && !transportDown) {
                id = nextId++;
                pending.emplace(id, onResponse);
            }
        }
        if (id == 0) {
            onResponse(Response{nullptr, BridgeError::transport("the bridge is closed")});
            return;
        }
        json msg = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
        if (!params.is_null()) msg["params"] = std::move(params);
        if (!enqueue(dumpLine(msg))) {
            std::function<void(Response&&)> h;
            {
                std::lock_guard<std::mutex> lock(mu);
                auto it = pending.find(id);
                if (it == pending.end()) return;
                h = std::move(it->second);
                pending.erase(it);
            }
            h(Response{nullptr, BridgeError::transport("the bridge is closed")});
        }
    }

    std::future<json> requestFuture(const std::string& method, json params) {
        auto p = std::make_shared<std::promise<json>>();
        auto f = p->get_future();
        send(method, std::move(params), [p](Response&& r) {
            if (r.error) p->set_exception(std::make_exception_ptr(*r.error));
            else p->set_value(std::move(r.result));
        });
        return f;
    }

    void requestCallback(const std::string& method, json params, std::function<void(const Response&)> cb) {
        std::weak_ptr<Impl> weak = weak_from_this();
        send(method, std::move(params), [weak, cb = std::move(cb)](Response&& r) {
            auto self = weak.lock();
            if (!self || !cb) return;
            auto shared = std::make_shared<Response>(std::move(r));
            self->dispatch([cb, shared] { cb(*shared); });
        });
    }

    // ---- reading

    void writerLoop() {
        bool broken = false;
        for (;;) {
            std::string line;
            {
                std::unique_lock<std::mutex> lock(wmu);
                wcv.wait(lock, [this] { return wstop || !wq.empty(); });
                if (wq.empty()) break;  // stopped and drained
                line = std::move(wq.front());
                wq.pop_front();
            }
            if (!broken && !proc->write(line)) {
                broken = true;
                log("oam-client: writing to the bridge failed (it closed its stdin)");
            }
        }
        proc->closeStdin();  // EOF: the bridge cancels its turns and exits 0
    }

    void stdoutLoop() {
        LineFramer framer(opts.maxLineBytes);
        std::vector<char> buf(64 * 1024);
        std::size_t dropped = 0;
        auto onLine = [this](std::string&& line) {
            try {
                handleLine(line);
            } catch (const std::exception& e) {  // never let a bad line end the reader thread
                log(std::string("oam-client: could not handle a line from the bridge: ") + e.what());
            }
        };
        for (;;) {
            const long n = proc->readStdout(buf.data(), buf.size());
            if (n <= 0) break;
            framer.feed(std::string_view(buf.data(), static_cast<std::size_t>(n)), onLine);
            if (framer.droppedLines() != dropped) {
                dropped = framer.droppedLines();
                log("oam-client: dropped a stdout line longer than maxLineBytes");
            }
        }
        framer.finish(onLine);
        failAll("the bridge closed its stdout (exited)");
    }

    void stderrLoop() {
        LineFramer framer(1u << 20);
        std::vector<char> buf(16 * 1024);
        auto onLine = [this](std::string&& line) { log(line); };
        for (;;) {
            const long n = proc->readStderr(buf.data(), buf.size());
            if (n <= 0) break;
            framer.feed(std::string_view(buf.data(), static_cast<std::size_t>(n)), onLine);
        }
        framer.finish(onLine);
    }

    void handleLine(const std::string& line) {
        json msg = json::parse(line, nullptr, false);
        if (msg.is_discarded()) {
            log("oam-client: not JSON from the bridge: " + line.substr(0, 200));
            return;
        }
        if (msg.is_array()) {
            for (auto& m : msg) handleMessage(m);
        } else {
            handleMessage(msg);
        }
    }

    void handleMessage(json& msg) {
        if (!msg.is_object()) {
            log("oam-client: unexpected message: " + msg.dump());
            return;
        }
        if (msg.contains("method") && !msg.contains("id")) {
            Event ev;
            ev.method = msg["method"].is_string() ? msg["method"].get<std::string>() : "";
            ev.params = msg.contains("params") ? std::move(msg["params"]) : json::object();
            if (!ev.params.is_object()) {
                log("oam-client: event without object params: " + msg.dump());
                return;
            }
            handleEvent(std::move(ev));
            return;
        }
        auto idIt = msg.find("id");
        if (idIt == msg.end() || !idIt->is_number_integer()) {
            log("oam-client: response without a request id: " + msg.dump());
            return;
        }
        const std::int64_t id = idIt->get<std::int64_t>();
        std::function<void(Response&&)> h;
        {
            std::lock_guard<std::mutex> lock(mu);
            auto it = pending.find(id);
            if (it != pending.end()) {
                h = std::move(it->second);
                pending.erase(it);
            }
        }
        if (!h) {
            log("oam-client: response to an unknown id " + std::to_string(id));
            return;
        }
        Response r;
        if (msg.contains("error")) r.error = BridgeError::fromRpcError(msg["error"]);
        else if (msg.contains("result")) r.result = std::move(msg["result"]);
        h(std::move(r));
    }

    void handleEvent(Event ev) {
        const std::string turnId = ev.turnId();
        std::shared_ptr<Turn> turn;
        {
            std::lock_guard<std::mutex> lock(mu);
            auto it = turns.find(turnId);
            if (it != turns.end()) {
                turn = it->second;
                if (ev.isTerminal()) turns.erase(it);
            } else if (!turnId.empty()) {
                auto& list = orphans[turnId];
                if (list.empty()) orphanOrder.push_back(turnId);
                list.push_back(ev);
                while (orphanOrder.size() > kMaxOrphanTurns) {
                    orphans.erase(orphanOrder.front());
                    orphanOrder.pop_front();
                }
            }
        }
        std::vector<EventHandler> global;
        std::optional<ToolEntry> tool;
        {
            std::lock_guard<std::mutex> lock(hmu);
            for (const char* key : {ev.method.c_str(), "*"}) {
                auto it = handlers.find(key);
                if (it != handlers.end()) global.insert(global.end(), it->second.begin(), it->second.end());
            }
            if (ev.method == "turn/toolCallRequested") {
                auto it = tools.find(stringField(ev.params, "name"));
                if (it != tools.end()) tool = it->second;
            }
        }
        auto shared = std::make_shared<const Event>(std::move(ev));
        if (!global.empty() || tool) {
            std::weak_ptr<Impl> weak = weak_from_this();
            dispatch([global = std::move(global), tool = std::move(tool), shared, weak] {
                for (const auto& h : global) h(*shared);
                if (tool) {
                    if (auto self = weak.lock()) self->runTool(*tool, *shared);
                }
            });
        }
        if (turn) deliverToTurn(turn, shared);
    }

    // Records a turn's event, runs its callbacks, and settles it on a terminal event.
    void deliverToTurn(const std::shared_ptr<Turn>& turn, const std::shared_ptr<const Event>& ev) {
        Turn::Access::record(*turn, *ev);
        const auto& cbs = Turn::Access::callbacks(*turn);
        if (cbs.onEvent) dispatch([turn, ev] { Turn::Access::callbacks(*turn).onEvent(*ev); });
        if (!ev->isTerminal()) return;
        bool settled = false;
        if (ev->method == "turn/completed") {
            settled = Turn::Access::finish(*turn, &ev->params, nullptr, false);
        } else {
            const BridgeError err = BridgeError::fromTurnError(ev->params.contains("error") ? ev->params["error"] : json());
            settled = Turn::Access::finish(*turn, nullptr, &err, false);
        }
        if (settled && cbs.onFinished) dispatch([turn] { Turn::Access::callbacks(*turn).onFinished(*turn); });
    }

    void failTurn(const std::shared_ptr<Turn>& turn, const BridgeError& err, bool requestFailed) {
        if (Turn::Access::finish(*turn, nullptr, &err, requestFailed) && Turn::Access::callbacks(*turn).onFinished)
            dispatch([turn] { Turn::Access::callbacks(*turn).onFinished(*turn); });
    }

    void failAll(const std::string& why) {
        std::unordered_map<std::int64_t, std::function<void(Response&&)>> p;
        std::unordered_map<std::string, std::shared_ptr<Turn>> t;
        {
            std::lock_guard<std::mutex> lock(mu);
            transportDown = true;
            p.swap(pending);
            t.swap(turns);
            orphans.clear();
            orphanOrder.clear();
        }
        const BridgeError err = BridgeError::transport(why);
        for (auto& kv : p) kv.second(Response{nullptr, err});
        for (auto& kv : t) failTurn(kv.second, err, false);
    }

    // npc/respond, npc/decide or npc/prewarm: params hold npcId; kind is the method's last part
    std::shared_ptr<Turn> startTurn(const std::string& kind, json params, Turn::Callbacks callbacks) {
        auto turn = std::make_shared<Turn>(stringField(params, "npcId"), std::move(callbacks), kind);
        const std::string method = "npc/" + kind;
        std::weak_ptr<Impl> weak = weak_from_this();
        send(method, std::move(params), [weak, turn, method](Response&& r) {
            auto self = weak.lock();
            if (!self) return;
            if (r.error) {
                self->failTurn(turn, *r.error, true);
                return;
            }
            const std::string turnId = stringField(r.result, "turnId");
            if (turnId.empty()) {
                self->failTurn(turn, BridgeError("invalid_response", 0, method + " result without a turnId"), true);
                return;
            }
            std::vector<Event> early;
            {
                std::lock_guard<std::mutex> lock(self->mu);
                self->turns[turnId] = turn;
                auto it = self->orphans.find(turnId);
                if (it != self->orphans.end()) {
                    early = std::move(it->second);
                    self->orphans.erase(it);
                }
            }
            Turn::Access::accept(*turn, turnId);
            for (auto& ev : early) {
                if (ev.isTerminal()) {
                    std::lock_guard<std::mutex> lock(self->mu);
                    self->turns.erase(turnId);
                }
                self->deliverToTurn(turn, std::make_shared<const Event>(std::move(ev)));
            }
        });
        return turn;
    }

    // ---- tools (runs on the dispatcher)

    void submitTool(const ToolCall& call, const json* output, const std::string* error) {
        json params = {{"npcId", call.npcId}, {"callId", call.callId}};
        if (output) params["output"] = *output;
        else params["error"] = *error;
        auto onSubmitted = opts.onToolSubmitted;
        LogHandler logger = opts.onLog;
        requestCallback("npc/submit", std::move(params), [call, onSubmitted, logger](const Response& r) {
            if (onSubmitted) onSubmitted(call, r);
            else if (!r.ok() && logger)
                logger("oam-client: npc/submit for " + call.name + " (" + call.callId + ") failed: " + r.error->what());
        });
    }

    void runTool(const ToolEntry& tool, const Event& ev) {
        ToolCall call;
        call.npcId = ev.npcId();
        call.turnId = ev.turnId();
        call.callId = stringField(ev.params, "callId");
        call.name = stringField(ev.params, "name");
        call.arguments = ev.params.contains("arguments") ? ev.params["arguments"] : json::object();
        call.timeoutMs = intField(ev.params, "timeoutMs");
        if (tool.sync) {
            json out;
            std::string err;
            bool ok = runToolHandler([&] { return tool.sync(call.arguments); }, out, err);
            if (ok) submitTool(call, &out, nullptr);
            else submitTool(call, nullptr, &err);
        } else if (tool.callback) {
            auto state = std::make_shared<ToolReply::State>();
            state->impl = weak_from_this();
            state->call = call;
            ToolReply reply(state);
            try {
                tool.callback(call, reply);
            } catch (const std::exception& e) {
                reply.error(e.what());
            } catch (...) {
                reply.error("tool handler failed");
            }
        } else if (tool.future) {
            std::future<json> fut;
            try {
                fut = tool.future(call);
            } catch (const std::exception& e) {
                const std::string err = e.what();
                submitTool(call, nullptr, &err);
                return;
            }
            if (!fut.valid()) {
                const std::string err = "tool handler returned no future";
                submitTool(call, nullptr, &err);
                return;
            }
            auto done = std::make_shared<std::atomic<bool>>(false);
            std::weak_ptr<Impl> weak = weak_from_this();
            std::lock_guard<std::mutex> lock(amu);
            for (auto it = waiters.begin(); it != waiters.end();) {
                if (it->second->load()) {
                    it->first.join();
                    it = waiters.erase(it);
                } else {
                    ++it;
                }
            }
            if (closing) return;
            waiters.emplace_back(std::thread([weak, call, done, fut = std::move(fut)]() mutable {
                for (;;) {
                    if (fut.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) break;
                    auto self = weak.lock();
                    if (!self || self->closing) {
                        done->store(true);
                        return;  // closing: abandon the call (the bridge withdraws it)
                    }
                }
                json out;
                std::string err;
                bool ok = runToolHandler([&] { return fut.get(); }, out, err);
                if (auto self = weak.lock()) {
                    if (ok) self->submitTool(call, &out, nullptr);
                    else self->submitTool(call, nullptr, &err);
                }
                done->store(true);
            }),
                                 done);
        }
    }

    // ---- closing

    bool onOwnThread() const {
        const auto me = std::this_thread::get_id();
        return me == outThread.get_id() || me == errThread.get_id() || me == writerThread.get_id();
    }

    // No new requests; the writer drains what is queued, then closes the bridge's stdin.
    void stopWriting() {
        {
            std::lock_guard<std::mutex> lock(mu);
            accepting = false;
        }
        closing = true;
        {
            std::lock_guard<std::mutex> lock(wmu);
            wstop = true;
        }
        wcv.notify_all();
    }

    int close(std::optional<std::chrono::milliseconds> timeout) {
        std::lock_guard<std::mutex> closeLock(closeMu);
        if (closed) return exitCode;
        if (onOwnThread()) throw std::logic_error("oam::Client::close() called on the client's reader thread");
        stopWriting();
        auto status = proc->waitFor(timeout.value_or(opts.closeTimeout));
        if (!status) {
            log("oam-client: the bridge did not exit in time; sending SIGTERM");
            proc->terminate();
            status = proc->waitFor(std::chrono::milliseconds(2000));
        }
        if (!status) {
            log("oam-client: killing the bridge");
            proc->kill();
            status = proc->waitFor(std::chrono::milliseconds(5000));
        }
        if (writerThread.joinable()) writerThread.join();
        if (outThread.joinable()) outThread.join();
        if (errThread.joinable()) errThread.join();
        {
            std::lock_guard<std::mutex> lock(amu);
            for (auto& w : waiters) w.first.join();
            waiters.clear();
        }
        failAll("the client was closed");
        closed = true;
        exitCode = status.value_or(-1);
        return exitCode;
    }

    // ~Client on one of our own threads: let the threads finish on their own (each holds a
    // reference to this Impl) once the bridge sees stdin EOF and exits.
    void abandon() {
        stopWriting();
        for (std::thread* t : {&writerThread, &outThread, &errThread})
            if (t->joinable()) t->detach();
        std::lock_guard<std::mutex> lock(amu);
        for (auto& w : waiters) w.first.detach();
        waiters.clear();
    }
};

// ------------------------------------------------------------------ ToolReply

void ToolReply::output(json value) const {
    if (!state_ || state_->done.exchange(true)) return;
    if (auto impl = state_->impl.lock()) impl->submitTool(state_->call, &value, nullptr);
}

void ToolReply::error(const std::string& message) const {
    if (!state_ || state_->done.exchange(true)) return;
    if (auto impl = state_->impl.lock()) impl->submitTool(state_->call, nullptr, &message);
}

// ------------------------------------------------------------------ Client

Client::Client(ClientOptions options) : impl_(std::make_shared<Impl>()) {
    if (!options.dispatcher) options.dispatcher = [](std::function<void()> f) { f(); };
    if (!options.onLog) options.onLog = [](const std::string& line) { std::cerr << "[oam-bridge] " << line << '\n'; };
    impl_->opts = std::move(options);
    impl_->proc = Process::spawn(SpawnOptions{impl_->opts.command, impl_->opts.workingDirectory, impl_->opts.dieWithParent});
    std::shared_ptr<Impl> self = impl_;
    impl_->writerThread = std::thread([self] { self->writerLoop(); });
    impl_->errThread = std::thread([self] { self->stderrLoop(); });
    impl_->outThread = std::thread([self] { self->stdoutLoop(); });
}

Client::~Client() {
    if (!impl_) return;
    try {
        impl_->close(std::nullopt);
    } catch (const std::logic_error&) {
        impl_->abandon();
    } catch (...) {
    }
}

std::future<json> Client::request(const std::string& method, json params) {
    return impl_->requestFuture(method, std::move(params));
}

void Client::request(const std::string& method, json params, std::function<void(const Response&)> cb) {
    impl_->requestCallback(method, std::move(params), std::move(cb));
}

void Client::notify(const std::string& method, json params) {
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        if (!impl_->accepting || impl_->transportDown) return;
    }
    json msg = {{"jsonrpc", "2.0"}, {"method", method}};
    if (!params.is_null()) msg["params"] = std::move(params);
    impl_->enqueue(dumpLine(msg));
}

std::future<json> Client::initialize(const std::string& clientName, const std::string& clientVersion,
                                     int protocolVersion) {
    return request("initialize", {{"protocolVersion", protocolVersion},
                                  {"clientInfo", {{"name", clientName}, {"version", clientVersion}}}});
}

std::future<json> Client::createNpc(json params) { return request("npc/create", std::move(params)); }

std::shared_ptr<Turn> Client::respond(const std::string& npcId, const std::string& prompt, json options,
                                      Turn::Callbacks callbacks) {
    json params = options.is_object() ? std::move(options) : json::object();
    params["npcId"] = npcId;
    params["prompt"] = prompt;
    return impl_->startTurn("respond", std::move(params), std::move(callbacks));
}

std::shared_ptr<Turn> Client::decide(const std::string& npcId, const std::string& situation, json choices, json extra,
                                     Turn::Callbacks callbacks) {
    json params = extra.is_object() ? std::move(extra) : json::object();
    params["npcId"] = npcId;
    params["situation"] = situation;
    params["options"] = std::move(choices);
    return impl_->startTurn("decide", std::move(params), std::move(callbacks));
}

std::shared_ptr<Turn> Client::prewarm(const std::string& npcId, const std::string& speaker,
                                      const std::string& promptPrefix, Turn::Callbacks callbacks) {
    json params = {{"npcId", npcId}};
    if (!speaker.empty()) params["speaker"] = speaker;
    if (!promptPrefix.empty()) params["promptPrefix"] = promptPrefix;
    return impl_->startTurn("prewarm", std::move(params), std::move(callbacks));
}

std::shared_ptr<Turn> Client::prewarm(const std::string& npcId, Turn::Callbacks callbacks) {
    return prewarm(npcId, "", "", std::move(callbacks));
}

std::future<json> Client::setTags(const std::string& npcId, const std::vector<std::string>& tags) {
    return request("npc/setTags", {{"npcId", npcId}, {"tags", tags}});
}

std::future<json> Client::worldSet(const std::string& key, json value, json scope) {
    json params = scope.is_object() ? std::move(scope) : json::object();
    params["key"] = key;
    params["value"] = std::move(value);
    return request("world/set", std::move(params));
}

std::future<json> Client::worldDelete(const std::string& key) { return request("world/delete", {{"key", key}}); }

std::future<json> Client::worldGet(const std::string& npcId) {
    json params = json::object();
    if (!npcId.empty()) params["npcId"] = npcId;
    return request("world/get", std::move(params));
}

std::future<json> Client::submitOutput(const std::string& npcId, const std::string& callId, json output) {
    return request("npc/submit", {{"npcId", npcId}, {"callId", callId}, {"output", std::move(output)}});
}

std::future<json> Client::submitError(const std::string& npcId, const std::string& callId, const std::string& error) {
    return request("npc/submit", {{"npcId", npcId}, {"callId", callId}, {"error", error}});
}

std::future<json> Client::cancel(const std::string& npcId) { return request("npc/cancel", {{"npcId", npcId}}); }
std::future<json> Client::transcript(const std::string& npcId) {
    return request("npc/transcript", {{"npcId", npcId}});
}

std::future<json> Client::restore(json save, const std::string& npcId) {
    json params = {{"save", std::move(save)}};
    if (!npcId.empty()) params["npcId"] = npcId;
    return request("npc/restore", std::move(params));
}

std::future<json> Client::reset(const std::string& npcId) { return request("npc/reset", {{"npcId", npcId}}); }
std::future<json> Client::deleteNpc(const std::string& npcId) { return request("npc/delete", {{"npcId", npcId}}); }
std::future<json> Client::list() { return request("npc/list", json::object()); }

std::future<json> Client::countTokens(const std::string& text, json target) {
    json params = target.is_object() ? std::move(target) : json::object();
    params["text"] = text;
    return request("tokens/count", std::move(params));
}

std::future<json> Client::engineStatus() { return request("engine/status", json::object()); }
std::future<json> Client::shutdown() { return request("shutdown", nullptr); }
void Client::exit() { notify("exit"); }

void Client::on(const std::string& method, EventHandler handler) {
    std::lock_guard<std::mutex> lock(impl_->hmu);
    impl_->handlers[method].push_back(std::move(handler));
}

void Client::registerTool(const std::string& name, SyncToolHandler handler) {
    std::lock_guard<std::mutex> lock(impl_->hmu);
    impl_->tools[name] = ToolEntry{std::move(handler), nullptr, nullptr};
}

void Client::registerToolAsync(const std::string& name, CallbackToolHandler handler) {
    std::lock_guard<std::mutex> lock(impl_->hmu);
    impl_->tools[name] = ToolEntry{nullptr, std::move(handler), nullptr};
}

void Client::registerToolFuture(const std::string& name, FutureToolHandler handler) {
    std::lock_guard<std::mutex> lock(impl_->hmu);
    impl_->tools[name] = ToolEntry{nullptr, nullptr, std::move(handler)};
}

void Client::unregisterTool(const std::string& name) {
    std::lock_guard<std::mutex> lock(impl_->hmu);
    impl_->tools.erase(name);
}

int Client::close(std::optional<std::chrono::milliseconds> timeout) { return impl_->close(timeout); }

bool Client::running() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return impl_->accepting && !impl_->transportDown;
}

long Client::pid() const { return impl_->proc->pid(); }

}  // namespace oam
